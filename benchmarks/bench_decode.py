"""Per-token decode time by batch size and context length; the DRM fast step beside its reference.

Run: python benchmarks/bench_decode.py [--batches 1,8,64] [--contexts 256] [--steps 32]
     python benchmarks/bench_decode.py --batches 1 --contexts 256,2048,16384   # growth with context

For each model at preset tiny, batch size and context of N tokens of real text: the parallel prefill
of the first N - 4 tokens, then 4 untimed single-token ``step`` calls (the warm-up: first-call costs
such as kernel loading, allocator growth and cache set-up are paid there, not in the timing), then
``--steps`` timed ``step`` calls. Reported: the median ms per step, tokens/s (batch x steps per
second), the ratio to the same model and batch at the shortest context, the size of the decoding
state (every storage it holds once, views of the weights not counted: the key/value cache for
attention, the recurrent state otherwise; a DRM state includes the fast step's per-block constants)
and the process's peak resident memory. A DRM model's ``step`` (the fast step) is timed interleaved
with its ``step_reference`` (the plain stage steps; the same logits bit for bit, checked here at
every timed step), so "x reference" is their ratio measured under the same conditions. Beside them,
interleaved too, ``step_fused`` (the fused C step, docs/drm.md A.4.5 "The fused step"; equal to the
reference to round-off, its largest relative logit difference reported) where the model has one:
"fused x step" and "fused x reference" are the ratios to the two measured in the same run. Above
``--fused-max-batch`` rows (default ``fused_step.MAX_BATCH``) ``step_fused`` is the fast step. Models
with a learned position table are built with one long enough.

     python benchmarks/bench_decode.py --models J,J_NO_DIRECTION,SSM_CONTROL --clock thread --fused-max-batch 64
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import torch

from drmlab.generation import prefill
from drmlab.models import build_model
from drmlab.models.drm import fused_step

WARMUP_STEPS = 4  # untimed step calls that end every context

MODELS = {
    "J": {},
    "J_NO_DIRECTION": {},
    "SSM_CONTROL": {},
    "MAMBA": {},
    "GPT2": {},  # n_positions set to the longest context below
    "LOOPED": dict(arm="MC", positions="none"),  # the selective-SSM looped arm
}
DEFAULT_MODELS = "J,J_NO_DIRECTION,SSM_CONTROL,MAMBA,GPT2"


def state_bytes(state, model=None) -> int:
    """The bytes the decoding state holds: each storage once, none shared with ``model``'s parameters
    (a view of a weight kept for the next step costs no memory)."""
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()} if model is not None else set()

    def count(x) -> int:
        if isinstance(x, torch.Tensor):
            key = x.untyped_storage().data_ptr()
            if key in seen:
                return 0
            seen.add(key)
            return x.untyped_storage().nbytes()
        if isinstance(x, dict):
            return sum(count(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(count(v) for v in x)
        if hasattr(x, "__dict__"):
            return sum(count(v) for v in vars(x).values())
        return 0

    return count(state)


def corpus_tokens(n: int, batch: int = 1) -> torch.Tensor:
    """[batch, n] bytes of Python's standard library source, each row starting elsewhere in it."""
    text = b"".join(p.read_bytes() for p in sorted(Path(argparse.__file__).parent.glob("*.py"))[:40])
    while len(text) < n * batch + 1:
        text += text
    rows = [text[i * n : (i + 1) * n] for i in range(batch)]
    return torch.stack([torch.frombuffer(bytearray(row), dtype=torch.uint8).long() for row in rows])


def time_steps(model, tokens: torch.Tensor, start: int, steps: int, state, reference: bool, fused: bool, clock):
    """Median seconds per ``step`` over ``steps`` calls from position ``start`` (and of ``step_reference``
    and ``step_fused``, interleaved, with ``reference`` / ``fused``: None without), the final state,
    whether every fast logit equalled its reference bit for bit, and the largest relative difference
    of a fused logit from the fast one (None without ``fused``)."""
    times = {"fast": [], "reference": [], "fused": []}
    equal, worst = True, 0.0
    ref_state = fused_state = state
    for t in range(start, start + steps):
        begin = clock()
        logits, state = model.step(tokens[:, t], state)
        times["fast"].append(clock() - begin)
        if reference:
            begin = clock()
            ref_logits, ref_state = model.step_reference(tokens[:, t], ref_state)
            times["reference"].append(clock() - begin)
            equal = equal and torch.equal(logits, ref_logits)
        if fused:
            begin = clock()
            fused_logits, fused_state = model.step_fused(tokens[:, t], fused_state)
            times["fused"].append(clock() - begin)
            worst = max(worst, ((fused_logits - logits).abs().max() / logits.abs().max().clamp_min(1.0)).item())
    medians = {k: statistics.median(v) if v else None for k, v in times.items()}
    return medians, state, equal, (worst if fused else None)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="256")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated; known: {','.join(MODELS)}")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (single-token steps are tiny)")
    parser.add_argument("--no-reference", action="store_true", help="skip timing DRM models' step_reference")
    parser.add_argument("--no-fused", action="store_true", help="skip timing DRM models' step_fused")
    parser.add_argument(
        "--fused-max-batch",
        type=int,
        default=fused_step.MAX_BATCH,
        help=f"step_fused runs its kernel up to this many rows (default {fused_step.MAX_BATCH}; above, the fast step)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="wall: perf_counter; thread: this thread's CPU time (on a machine other jobs load, it leaves out "
        "the time the step waits for a core)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fused_step.MAX_BATCH = args.fused_max_batch
    contexts = sorted(int(x) for x in args.contexts.split(","))
    batches = [int(x) for x in args.batches.split(",")]
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    if contexts[0] <= WARMUP_STEPS:
        parser.error(f"every context must be longer than the {WARMUP_STEPS} warm-up steps that end it")
    if args.steps < 1 or min(batches) < 1:
        parser.error("--steps and every batch size must be >= 1")
    print(
        f"preset {args.preset}, torch threads {torch.get_num_threads()}, {args.steps} timed steps per context "
        f"after {WARMUP_STEPS} untimed ones, {args.clock} clock; DRM models: fast step interleaved with step_reference "
        f"and step_fused (its kernel up to batch {fused_step.MAX_BATCH})"
    )
    print(
        "| model | batch | context | ms/token | tokens/s | reference ms/token | x reference | fused ms/token "
        "| fused tokens/s | fused x step | fused x reference | fused rel. diff | x shortest | state KiB | peak RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        overrides = dict(MODELS.get(name, {}))
        if name == "GPT2":
            overrides["n_positions"] = max(contexts) + args.steps + 1
        model = build_model(name, preset=args.preset, **overrides).eval()
        reference = hasattr(model, "step_reference") and not args.no_reference
        fused = hasattr(model, "step_fused") and not args.no_fused
        if fused and model.fused_step_unsupported() is not None:
            print(f"<!-- {name}: step_fused is the fast step: {model.fused_step_unsupported()} -->")
        for batch in batches:
            first = None
            for n in contexts:
                tokens = corpus_tokens(n + args.steps, batch)
                _, state = prefill(model, tokens[:, : n - WARMUP_STEPS])
                for t in range(n - WARMUP_STEPS, n):
                    _, state = model.step(tokens[:, t], state)
                medians, state, equal, worst = time_steps(model, tokens, n, args.steps, state, reference, fused, clock)
                seconds, ref_seconds, fused_seconds = medians["fast"], medians["reference"], medians["fused"]
                if not equal:
                    raise SystemExit(f"{name}: the fast step's logits differ from step_reference's (batch {batch})")
                ms = 1000 * seconds
                first = first or ms
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                ref = f"{1000 * ref_seconds:.3f} | {ref_seconds / seconds:.2f}" if reference else "- | -"
                if fused:
                    fused_ms = 1000 * fused_seconds
                    vs_ref = f"{ref_seconds / fused_seconds:.2f}" if reference else "-"
                    fused_cells = (
                        f"{fused_ms:.3f} | {batch * 1000 / fused_ms:,.0f} | {seconds / fused_seconds:.2f} | {vs_ref} "
                        f"| {worst:.1e}"
                    )
                else:
                    fused_cells = "- | - | - | - | -"
                print(
                    f"| {name} | {batch} | {n:,} | {ms:.3f} | {batch * 1000 / ms:,.0f} | {ref} | {fused_cells} "
                    f"| {ms / first:.2f} "
                    f"| {state_bytes(state, model) / 2**10:,.1f} | {rss:,.0f} |",
                    flush=True,
                )
                del state


if __name__ == "__main__":
    main()
