"""``drmlab ablate``: the paired ablation protocol (several models x several seeds, one budget).

Every (model, seed) run uses the same train config, so for a given seed every model sees the
same batches in the same order (the batches are a function of (seed, step, micro) only; see
``drmlab.training.batches``), and the seed also drives each model's init. Runs go seed by seed
(all models of seed 1, then seed 2, ...) so complete pairs accumulate first. Each run lives in
``OUT/runs/MODEL-seedS`` and is an ordinary ``drmlab train`` run directory.

Resuming: rerunning the same command skips finished runs (their ``summary.json``), continues a
half-finished run from its checkpoint (bit-exactly), and starts the rest. More models or seeds
may be added on a rerun; changing the budget, preset, train settings or data is refused.

Results: ``OUT/results.md``, ``OUT/results.csv`` (one row per run) and ``OUT/results.json`` with the
mean +- population std of the deterministic validation CE per model, per-seed values and
pairs, tokens/s, parameter counts and the promotion gate of the reference study for every
ordered pair (candidate, baseline): promoted only if both have >= 3 paired seeds, the mean CE
improves by >= 0.005 nats, the candidate wins >= 2 of 3 seeds (>= 2/3 of the pairs) and its
population std is <= 0.03. Plots: ``curves.png`` (sampled validation CE against tokens) and
``seeds.png`` (final CE per seed and model).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import sys
import time
from pathlib import Path

from drmlab.training.config import TRAIN_KEYS, parse_assignments, parse_tokens, resolve_train_config

DEFAULT_MODELS = "J,SSM_CONTROL,GPT2"
DEFAULT_SEEDS = "1,2,3"
DEFAULT_TOKENS = 5_005_312  # the reference: 611 steps of 8,192 tokens
STUDY_FILE = "study.json"

GATE_MIN_GAIN = 0.005
GATE_MIN_WIN_FRACTION = 2 / 3
GATE_MAX_STD = 0.03
GATE_MIN_SEEDS = 3

EPILOG = """\
examples:
  drmlab ablate                                     # J, SSM_CONTROL, GPT2 x seeds 1,2,3, tiny, 5,005,312 tokens
  drmlab ablate --models J,J_NO_DIRECTION --seeds 1,2,3 --preset tiny --tokens 1M --out studies/dir
  drmlab ablate --models J,GPT2 --set J.d_state=64 --set lr=1e-3

  Rerun the same command to resume an interrupted study. Settings: --set KEY=VALUE applies a train
  setting to every run; --set MODEL.KEY=VALUE a model setting to that model only.

promotion gate (the reference's, for every ordered pair candidate/baseline): >= 3 paired seeds,
mean CE gain >= 0.005 nats, wins >= 2 of 3 seeds, candidate population std <= 0.03.
"""


# ---------------------------------------------------------------- statistics


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof 0, as the reference reports)."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def gate(candidate: dict[int, float], baseline: dict[int, float]) -> dict:
    """The reference's promotion gate for per-seed CEs ``candidate`` vs ``baseline`` (paired by seed)."""
    seeds = sorted(set(candidate) & set(baseline))
    result = {"paired_seeds": seeds, "n": len(seeds)}
    if not seeds:
        return dict(result, promoted=False, reasons=["no paired seeds"])
    cand = [candidate[s] for s in seeds]
    base = [baseline[s] for s in seeds]
    cand_mean, cand_std = mean_std(cand)
    base_mean, _ = mean_std(base)
    gain = base_mean - cand_mean
    wins = sum(c < b for c, b in zip(cand, base))
    need_wins = math.ceil(GATE_MIN_WIN_FRACTION * len(seeds) - 1e-9)
    reasons = []
    if len(seeds) < GATE_MIN_SEEDS:
        reasons.append(f"only {len(seeds)} paired seeds (needs {GATE_MIN_SEEDS})")
    if gain < GATE_MIN_GAIN:
        reasons.append(f"mean gain {gain:+.4f} < {GATE_MIN_GAIN}")
    if wins < need_wins:
        reasons.append(f"wins {wins} of {len(seeds)} (needs {need_wins})")
    if cand_std > GATE_MAX_STD:
        reasons.append(f"std {cand_std:.4f} > {GATE_MAX_STD}")
    return dict(result, gain=gain, wins=wins, wins_needed=need_wins, candidate_std=cand_std,
                per_seed_gain={s: b - c for s, c, b in zip(seeds, cand, base)}, promoted=not reasons, reasons=reasons)


# ---------------------------------------------------------------- the study


@dataclasses.dataclass
class Study:
    models: list[str]
    seeds: list[int]
    preset: str
    train: dict  # TrainConfig fields except the seed
    model_overrides: dict[str, dict]
    data_source: str | None
    tokenizer: str
    # label -> registry name, for studies whose entries are settings of one model (loop-study arms)
    registry_names: dict[str, str] = dataclasses.field(default_factory=dict)

    def registry_name(self, label: str) -> str:
        return self.registry_names.get(label, label)

    def run_dir(self, out: Path, model: str, seed: int) -> Path:
        return run_dir(out, model, seed)


def run_dir(out: Path, label: str, seed: int) -> Path:
    """Where the run of ``label`` (a model name, ``NAME:ARM`` or an arm label) at ``seed`` lives."""
    from drmlab.models.registry import spec_path_name

    return Path(out) / "runs" / f"{spec_path_name(label)}-seed{seed}"


def _check_study(out: Path, study: Study, data_meta: dict) -> None:
    path = out / STUDY_FILE
    record = {"preset": study.preset, "train": study.train, "data_source": study.data_source,
              "tokenizer": study.tokenizer, "content_sha256": data_meta.get("content_sha256")}
    if path.is_file():
        saved = json.loads(path.read_text())
        problems = [f"{k}: {saved.get(k)!r} in the study, {v!r} now" for k, v in record.items()
                    if k != "train" and saved.get(k) != v]
        for k, v in record["train"].items():
            if k not in ("eval_tokens", "eval_batch_size") and saved.get("train", {}).get(k) != v:
                problems.append(f"{k}: {saved.get('train', {}).get(k)!r} in the study, {v!r} now")
        for model, overrides in study.model_overrides.items():
            before = saved.get("model_overrides", {}).get(model)
            if before is not None and before != overrides:
                problems.append(f"{model} settings: {before!r} in the study, {overrides!r} now")
        if problems:
            raise ValueError(f"{out} holds a study with other settings (use a new --out): " + "; ".join(problems))
        models = list(dict.fromkeys(saved.get("models", []) + study.models))
        seeds = sorted(set(saved.get("seeds", [])) | set(study.seeds))
        overrides = {**saved.get("model_overrides", {}), **study.model_overrides}
    else:
        models, seeds, overrides = study.models, study.seeds, study.model_overrides
    from drmlab.runs import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(record, models=models, seeds=seeds, model_overrides=overrides))


def _finished(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("finished") and summary.get("val_ce") is not None else None


def run_study(study: Study, out: str | Path, corpus, *, device="auto", quiet=False, log=print) -> dict:
    """Run (or resume) every (seed, model) of ``study`` on ``corpus``; write and return the results."""
    from drmlab.evaluation.rescoring import byte_counter, rescorer
    from drmlab.models import build_model
    from drmlab.runs import RunDir
    from drmlab.training.config import TrainConfig
    from drmlab.training.trainer import train

    out = Path(out)
    _check_study(out, study, corpus.meta)
    count_bytes = byte_counter(corpus.val, corpus.tokenizer, corpus.meta.get("val_bytes"))
    todo = [(seed, model) for seed in study.seeds for model in study.models]
    for i, (seed, model) in enumerate(todo, 1):
        path = study.run_dir(out, model, seed)
        label = f"[{i}/{len(todo)}] {model} seed {seed}"
        done = _finished(path)
        if done is not None:
            log(f"{label}: done before (val CE {done['val_ce']:.4f}), skipped")
            continue
        cfg = TrainConfig(**dict(study.train, seed=seed)).validate()
        overrides = study.model_overrides.get(model, {})
        net = build_model(study.registry_name(model), study.preset, vocab_size=corpus.vocab_size, seed=seed, **overrides)
        limit = getattr(getattr(net, "config", None), "n_positions", None)
        if isinstance(limit, int) and cfg.seq_len > limit:
            raise ValueError(f"seq_len {cfg.seq_len} exceeds {model}'s n_positions={limit}; add --set {model}.n_positions={cfg.seq_len}")
        resume = RunDir(path).has_checkpoint()
        log(f"{label}: {'resuming' if resume else 'training'} ({sum(p.numel() for p in net.parameters()):,} parameters)")
        t0 = time.perf_counter()
        summary = train(net, corpus.train, corpus.val, cfg, path, resume=resume,
                        evaluate=rescorer(corpus.val, cfg.seq_len, batch_size=cfg.eval_batch_size,
                                          max_targets=cfg.eval_tokens, count_bytes=count_bytes),
                        device=device, quiet=quiet,
                        run_info={"model": study.registry_name(model), "label": model, "preset": study.preset,
                                  "overrides": overrides,
                                  "vocab_size": corpus.vocab_size, "tokenizer": corpus.tokenizer.name,
                                  "data_source": study.data_source, "data": corpus.meta})
        log(f"{label}: val CE {summary['val_ce']:.4f} nats/token in {time.perf_counter() - t0:.0f} s")
    return write_results(out)


def collect_runs(out: Path) -> list[dict]:
    """Every finished run under ``out/runs``, with its sampled validation curve."""
    from drmlab.runs import read_metrics

    study = json.loads((out / STUDY_FILE).read_text())
    runs = []
    for model in study["models"]:
        for seed in study["seeds"]:
            path = run_dir(out, model, seed)
            summary = _finished(path)
            if summary is None:
                continue
            curve = [(r["tokens"], r["val_ce"]) for r in read_metrics(path) if r.get("kind") == "eval"]
            runs.append({"model": model, "seed": seed, "params": summary["params"], "val_ce": summary["val_ce"],
                         "val_bpb": summary["val_bpb"], "tokens": summary["tokens"],
                         "tokens_per_s": summary["tokens_per_s"], "train_seconds": summary["train_seconds"],
                         "curve": curve})
    return runs


def summarize(runs: list[dict], models: list[str]) -> tuple[dict, list[dict]]:
    per_model = {}
    for model in models:
        rows = [r for r in runs if r["model"] == model]
        if not rows:
            continue
        ce_mean, ce_std = mean_std([r["val_ce"] for r in rows])
        bpb_mean, bpb_std = mean_std([r["val_bpb"] for r in rows])
        speeds = [r["tokens_per_s"] for r in rows if r["tokens_per_s"]]
        per_model[model] = {
            "params": rows[0]["params"], "n_seeds": len(rows), "ce_mean": ce_mean, "ce_std": ce_std,
            "ce_min": min(r["val_ce"] for r in rows), "ce_max": max(r["val_ce"] for r in rows),
            "bpb_mean": bpb_mean, "bpb_std": bpb_std,
            "tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
            "per_seed": {r["seed"]: r["val_ce"] for r in rows},
        }
    gates = []
    for cand in per_model:
        for base in per_model:
            if cand != base:
                gates.append(dict(candidate=cand, baseline=base, **gate(per_model[cand]["per_seed"], per_model[base]["per_seed"])))
    return per_model, gates


def write_results(out: str | Path) -> dict:
    """(Re)write results.md / .csv / .json and the plots from the finished runs under ``out``."""
    out = Path(out)
    study = json.loads((out / STUDY_FILE).read_text())
    runs = collect_runs(out)
    per_model, gates = summarize(runs, study["models"])
    results = {
        "study": study,
        "models": per_model,
        "runs": runs,
        "gate": gates,
        "gate_rule": {"min_seeds": GATE_MIN_SEEDS, "min_gain": GATE_MIN_GAIN, "min_win_fraction": GATE_MIN_WIN_FRACTION,
                      "max_std": GATE_MAX_STD, "std": "population"},
        "complete": len(runs) == len(study["models"]) * len(study["seeds"]),
    }
    from drmlab.runs import write_json_atomic

    write_json_atomic(out / "results.json", results)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", "seed", "params", "val_ce", "val_bpb", "tokens", "tokens_per_s", "train_seconds"])
    for r in runs:
        writer.writerow([r["model"], r["seed"], r["params"], f"{r['val_ce']:.6f}", f"{r['val_bpb']:.6f}", r["tokens"],
                         f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] else "", f"{r['train_seconds']:.1f}"])
    (out / "results.csv").write_text(buffer.getvalue())
    (out / "results.md").write_text(markdown(results))
    try:
        plot(results, out)
    except Exception as exc:  # plots are a convenience; never lose the tables over them
        print(f"drmlab ablate: warning: plots not written ({exc})", file=sys.stderr)
    return results


def markdown(results: dict) -> str:
    study, per_model = results["study"], results["models"]
    train = study["train"]
    tokens_per_step = train["batch_size"] * train["grad_accum"] * train["seq_len"]
    steps = math.ceil(train["tokens"] / tokens_per_step)
    lines = [
        "# Ablation results",
        "",
        f"Preset `{study['preset']}`, {steps * tokens_per_step:,} tokens per run ({steps} steps of {tokens_per_step:,}), "
        f"seeds {', '.join(map(str, study['seeds']))}; data `{study['data_source'] or 'stdlib'}` "
        f"({study['tokenizer']} tokenizer). CE is the deterministic rescoring of the validation stream in nats per "
        "token; std is the population std over seeds." + ("" if results["complete"] else " **Incomplete: some runs are missing.**"),
        "",
        "| model | params | seeds | CE mean +- std | min-max | bits/byte | tok/s |",
        "|---|---:|---:|---|---|---:|---:|",
    ]
    for model, m in sorted(per_model.items(), key=lambda kv: kv[1]["ce_mean"]):
        speed = f"{m['tokens_per_s']:,.0f}" if m["tokens_per_s"] else "-"
        lines.append(f"| {model} | {m['params']:,} | {m['n_seeds']} | {m['ce_mean']:.4f} +- {m['ce_std']:.4f} | "
                     f"{m['ce_min']:.4f}-{m['ce_max']:.4f} | {m['bpb_mean']:.4f} | {speed} |")
    seeds = sorted({s for m in per_model.values() for s in m["per_seed"]})
    lines += ["", "## Per seed", "", "| model | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---:|" * len(seeds)]
    for model, m in per_model.items():
        lines.append(f"| {model} | " + " | ".join(f"{m['per_seed'][s]:.4f}" if s in m["per_seed"] else "-" for s in seeds) + " |")
    lines += ["", "## Promotion gate", "",
              f"Candidate promoted over baseline only with >= {GATE_MIN_SEEDS} paired seeds, mean gain >= {GATE_MIN_GAIN}, "
              f"wins >= 2 of 3 seeds and candidate std <= {GATE_MAX_STD}.", "",
              "| candidate | baseline | gain (baseline - candidate) | per-seed gains | wins | candidate std | promoted |",
              "|---|---|---:|---|---:|---:|---|"]
    for g in results["gate"]:
        if "gain" not in g:
            lines.append(f"| {g['candidate']} | {g['baseline']} | - | - | - | - | no ({'; '.join(g['reasons'])}) |")
            continue
        per_seed = ", ".join(f"{v:+.4f}" for v in g["per_seed_gain"].values())
        verdict = "**yes**" if g["promoted"] else f"no ({'; '.join(g['reasons'])})"
        lines.append(f"| {g['candidate']} | {g['baseline']} | {g['gain']:+.4f} | {per_seed} | {g['wins']}/{g['n']} | "
                     f"{g['candidate_std']:.4f} | {verdict} |")
    lines += ["", "Plots: `curves.png` (sampled validation CE during training), `seeds.png` (final CE per seed).", ""]
    return "\n".join(lines)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, per_model = results["runs"], results["models"]
    colors = {m: f"C{i}" for i, m in enumerate(per_model)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model in per_model:
        curves = [r["curve"] for r in runs if r["model"] == model and r["curve"]]
        for curve in curves:
            ax.plot([t for t, _ in curve], [v for _, v in curve], color=colors[model], alpha=0.3, lw=0.8)
        if curves and all(len(c) == len(curves[0]) for c in curves):
            mean = [sum(c[i][1] for c in curves) / len(curves) for i in range(len(curves[0]))]
            ax.plot([t for t, _ in curves[0]], mean, color=colors[model], lw=2, label=model)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("sampled validation CE (nats/token)")
    finals = [m["ce_min"] for m in per_model.values()]
    if finals:
        ax.set_ylim(min(finals) - 0.1, max(m["ce_max"] for m in per_model.values()) + 0.6)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)

    seeds = sorted({s for m in per_model.values() for s in m["per_seed"]})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(per_model))
    for i, (model, m) in enumerate(per_model.items()):
        xs = [j + i * width for j, s in enumerate(seeds) if s in m["per_seed"]]
        ax.bar(xs, [m["per_seed"][s] for s in seeds if s in m["per_seed"]], width, color=colors[model], label=model)
    ax.set_xticks([j + width * (len(per_model) - 1) / 2 for j in range(len(seeds))], [f"seed {s}" for s in seeds])
    if per_model:
        lo = min(m["ce_min"] for m in per_model.values())
        hi = max(m["ce_max"] for m in per_model.values())
        ax.set_ylim(lo - 0.05 - 0.2 * (hi - lo), hi + 0.05 + 0.2 * (hi - lo))
    ax.set_ylabel("validation CE (nats/token)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "seeds.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- command line


def add_parser(subparsers) -> argparse.ArgumentParser:
    from drmlab.cli.common import add_data_arguments

    parser = subparsers.add_parser(
        "ablate",
        help="paired ablation: several models x seeds on the same batches, with the promotion gate",
        description="Train every model once per seed with identical batches (per seed), rescore each on the "
                    "validation stream, and tabulate mean +- std, per-seed pairs and the promotion gate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated model names, NAME or NAME:ARM for a named arm such as LOOPED:B "
                             f"(default {DEFAULT_MODELS})")
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"comma-separated seeds (default {DEFAULT_SEEDS})")
    parser.add_argument("--preset", default="tiny", help="model size and training defaults (default tiny)")
    parser.add_argument("--tokens", default=None, metavar="N", help="token budget per run (default 5,005,312 = 611 x 8,192)")
    parser.add_argument("--out", default=None, metavar="DIR", help="study directory (default studies/ablate-PRESET)")
    add_data_arguments(parser)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    parser.add_argument("--eval-tokens", default=None, metavar="N", help="cap on validation tokens rescored per run (default: all)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="[MODEL.]KEY=VALUE",
                        help="train setting for every run, or MODEL.KEY=VALUE for one model's config; repeatable")
    parser.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast for training")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)
    return parser


def _split_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"--{what} is empty")
    if len(set(items)) != len(items):
        raise ValueError(f"--{what} lists a name twice: {text}")
    return items


def build_study(args: argparse.Namespace, vocab_size: int) -> Study:
    from drmlab.models.registry import config_fields, parse_model_spec, suggest
    from drmlab.cli.common import model_setting_names

    models = _split_list(args.models, "models")
    specs = {model: parse_model_spec(model) for model in models}  # label -> (registry name, arm)
    try:
        seeds = [int(s) for s in _split_list(args.seeds, "seeds")]
    except ValueError as exc:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from exc
    train_set, model_overrides = {}, {m: dict(specs[m][1]) for m in models}
    for key, value in parse_assignments(args.assignments).items():
        prefix, dot, name = key.partition(".")
        if dot:
            if prefix not in models:
                raise ValueError(f"--set {key}: {prefix!r} is not one of --models{suggest(prefix, models)}")
            from drmlab.training.config import split_overrides

            _, model_kw = split_overrides({name: value}, model_setting_names(specs[prefix][0], args.preset, vocab_size))
            if not model_kw:
                raise ValueError(f"--set {key}: {name!r} is a train setting; write it without the model prefix")
            model_overrides[prefix].update(model_kw)
        elif key in TRAIN_KEYS:
            train_set[key] = parse_tokens(value) if key in ("tokens", "eval_every", "eval_tokens", "checkpoint_every") and isinstance(value, str) else value
        else:
            from drmlab.training.config import split_overrides

            split_overrides({key: value}, [])  # raises with the nearest train key
    if "seed" in train_set:
        raise ValueError("use --seeds, not --set seed=...")
    values = {
        "tokens": parse_tokens(args.tokens) if args.tokens is not None else DEFAULT_TOKENS,
        "lr": args.lr,
        "bf16": args.bf16,
        "eval_tokens": None if args.eval_tokens in (None, "all") else parse_tokens(args.eval_tokens),
        **train_set,
    }
    cfg = resolve_train_config(args.preset, **values)
    train = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "seed"}
    for model in models:  # a bad arm or setting fails now, not after the first runs
        config_fields(specs[model][0], args.preset, vocab_size, **model_overrides[model])
    return Study(models=models, seeds=seeds, preset=args.preset, train=train,
                 model_overrides={m: o for m, o in model_overrides.items() if o}, data_source=args.data,
                 tokenizer=args.tokenizer or "bytes",
                 registry_names={m: specs[m][0] for m in models if specs[m][0] != m})


def run(args: argparse.Namespace) -> int:
    import torch

    from drmlab.cli.common import load_corpus_for

    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = load_corpus_for(args.data, args.tokenizer, args.cache_dir)
    study = build_study(args, corpus.vocab_size)
    out = Path(args.out or f"studies/ablate-{args.preset}")
    results = run_study(study, out, corpus, device=args.device, quiet=args.quiet,
                        log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(markdown(results))
    print(f"results in {out}/: results.md, results.csv, results.json, curves.png, seeds.png")
    return 0
