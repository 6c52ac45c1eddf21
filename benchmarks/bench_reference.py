"""Training tokens/s of drmlab's DRM variants against the upstream reference implementation, side by side.

Run: python benchmarks/bench_reference.py --reference /path/to/drm-language-emitter \
         [--presets tiny,small] [--variants J,J_NO_DIRECTION,SSM_CONTROL,J_DIRECT_CONTROL_MATCHED] [--rounds 5] \
         [--plain] [--fast]

The reference (github.com/gnai-creator/drm-language-emitter, checked at commit 585dc3a) is not a
dependency: give the path of a checkout (the folder holding ``src/drm_language_emitter`` and
``configs/``); without one the script says so and exits with status 2.

Pairing (``docs/drm.md`` appendix A.5.3): the reference model is built from its own variant table
(``configs/drm_fix_ablation_variants.json`` over its base configuration) with the widths of drmlab's
preset -- dimensions, mixer and memory widths (SSM_CONTROL's and the matched control's memory width as
drmlab matches it) -- and its weights are copied into the drmlab model. Before timing, both copies run
in float64 on the same tokens: the logits and the loss must agree to 1e-9, so both compute the same
function. A training step is forward + loss + backward + AdamW in float32, each side with its own trainer's
AdamW (drmlab's fused one, ``drmlab.training.optim``; the reference's per-parameter loop, as its
``training.py`` builds it) (the reference's loss is
its own ``out["loss"]`` with ``collect_diagnostics=False``, its leanest training call; drmlab's is
next-token cross-entropy). Steps of all models alternate in rounds and the medians are compared, so
the machine's noise hits both alike; ``--threads`` (default 1) sets torch's thread count. Two rates
are printed: tokens per wall second, and tokens per CPU second of the calling thread
(``time.thread_time``), which a shared machine's other jobs disturb less (at one thread; with more,
only the calling thread's time is counted).

``--fast-memory`` also times the fast setting with the selective memory's matrix products in bf16
(``memory_products_in_autocast``: what ``drmlab train --fast`` does now, docs/drm.md A.4.7).
``--compiled`` also times drmlab's float32 step with the model ``torch.compile``d (what ``drmlab train --compile
on`` trains; its compiling first steps are not timed, and the first step's seconds are printed).
``--plain`` also times drmlab with its fused kernels off (``drmlab.ops.fusion.plain_reference``: what the
fusion gains), ``--fast`` the fast setting with the memory's products in float32 (as ``--fast`` trained
before it included them: bf16 autocast around a ``torch.compile``d model, fused kernels on; its compiling first
steps are not timed). Each is a copy of
drmlab's model with the same weights, timed in the same rounds; the ratios are to the reference's float32.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from drmlab.models import build_model
from drmlab.ops.fusion import plain_reference
from drmlab.training.compiling import compile_model
from drmlab.training.config import TrainConfig
from drmlab.training.fast import use_persistent_compile_cache
from drmlab.training.optim import build_optimizer

BATCH = {"micro": 8, "tiny": 8, "small": 4, "125m": 1}
VARIANTS = "J,J_NO_DIRECTION,SSM_CONTROL,J_DIRECT_CONTROL_MATCHED"
AGREEMENT = 1e-9  # float64 tolerance of the paired forward (logits and loss)


def trainer_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``drmlab train`` builds (AdamW, fused where it applies, the per-parameter loop under
    ``plain_reference``); the reference gets its own training script's ``torch.optim.AdamW``."""
    return build_optimizer(model, TrainConfig(lr=1e-4))


# drmlab config field -> the reference's, for the widths taken from drmlab's preset
WIDTHS = {
    "d_token": "d_token",
    "d_state": "d_state",
    "n_directions": "n_directions",
    "metric_rank": "metric_rank",
    "hidden_size": "hidden_size",
    "direction_basis_size": "direction_basis_size",
    "metric_u_basis_size": "metric_u_basis_size",
    "block_size": "directional_cumsum_block_size",
    "max_seq_len": "max_seq_len",
    "vocab_size": "vocab_size",
    "mixer_hidden": "directional_local_mixer_hidden_size",
    "mixer_kernel": "directional_local_mixer_kernel_size",
    "mixer_layers": "directional_local_mixer_layers",
    "mixer_dilation_growth": "directional_local_mixer_dilation_growth",
    "memory_hidden": "selective_memory_hidden_size",
}

# drmlab parameter-name prefix -> the reference's (the first match wins; the rest of the name is kept)
PREFIXES = (
    ("embedding.", "token_embedding.embedding."),
    ("initial_state.", "initializer."),
    ("direction_field.trunk.fc1.", "direction_field.trunk.0."),
    ("direction_field.trunk.fc2.", "direction_field.trunk.3."),
    ("direction_field.basis", "direction_field.direction_basis"),
    ("metric.trunk.fc1.", "metric.trunk.0."),
    ("metric.trunk.fc2.", "metric.trunk.3."),
    ("metric.basis", "metric.u_basis"),
    ("flow.fc1.", "flow.coeff_net.0."),
    ("flow.fc2.", "flow.coeff_net.3."),
    ("direct_transition.fc1.", "direct_transition.net.0."),
    ("direct_transition.fc2.", "direct_transition.net.3."),
    ("emitter.norm.", "emitter.net.0."),
    ("emitter.fc1.", "emitter.net.1."),
    ("emitter.fc2.", "emitter.net.4."),
    ("mixer.in_proj.", "local_mixer.input_proj."),
    ("mixer.out_proj.", "local_mixer.output_proj."),
    ("mixer.", "local_mixer."),
    ("token_residual.proj.", "token_state_residual.projection."),
    ("memory.in_proj.", "selective_memory.input_proj."),
    ("memory.forget.", "selective_memory.forget_head."),
    ("memory.write.", "selective_memory.write_head."),
    ("memory.candidate.", "selective_memory.candidate_head."),
    ("", ""),  # direction_field.direction_head, gate_head, metric.diag_head, metric.u_head
)


def load_reference(path: str):
    """The reference package from a checkout at ``path``; exits with a one-line message when absent."""
    root = Path(path).expanduser()
    if not (root / "src" / "drm_language_emitter" / "model.py").is_file():
        print(
            f"bench_reference: no reference checkout at {root} (expected src/drm_language_emitter/ there); "
            "get gnai-creator/drm-language-emitter at 585dc3a and pass its path with --reference",
            file=sys.stderr,
        )
        raise SystemExit(2)
    sys.path.insert(0, str(root / "src"))
    import drm_language_emitter

    return root, drm_language_emitter


def reference_config(root: Path, package, variant: str, ours):
    """The reference's variant (its table over its base configuration) at the widths of drmlab's ``ours``."""
    import yaml

    table = json.loads((root / "configs" / "drm_fix_ablation_variants.json").read_text())
    values = yaml.safe_load((root / table["base_config"]).read_text())
    values.update(table["common"])
    entry = table["variants"][variant]
    for name in entry.get("inherit", []):
        values.update(table[name])
    values.update(entry.get("overrides", {}))
    values.update({theirs: getattr(ours, mine) for mine, theirs in WIDTHS.items()})
    return package.DRMConfig.from_dict(values)


def reference_name(name: str) -> str:
    for mine, theirs in PREFIXES:
        if name.startswith(mine):
            return theirs + name[len(mine) :]
    raise AssertionError(name)


def copy_weights(reference: torch.nn.Module, ours: torch.nn.Module) -> None:
    """Copy every reference parameter into the drmlab model; both sides must be covered exactly."""
    theirs = dict(reference.named_parameters())
    used = set()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            key = reference_name(name)
            if key not in theirs:
                raise KeyError(f"drmlab parameter {name} has no reference counterpart {key}")
            source = theirs[key]
            if source.shape != param.shape:  # the reference's pointwise layers are 1x1 convolutions
                source = source.reshape(param.shape)
            param.copy_(source)
            used.add(key)
    left = sorted(set(theirs) - used)
    if left:
        raise KeyError(f"reference parameters not copied: {', '.join(left)}")


def check_agreement(reference, ours, tokens, step: int) -> float:
    """Max |difference| of logits and loss between the two models in float64 on ``tokens``, at the
    timed step and at full naturalization strength (no step)."""
    ref64, ours64 = copy.deepcopy(reference).double(), copy.deepcopy(ours).double()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    gap = 0.0
    with torch.no_grad():
        for at in (step, None):
            out = ref64(inputs, targets, global_step=at, collect_diagnostics=False)
            logits = ours64(inputs, step=at).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            gap = max(gap, (out["logits"] - logits).abs().max().item(), (out["loss"] - loss).abs().item())
    return gap


def timed(run, *args):
    """(wall seconds, CPU seconds of this thread) of ``run(*args)``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    run(*args)
    return time.perf_counter() - wall, time.thread_time() - cpu


def ours_step(model, opt, tokens, step: int) -> None:
    out = model(tokens[:, :-1], step=step)
    loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def fast_step(model, opt, tokens, step: int) -> None:
    """The fast setting's step (``drmlab train --fast``): bf16 autocast around the compiled forward and the loss."""
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = model(tokens[:, :-1], step=step)
        loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def plain_step(model, opt, tokens, step: int) -> None:
    """drmlab's step with every fused kernel off (``drmlab.ops.fusion.plain_reference``)."""
    with plain_reference():
        ours_step(model, opt, tokens, step)


def reference_step(model, opt, tokens, step: int) -> None:
    out = model(tokens[:, :-1], tokens[:, 1:], global_step=step, collect_diagnostics=False)
    opt.zero_grad(set_to_none=True)
    out["loss"].backward()
    opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", required=True, help="path of a drm-language-emitter checkout")
    parser.add_argument(
        "--reference-commit",
        default="",
        help="the reference's commit, when its folder has no git history (an exported archive)",
    )
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--step", type=int, default=1, help="optimizer step passed to both (naturalization warm-up)")
    parser.add_argument(
        "--json", type=Path, help="also write the figures as a study record (docs/studies/bench-reference)"
    )
    parser.add_argument(
        "--machine", default="not stated", help="with --json: a line describing the machine and its load"
    )
    parser.add_argument(
        "--fast", action="store_true", help="also time drmlab's fast setting (bf16 autocast + torch.compile + fused)"
    )
    parser.add_argument("--plain", action="store_true", help="also time drmlab with its fused kernels off")
    parser.add_argument(
        "--compiled", action="store_true", help="also time drmlab's float32 step with the model torch.compiled"
    )
    parser.add_argument(
        "--fast-memory",
        action="store_true",
        help="also time the fast setting with the selective memory's matrix products in bf16 too "
        "(memory_products_in_autocast, docs/drm.md A.4.7)",
    )
    args = parser.parse_args()
    root, package = load_reference(args.reference)
    sides = ["ours", "ref"] + (["plain"] if args.plain else []) + (["compiled"] if args.compiled else [])
    sides += ["fast"] if args.fast else []
    sides += ["fast_memory"] if args.fast_memory else []
    if args.fast or args.fast_memory or args.compiled:
        use_persistent_compile_cache()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, reference {root}")
    presets = []
    for preset in args.presets.split(","):
        pairs = {}
        tokens = None
        for variant in args.variants.split(","):
            ours = build_model(variant, preset=preset)
            reference = package.DRMEmitterModel(reference_config(root, package, variant, ours.config))
            copy_weights(reference, ours)
            if tokens is None:
                shape = (BATCH[preset], ours.config.max_seq_len + 1)
                tokens = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(0))
            gap = check_agreement(reference, ours, tokens, args.step)
            if not gap <= AGREEMENT:
                raise SystemExit(f"bench_reference: {variant} at {preset} differs from the reference by {gap:.3g}")
            pairs[variant] = {
                "ours": (ours, trainer_optimizer(ours), ours_step),
                "ref": (reference, torch.optim.AdamW(reference.parameters(), lr=1e-4), reference_step),
                "gap": gap,
            }
            if args.plain:
                plain = copy.deepcopy(ours)
                with plain_reference():  # the per-parameter AdamW loop too
                    pairs[variant]["plain"] = (plain, trainer_optimizer(plain), plain_step)
            if args.compiled:
                compiled_copy = copy.deepcopy(ours)
                compiled = compile_model(compiled_copy)
                pairs[variant]["compiled"] = (compiled, trainer_optimizer(compiled_copy), ours_step)
            if args.fast:
                fast = copy.deepcopy(ours)
                compiled = compile_model(fast)
                pairs[variant]["fast"] = (compiled, trainer_optimizer(fast), fast_step)
            if args.fast_memory:  # the same weights, the memory's products in bf16 too
                fast_memory = build_model(variant, preset=preset, memory_products_in_autocast=True)
                fast_memory.load_state_dict(ours.state_dict())
                compiled = compile_model(fast_memory)
                pairs[variant]["fast_memory"] = (compiled, trainer_optimizer(fast_memory), fast_step)
        times = {(v, side): [] for v in pairs for side in sides}
        for v, pair in pairs.items():  # warm-up (compiles the fast side: its first steps are not timed)
            for side in sides:
                model, opt, run = pair[side]
                seconds = timed(run, model, opt, tokens, args.step)[0]
                if side.startswith("fast") or side == "compiled":
                    print(f"{v} at {preset}: the {side} side's first step (compiling) took {seconds:.0f} s")
                    run(model, opt, tokens, args.step)
        for _ in range(args.rounds):
            for v, pair in pairs.items():
                for side in sides:
                    model, opt, run = pair[side]
                    times[v, side].append(timed(run, model, opt, tokens, args.step))
        count = tokens[:, :-1].numel()
        print(f"\npreset {preset}: batch {tokens.shape[0]} x {tokens.shape[1] - 1} tokens, {args.rounds} rounds")
        extra = [side for side in sides if side not in ("ours", "ref")]
        print(
            f"{'variant':<26}{'params':>12}{'ours tok/s':>12}{'ref tok/s':>12}{'ours/ref':>10}"
            f"{'ours cpu':>12}{'ref cpu':>12}{'ours/ref':>10}{'f64 gap':>10}"
            + "".join(f"{side + '/ref':>17}" for side in extra)
        )
        rows = {}
        for v, pair in pairs.items():
            wall = {side: count / statistics.median(t[0] for t in times[v, side]) for side in sides}
            cpu = {side: count / statistics.median(t[1] for t in times[v, side]) for side in sides}
            params = sum(p.numel() for p in pair["ours"][0].parameters())
            print(
                f"{v:<26}{params:>12,}{wall['ours']:>12,.0f}{wall['ref']:>12,.0f}{wall['ours'] / wall['ref']:>10.2f}"
                f"{cpu['ours']:>12,.0f}{cpu['ref']:>12,.0f}{cpu['ours'] / cpu['ref']:>10.2f}{pair['gap']:>10.1e}"
                + "".join(f"{wall[side] / wall['ref']:>17.2f}" for side in extra)
            )
            rows[v] = {"params": params, "wall_tokens_per_s": wall, "cpu_tokens_per_s": cpu, "f64_gap": pair["gap"]}
        presets.append({"preset": preset, "batch": tokens.shape[0], "seq_len": tokens.shape[1] - 1, "variants": rows})
    if args.json is not None:
        write_record(args, root, presets)


def write_record(args, root: Path, presets: list[dict]) -> None:
    """The figures as a study record: command, commits (ours and the reference's), settings, numbers;
    the reference is named by its commit, never by where its checkout lies."""
    import subprocess

    from drmlab.experiments.results import provenance, write

    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True, text=True)
    command = (
        "python benchmarks/bench_reference.py --reference REFERENCE "
        + " ".join(f"--{k} {getattr(args, k)}" for k in ("presets", "variants", "rounds", "threads", "step"))
        + "".join(
            f" --{k.replace('_', '-')}" for k in ("plain", "compiled", "fast", "fast_memory") if getattr(args, k, False)
        )
        + (f" --reference-commit {args.reference_commit}" if getattr(args, "reference_commit", "") else "")
    )
    settings = {
        k: getattr(args, k, False)
        for k in ("presets", "variants", "rounds", "threads", "step", "plain", "compiled", "fast", "fast_memory")
    }
    commit = head.stdout.strip() or getattr(args, "reference_commit", "")
    if commit and not head.stdout.strip():
        commit += " (the files of that commit, without their git history)"
    settings["reference"] = "gnai-creator/drm-language-emitter at " + (commit or "an unknown commit")
    record = {
        "title": "Training tokens/s of drmlab's DRM variants against the upstream reference implementation, "
        "paired (its variant table at our widths, its weights in ours), forward + loss + backward + each side's own trainer's AdamW (drmlab's fused), float32 "
        "(drmlab's fast setting, where timed: bf16 autocast + torch.compile)",
        "provenance": {**provenance(settings, command=command), "machine": args.machine},
        "units": "tokens per second: wall (median step) and CPU time of the calling thread (median step), by side "
        "(ours: drmlab's default float32 path; ref: the reference; plain: drmlab with fused kernels off; fast: "
        "drmlab's fast setting), "
        "rounds interleaving every model; f64_gap the largest logit or loss difference of the pair in float64",
        "presets": presets,
    }
    write(args.json, record)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
