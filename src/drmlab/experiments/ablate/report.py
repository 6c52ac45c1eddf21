"""The ablation study's report (docs/drm.md section A.7), written from the numbers of
:func:`drmlab.experiments.ablate.protocol.collect_results`:

* ``results.json`` -- everything: the provenance, the study record, per-model statistics, every run
  with its downsampled curves, every gate (:mod:`drmlab.experiments.results` writes it);
* ``results.md`` -- models by mean validation CE (mean +- population std, min-max, bits per byte,
  tokens/s), the per-seed table and the promotion gate of every ordered pair;
* ``results.csv`` -- one row per run;
* ``curves.png`` (sampled validation CE against training tokens) and ``seeds.png`` (final CE per
  seed and model), drawn when matplotlib can (:mod:`drmlab.experiments.plotting`);
* with a learning-rate sweep, its table in results.md and ``lr_sweep.png`` (tuning CE against the
  rate per model, :mod:`drmlab.experiments.lr_sweep`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.plotting import draw_or_log, pyplot
from drmlab.experiments.stats import GATE_MAX_STD, GATE_MIN_GAIN, GATE_MIN_SEEDS
from drmlab.training.recipes import describe as describe_recipe

CSV_COLUMNS = ["model", "seed", "params", "val_ce", "val_bpb", "tokens", "tokens_per_s", "train_seconds"]


def write_report(results: dict, out: str | Path, log: Callable[[str], None] | None = None) -> None:
    """Write results.json, results.csv, results.md and the two plots of ``results`` into ``out``."""
    from drmlab.experiments.results import write

    out = Path(out)
    write(out / "results.json", results)
    (out / "results.csv").write_text(csv_table(results["runs"]))
    (out / "results.md").write_text(markdown(results))
    draw_or_log(lambda: plot(results, out), log, "plots")
    if results.get("lr_sweep"):
        draw_or_log(
            lambda: lr_sweep.plot(results["lr_sweep"], out / "lr_sweep.png", "tuning CE (nats/token)"),
            log,
            "lr_sweep.png",
        )


def csv_table(runs: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in runs:
        writer.writerow(
            [
                r["model"],
                r["seed"],
                r["params"],
                f"{r['val_ce']:.6f}",
                f"{r['val_bpb']:.6f}",
                r["tokens"],
                f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] else "",
                f"{r['train_seconds']:.1f}",
            ]
        )
    return buffer.getvalue()


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
        f"({study['tokenizer']} tokenizer); {describe_recipe(train)}. CE is the deterministic rescoring of the "
        "validation stream in nats per token; std is the population std over seeds."
        + ("" if results["complete"] else " **Incomplete: some runs are missing.**"),
        "",
    ]
    if per_model:
        lines += _paired_tables(results)
    else:
        lines.append("No paired run has finished yet (the sweep is running, or it was run with `--sweep-only`).")
    if results.get("lr_sweep"):
        tune_tokens = study.get("tune_tokens") or train["tokens"]
        lines += [
            "",
            "## Learning-rate sweep",
            "",
            f"Each model trained once per rate (seed {study.get('tune_seed')}, {tune_tokens:,} tokens), scored on a "
            "slice held out of the training split (not the validation split); its paired runs use the best rate.",
            "",
        ]
        lines += lr_sweep.markdown(results["lr_sweep"], "tuning CE in nats per token, lower is better")
    plots = (
        ["`curves.png` (sampled validation CE during training)", "`seeds.png` (final CE per seed)"] if per_model else []
    )
    plots += ["`lr_sweep.png` (the sweep)"] if results.get("lr_sweep") else []
    if plots:
        lines += ["", "Plots: " + ", ".join(plots) + "."]
    lines.append("")
    return "\n".join(lines)


def _paired_tables(results: dict) -> list[str]:
    """The paired runs' tables: per model, per seed, the promotion gate and the milestones."""
    per_model = results["models"]
    lines = [
        "| model | params | lr | seeds | CE mean +- std | min-max | bits/byte | tok/s |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for model, m in sorted(per_model.items(), key=lambda kv: kv[1]["ce_mean"]):
        speed = f"{m['tokens_per_s']:,.0f}" if m["tokens_per_s"] else "-"
        lr = f"{m['lr']:g}" if m.get("lr") is not None else "-"
        lines.append(
            f"| {model} | {m['params']:,} | {lr} | {m['n_seeds']} | {m['ce_mean']:.4f} +- {m['ce_std']:.4f} | "
            f"{m['ce_min']:.4f}-{m['ce_max']:.4f} | {m['bpb_mean']:.4f} | {speed} |"
        )
    seeds = sorted({s for m in per_model.values() for s in m["per_seed"]})
    lines += [
        "",
        "## Per seed",
        "",
        "| model | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|" + "---:|" * len(seeds),
    ]
    for model, m in per_model.items():
        lines.append(
            f"| {model} | " + " | ".join(f"{m['per_seed'][s]:.4f}" if s in m["per_seed"] else "-" for s in seeds) + " |"
        )
    lines += [
        "",
        "## Promotion gate",
        "",
        f"Candidate promoted over baseline only with >= {GATE_MIN_SEEDS} paired seeds, mean gain >= {GATE_MIN_GAIN}, "
        f"wins >= 2 of 3 seeds and candidate std <= {GATE_MAX_STD}.",
        "",
        "| candidate | baseline | gain (baseline - candidate) | per-seed gains | wins | candidate std | promoted |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for g in results["gate"]:
        if "gain" not in g:
            lines.append(f"| {g['candidate']} | {g['baseline']} | - | - | - | - | no ({'; '.join(g['reasons'])}) |")
            continue
        per_seed = ", ".join(f"{v:+.4f}" for v in g["per_seed_gain"].values())
        verdict = "**yes**" if g["promoted"] else f"no ({'; '.join(g['reasons'])})"
        lines.append(
            f"| {g['candidate']} | {g['baseline']} | {g['gain']:+.4f} | {per_seed} | {g['wins']}/{g['n']} | "
            f"{g['candidate_std']:.4f} | {verdict} |"
        )
    marked = {m: stats["milestones"] for m, stats in per_model.items() if stats.get("milestones")}
    if marked:
        marks = sorted({row["tokens"] for rows in marked.values() for row in rows})
        lines += [
            "",
            "## Milestones",
            "",
            "The whole validation stream rescored during training (bits per byte, mean +- std over seeds; "
            "the last column is the end of the run).",
            "",
            "| model | " + " | ".join(f"{t:,} tokens" for t in marks) + " | end |",
            "|---|" + "---:|" * (len(marks) + 1),
        ]
        for model, rows in marked.items():
            at = {row["tokens"]: row for row in rows}
            cells = [f"{at[t]['bpb_mean']:.4f} +- {at[t]['bpb_std']:.4f}" if t in at else "-" for t in marks]
            end = per_model[model]
            lines.append(f"| {model} | " + " | ".join(cells) + f" | {end['bpb_mean']:.4f} +- {end['bpb_std']:.4f} |")
    return lines


def plot(results: dict, out: Path) -> None:
    """``curves.png`` and ``seeds.png`` in ``out``."""
    runs, per_model = results["runs"], results["models"]
    if not per_model:
        return False
    plt = pyplot()
    colors = {m: f"C{i}" for i, m in enumerate(per_model)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model in per_model:
        curves = [r["curves"]["eval"] for r in runs if r["model"] == model and r["curves"]["eval"]["tokens"]]
        for curve in curves:
            ax.plot(curve["tokens"], curve["val_ce"], color=colors[model], alpha=0.3, lw=0.8)
        if curves and all(c["tokens"] == curves[0]["tokens"] for c in curves):
            mean = [sum(values) / len(curves) for values in zip(*(c["val_ce"] for c in curves))]
            ax.plot(curves[0]["tokens"], mean, color=colors[model], lw=2, label=model)
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
