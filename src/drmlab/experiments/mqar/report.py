"""The MQAR study's report (docs/mqar.md section 7), written from
:func:`drmlab.experiments.mqar.study.summarize`'s numbers:

* ``mqar.md`` -- model x kv: test accuracy mean +- population std over seeds (with the reference
  study's value where comparable) and first-query accuracy, the rows of chance and of the two
  no-binding levels, then one line per run with its per-query accuracy;
* ``mqar.json`` -- the whole summary, per-seed values included;
* ``mqar.png`` -- accuracy against kv, drawn when matplotlib can (:mod:`drmlab.experiments.plotting`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.plotting import draw_or_log, pyplot


def write_report(summary: dict, out: str | Path, log: Callable[[str], None] | None = None) -> None:
    """Write mqar.json, mqar.md and mqar.png of ``summary`` into ``out``; each run gains the downsampled
    curves of its metrics.jsonl (:func:`add_curves`)."""
    from drmlab.experiments.results import write

    out = Path(out)
    add_curves(summary, out)
    write(out / "mqar.json", summary)
    (out / "mqar.md").write_text(markdown(summary))
    draw_or_log(lambda: plot(summary, out / "mqar.png"), log, "mqar.png")
    if summary.get("lr_sweep"):
        draw_or_log(
            lambda: lr_sweep.plot(summary["lr_sweep"], out / "lr_sweep.png", "held-out accuracy"), log, "lr_sweep.png"
        )


def add_curves(summary: dict, out: Path) -> None:
    """Set ``curves`` (:func:`drmlab.experiments.results.curves`) of every run whose directory under
    ``out/runs`` still has its metrics.jsonl; a run read from a results file keeps the curves it has."""
    from drmlab.experiments.results import curves
    from drmlab.models.registry import spec_path_name
    from drmlab.runs import RunDir

    for r in summary.get("runs", []):
        run = RunDir(out / "runs" / f"{spec_path_name(r['model'])}_kv{r['kv']}_s{r['seed']}")
        if run.metrics_path.is_file():
            r["curves"] = curves(run.read_metrics())


def percent(value) -> str:
    return "--" if value is None else f"{100 * value:.1f}%"


def markdown(summary: dict) -> str:
    s = summary["study"]
    kvs = s["kvs"]
    chance = summary["chance"]
    lines = [
        "# MQAR probe",
        "",
        f"vocab_kv {s['vocab_kv']} (vocabulary {2 * s['vocab_kv'] + 2}); train "
        f"{'fresh every step' if s['n_train'] == 0 else format(s['n_train'], ',')} / test {s['n_test']:,} "
        f"sequences; {s['steps']:,} steps at batch {s['batch_size']}; preset {s['preset']}"
        + (f", width {s['width']}" if s["width"] else "")
        + f"; arm model {s['arm_model']}; seeds "
        + ", ".join(map(str, s["seeds"]))
        + ".",
        f"Test accuracy on the query (value) positions only, mean +- population std over seeds; "
        f"chance = 1/{s['vocab_kv']} = {100 * chance:.2f}%. [study: ...] = the reference study's value (docs/mqar.md section 6).",
        "Two levels need no key-value binding at all: answering with a random one of the kv values in "
        "the context (*context guess*), and doing so among the values not yet queried (*elimination*; "
        "every key is queried once). The first query of a sequence cannot use elimination, so its "
        "accuracy above the context guess is recall.",
        "",
        "| model | params | " + " | ".join(f"kv={kv} | kv={kv} first query" for kv in kvs) + " |",
        "|---|---:|" + "---:|---:|" * len(kvs),
    ]
    for name, m in summary["models"].items():
        cells, params = [], ""
        for kv in kvs:
            c = m["cells"].get(str(kv))
            if c is None:
                cells += ["--", "--"]
                continue
            params = params or f"{c['params']:,}"
            text = f"{100 * c['acc_mean']:.1f}% +- {100 * c['acc_std']:.1f} ({c['n_seeds']})"
            if c["anchor_acc"] is not None:
                text += f" [study: {c['anchor_acc']:.1f}%]"
            cells.append(text)
            first = c.get("first_query_mean")
            cells.append("--" if first is None else f"{100 * first:.1f}% +- {100 * c['first_query_std']:.1f}")
        lines.append(f"| {name} | {params} | " + " | ".join(cells) + " |")
    levels = summary.get("levels", {})
    for key, label in (
        ("chance", "chance"),
        ("context_guess", "context guess (no binding)"),
        ("elimination_guess", "elimination (no binding)"),
    ):
        row = []
        for kv in kvs:
            lv = levels.get(str(kv))
            if lv is None:
                row += ["", ""]
                continue
            first = lv["context_guess"] if key == "elimination_guess" else lv[key]
            row += [f"{100 * lv[key]:.2f}%", f"{100 * first:.2f}%"]
        lines.append(f"| {label} | | " + " | ".join(row) + " |")
    lines += ["", "Per seed (test acc / train acc, seconds per step; test accuracy of the 1st, 2nd, ... query):", ""]
    for r in summary["runs"]:
        per_query = ", ".join(f"{100 * a:.0f}" for a in r.get("test_by_query") or [])
        lines.append(
            f"* {r['model']} kv={r['kv']} seed {r['seed']}: {100 * r['test_acc']:.1f}% / "
            f"{percent(r['train_acc'])}, {r['seconds_per_step']:.3f} s/step, final loss {r['final_loss']:.3f}"
            + (f"; test by query {per_query}%" if per_query else "")
        )
    if summary.get("lr_sweep"):
        lines += [
            "",
            "## Learning-rate sweep",
            "",
            f"Each model and kv trained once per rate (seed {s['seeds'][0]}), scored on training sequences held "
            "out of its training (not the test set); its seeds then train at the best rate.",
            "",
        ]
        lines += lr_sweep.markdown(summary["lr_sweep"], "accuracy on held-out training sequences, higher is better")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Test accuracy against kv (log 2 axis), one line per model, the anchor values as crosses."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["models"].items():
        kvs = sorted(int(k) for k in m["cells"])
        if not kvs:
            continue
        cells = [m["cells"][str(k)] for k in kvs]
        line = ax.errorbar(
            kvs,
            [100 * c["acc_mean"] for c in cells],
            yerr=[100 * c["acc_std"] for c in cells],
            marker="o",
            capsize=3,
            label=name,
        )
        anchors = [(k, c["anchor_acc"]) for k, c in zip(kvs, cells) if c["anchor_acc"] is not None]
        if anchors:
            ax.scatter(
                [a[0] for a in anchors],
                [a[1] for a in anchors],
                marker="x",
                color=line[0].get_color(),
                label=f"{name} (study)",
            )
    ax.axhline(100 * summary["chance"], color="gray", linestyle="--", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("key-value pairs (kv)")
    ax.set_ylabel("test accuracy on queries (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
