"""The Zoology MQAR protocol's report (docs/mqar.md section 10.5), from
:func:`drmlab.experiments.mqar.zoology.summarize`'s numbers:

* ``zoology.md`` -- per length, model x width: the best rate's final test accuracy and that rate
  (Zoology's Figure-2 value), ``n/a (reason)`` where the model cannot hold the setting; then each
  rate's accuracy, epochs and wall time per run;
* ``frontier.png`` -- Zoology's state-size frontier: each cell's accuracy against the bytes of one
  sequence's decoding state at that length, one panel per length (log scale);
* ``curves.png`` -- the test accuracy after each epoch of the runs trained past the probe, one panel per
  length and width (where a rate plateaus and when it jumps: what a probe of two epochs sees);
* ``zoology.json`` -- the whole summary; ``results.json`` -- the same with its title and provenance,
  the file to commit (docs/studies/README.md); its ``finished`` runs, settings included, are what
  ``--restore`` puts back to continue the study elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.plotting import draw_or_log, pyplot

TITLE = (
    "MQAR under the Zoology protocol (Arora et al. 2024) on the CPU: best-rate test accuracy per model, width, length"
)
ZOOLOGY_EPOCHS = 64  # Zoology's Figure 2: every rate trains 64 epochs (early stop above 0.99)


def at_cpu_budget(recipe: dict) -> bool:
    """Whether the study ran fewer epochs than Zoology's, or chose its rates by a probe: its numbers are
    then "at CPU budget", and every place that shows one says so."""
    return recipe["epochs"] < ZOOLOGY_EPOCHS or recipe.get("probe_epochs") is not None


def protocol_name(recipe: dict) -> str:
    return "Zoology protocol at CPU budget" if at_cpu_budget(recipe) else "Zoology protocol"


def write_report(summary: dict, out: str | Path, log: Callable[[str], None] | None = None) -> None:
    from drmlab.experiments import results

    out = Path(out)
    (out / "zoology.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = TITLE.replace("Zoology protocol", protocol_name(summary["study"]["recipe"]))
    results.write(
        out / "results.json",
        {"title": title, "provenance": results.provenance(summary["study"]), **summary},
    )
    (out / "zoology.md").write_text(markdown(summary))
    if draw_or_log(lambda: frontier_figure(summary, out / "frontier.png"), log, "frontier.png") and log is not None:
        log(f"wrote {out / 'frontier.png'}")
    if draw_or_log(lambda: curves_figure(summary, out / "curves.png"), log, "curves.png") and log is not None:
        log(f"wrote {out / 'curves.png'}")
    if log is not None:
        log(f"wrote {out / 'zoology.md'} and {out / 'zoology.json'}")


def frontier_points(summary: dict) -> dict[int, dict[str, list[tuple[int, int, float]]]]:
    """{length: {model: [(state bytes, width, accuracy), ...] by width}} of the cells with an accuracy."""
    points: dict = {}
    for c in summary["cells"].values():
        if c.get("acc") is None or c.get("state_bytes") is None:
            continue
        points.setdefault(c["seq_len"], {}).setdefault(c["model"], []).append((c["state_bytes"], c["width"], c["acc"]))
    return {L: {m: sorted(p) for m, p in sorted(models.items())} for L, models in sorted(points.items())}


def frontier_figure(summary: dict, path: Path, metadata: dict | None = None) -> bool:
    """Accuracy against decoding-state bytes per sequence, one panel per length (``metadata``: the PNG's
    text fields); False: nothing to draw."""
    points = frontier_points(summary)
    if not points:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(points), figsize=(4.5 * len(points), 3.6), squeeze=False)
    for ax, (seq_len, models) in zip(axes[0], points.items()):
        for name, rows in models.items():
            ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("decoding state per sequence (bytes)")
        ax.set_title(f"length {seq_len}")
        ax.grid(alpha=0.3)
    recipe = summary["study"]["recipe"]
    chosen = "the rate its probe chose" if recipe.get("probe_epochs") else "best rate"
    axes[0][0].set_ylabel(f"MQAR test accuracy ({chosen})\n{protocol_name(recipe)}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=metadata)
    plt.close(fig)
    return True


def curves(summary: dict) -> dict[tuple[int, int], list[dict]]:
    """{(length, width): [run, ...]} of the runs trained past the probe (a cell's chosen rate, and any rate
    a check trained on), each ``{"model", "lr", "chosen", "epochs": [(epoch, test accuracy), ...]}``; a
    study without the probe: every finished run. Runs stopped at the probe are left out (two points)."""
    probe = summary["study"]["recipe"].get("probe_epochs") or 0
    chosen = {(c["model"], c["width"], c["seq_len"]): c.get("lr") for c in summary["cells"].values()}
    out: dict = {}
    for run in summary["finished"]:
        epochs = [(e["epoch"], e["test_acc"]) for e in run.get("epochs") or []]
        if len(epochs) <= probe:
            continue
        cell = (run["model"], run["width"], run["seq_len"])
        entry = {"model": run["model"], "lr": run["lr"], "chosen": chosen.get(cell) == run["lr"], "epochs": epochs}
        out.setdefault((run["seq_len"], run["width"]), []).append(entry)
    return {k: sorted(v, key=lambda r: (r["model"], not r["chosen"], r["lr"])) for k, v in sorted(out.items())}


def curves_figure(summary: dict, path: Path, metadata: dict | None = None) -> bool:
    """Test accuracy after each epoch of the runs trained past the probe (:func:`curves`), one panel per
    (length, width): the cell's chosen rate solid, a rate trained on as a check dashed (each of a model's
    checks its own dashes; in a study without the probe, the sweep's other rates); the early stop and the
    level of a guess among the values in context (1 / pairs) dotted, the probe's last epoch a thin vertical
    line. False: nothing to draw."""
    panels = curves(summary)
    if not panels:
        return False
    recipe = summary["study"]["recipe"]
    pairs = dict((L, kv) for L, kv in summary["study"]["settings"])
    models = sorted({r["model"] for runs in panels.values() for r in runs})
    colour = {m: f"C{i}" for i, m in enumerate(models)}
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.8), squeeze=False, sharey=True)
    checks = ("--", "-.", ":")  # one model's checks told apart by their dashes
    other = " (check)" if recipe.get("probe_epochs") else " (other rate)"  # without the probe: the whole sweep
    for ax, ((seq_len, width), runs) in zip(axes[0], panels.items()):
        seen: dict[str, int] = {}
        for r in runs:
            label = f"{r['model']} lr {r['lr']:.3g}" + ("" if r["chosen"] else other)
            if r["chosen"]:
                style = "-"
            else:
                style = checks[seen.get(r["model"], 0) % len(checks)]
                seen[r["model"]] = seen.get(r["model"], 0) + 1
            xs, ys = zip(*r["epochs"])
            ax.plot(xs, ys, style, marker=".", color=colour[r["model"]], label=label)
        ax.axhline(recipe["early_stop"], color="grey", linestyle=":", linewidth=1)
        if seq_len in pairs:
            ax.axhline(1 / pairs[seq_len], color="grey", linestyle=":", linewidth=1)
        if recipe.get("probe_epochs"):
            ax.axvline(recipe["probe_epochs"], color="grey", linewidth=0.8, alpha=0.5)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("epoch")
        ax.set_title(f"length {seq_len}, width {width}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    axes[0][0].set_ylabel(f"MQAR test accuracy\n{protocol_name(recipe)}")
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=metadata)
    plt.close(fig)
    return True


def without_accuracy(c: dict, n_rates: int) -> str:
    """What a cell with no final accuracy holds: no finished rate, its rates diverged, or -- in a probed
    study still running -- how far its probe has come or the rate it chose, training on."""
    scores = c.get("scores") or {}
    if not scores:
        return f"no finished rate (0 of {n_rates})"
    if c.get("status") == "done" or all(v is None for v in scores.values()):
        return "diverged" if len(scores) == n_rates else f"diverged; {len(scores)} of {n_rates} rates"
    if len(scores) < n_rates:  # some rates have finished their probe
        return f"probing: {len(scores)} of {n_rates} rates"
    return f"probed, lr {c['lr']:.3g} training on"  # the chosen rate has not finished its epochs


def cell(c: dict | None, n_rates: int) -> str:
    if c is None:
        return "--"
    if c["status"] == "n/a":
        return f"n/a ({c['why']})"
    if c.get("acc") is None:
        return without_accuracy(c, n_rates)
    epochs = f", {c['epochs']} ep" if c.get("epochs") is not None else ""
    text = f"{100 * c['acc']:.1f}% (lr {c['lr']:.3g}{epochs}{', edge' if c.get('edge') else ''})"
    return text if c["status"] == "done" else text + " [sweep incomplete]"


def _number(value, fmt: str) -> str:
    return "--" if value is None else format(value, fmt)


def probe_section(summary: dict) -> list[str]:
    """The probe, rate by rate, of each cell whose rates have all ended it (a study without the probe, or
    with no such cell: nothing): each rate's test accuracy, test queries' cross-entropy and last batch's
    training loss at the probe's end, and the rate each of the three would choose."""
    cells = [c for c in summary["cells"].values() if c.get("probe")]
    if not cells:
        return []
    grid = summary["study"]["lr_grid"]
    labels = [lr_sweep.lr_label(lr) for lr in grid]

    def rate(value) -> str:
        return "--" if value is None else f"{value:.3g}"

    lines = [
        "## The probe, rate by rate",
        "",
        f"Each rate at the probe's end (epoch {summary['study']['recipe']['probe_epochs']}): test accuracy / mean "
        "cross-entropy of the test queries (nats; -- where the run did not record it) / loss of its last "
        "training batch. The cell's rate is the one the accuracy chose; the rates the two losses would choose "
        "are a diagnostic of the probe's rule, not the protocol.",
        "",
        "| cell | " + " | ".join(f"lr {lr:.3g}" for lr in grid) + " | by accuracy | by test CE | by last batch |",
        "|---|" + "---|" * len(labels) + "---|---|---|",
    ]
    for c in cells:
        row = []
        for label in labels:
            r = c["probe"]["rates"].get(label)
            if r is None or r["acc"] is None:
                row.append("diverged" if r is not None else "--")
                continue
            row.append(f"{100 * r['acc']:.2f}% / {_number(r['test_ce'], '.3f')} / {_number(r['train_loss'], '.3f')}")
        by = [rate(c.get("lr")), rate(c["probe"]["by_test_ce"]), rate(c["probe"]["by_train_loss"])]
        lines.append(f"| {c['model']} w{c['width']} L{c['seq_len']} | " + " | ".join(row + by) + " |")
    return lines + [""]


def markdown(summary: dict) -> str:
    s = summary["study"]
    r = s["recipe"]
    probe = r.get("probe_epochs")
    lines = [
        f"# MQAR, the {protocol_name(r)}",
        "",
        f"Vocabulary {r['vocab_size']:,}, {r['n_train']:,} training / {r['n_test']:,} test examples, power law "
        f"a = {r['power_a']}; at most {r['epochs']} epochs (Zoology's: {ZOOLOGY_EPOCHS}), early stop above "
        f"{r['early_stop']} test accuracy; "
        + (
            f"each rate probed for its first {probe} epochs (the cosine over all {r['epochs']}), only the best "
            "one by test accuracy trained on; "
            if probe is not None
            else ""
        )
        + f"AdamW, weight decay {r['weight_decay']}, cosine to 0; rates "
        + ", ".join(lr_sweep.lr_label(x) for x in s["lr_grid"])
        + f"; preset {s['preset']}; seed {r['seed']}, "
        f"data seed {r['data_seed']}.",
        (
            f"Each cell ({protocol_name(r)}): the final test accuracy (query positions only) of the best rate "
            "and the epochs it trained, as Zoology's Figure 2 reports it (docs/mqar.md section 10); Zoology's "
            "attention scores about 0.97-0.99 in every cell of its figure (section 10.7)."
        ),
        "",
    ]
    widths = s["widths"]
    for seq_len, kv in s["settings"]:
        lines += [
            f"## Length {seq_len}, {kv} pairs",
            "",
            "| model | " + " | ".join(f"width {w}" for w in widths) + " |",
            "|---|" + "---|" * len(widths),
        ]
        for name in s["models"]:
            row = [cell(summary["cells"].get(f"{name} w{w} L{seq_len}"), len(s["lr_grid"])) for w in widths]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines += [
            "",
            f"Decoding state of one sequence after {seq_len} tokens (bytes; the frontier's x axis):",
            "",
            "| model | " + " | ".join(f"width {w}" for w in widths) + " |",
            "|---|" + "---:|" * len(widths),
        ]
        for name in s["models"]:
            cells = [summary["cells"].get(f"{name} w{w} L{seq_len}") or {} for w in widths]
            row = ["--" if c.get("state_bytes") is None else f"{c['state_bytes']:,}" for c in cells]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines.append("")
    lines += probe_section(summary)
    lines += [
        "## Runs",
        "",
        "| run | status | test acc | epochs | early stop | params | s/step | wall s |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for run in summary["runs"]:
        if run["status"] == "n/a":
            continue
        acc = "--" if run.get("test_acc") is None else f"{100 * run['test_acc']:.2f}%"
        sps = "--" if run.get("seconds_per_step") is None else f"{run['seconds_per_step']:.3f}"
        wall = "--" if run.get("wall_seconds") is None else f"{run['wall_seconds']:.0f}"
        lines.append(
            f"| {run['model']} w{run['width']} L{run['seq_len']} lr {lr_sweep.lr_label(run['lr'])} | "
            f"{run['status']}{' (training on)' if run.get('going_on') else ''} | {acc} | {run.get('epochs_run', '--')} | "
            f"{'yes' if run.get('early_stopped') else 'no'} | {run.get('params', '--')} | {sps} | {wall} |"
        )
    return "\n".join(lines) + "\n"
