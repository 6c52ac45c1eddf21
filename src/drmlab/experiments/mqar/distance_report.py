"""The distance MQAR study's report (docs/mqar.md section 8), written from
:func:`drmlab.experiments.mqar.distance.summarize`'s numbers:

* ``results.md`` -- per model (or evaluated checkpoint) and length: accuracy with its Wilson 95%
  interval, "n/a (context N)" or "not read"; the gate verdicts; the control accuracy at each training
  milestone; how each length was read (parallel or prefill + steps), the decoding state's bytes per
  sequence, tokens/s;
  the recall controls (section 8.1) and the first-query accuracy beside the all-query one, per length,
  with their no-binding levels and verdicts;
* ``results.json`` -- the whole summary, with each trained run's downsampled curves;
* ``results.png`` -- accuracy against length (log axis) with the intervals, chance and the 80% gate,
  drawn when matplotlib can (:mod:`drmlab.experiments.plotting`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from drmlab.experiments.plotting import draw_or_log, pyplot


def write_report(summary: dict, out: str | Path, log: Callable[[str], None] | None = None) -> None:
    """Write results.json, results.md and results.png of ``summary`` into ``out``; each trained entry
    gains the downsampled curves of its run's metrics.jsonl (:func:`add_curves`)."""
    from drmlab.experiments.results import write

    out = Path(out)
    add_curves(summary, out)
    write(out / "results.json", summary)
    (out / "results.md").write_text(markdown(summary))
    draw_or_log(lambda: plot(summary, out / "results.png"), log, "results.png")


def add_curves(summary: dict, out: Path) -> None:
    """Set ``curves`` (:func:`drmlab.experiments.results.curves`) of every trained entry whose run
    directory under ``out/runs`` still has its metrics.jsonl; an entry read from a results file keeps
    the curves it has."""
    from drmlab.experiments.results import curves
    from drmlab.models.registry import spec_path_name
    from drmlab.runs import RunDir

    for entry in summary["entries"]:
        if entry.get("kind") != "trained":
            continue
        run = RunDir(out / "runs" / f"{spec_path_name(entry['model'])}_s{entry['seed']}")
        if run.metrics_path.is_file():
            entry["curves"] = curves(run.read_metrics())


def cell(record: dict | None) -> str:
    """One length's result as the table prints it."""
    if record is None:
        return "--"
    status = record.get("status")
    if status == "n/a":
        return f"n/a (context {record['context']})"
    if status != "read":
        return "not read"
    lo, hi = record["ci95"]
    return f"{100 * record['acc']:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}]"


def pair_cell(record: dict | None) -> str:
    """A read's all-query / first-query accuracies [Wilson 95%] (and, keys shuffled, the share of
    answers that are the value now bound to the queried key), or why it was not read."""
    if record is None:
        return "--"
    if record.get("status") == "n/a" and "why" in record:
        return f"n/a ({record['why']})"
    if record.get("status") != "read" or "first_acc" not in record:
        return cell(record)
    lo, hi = record["first_ci95"]
    text = f"{cell(record)} / {100 * record['first_acc']:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}]"
    if "bound_acc" in record:
        text += f"; bound {100 * record['bound_acc']:.2f}% (binder level {100 * record['binder_level']:.2f}%)"
    return text


def controls_table(summary: dict) -> list[str]:
    """The first-query accuracy beside the all-query one for the plain read and each recall control
    (docs/mqar.md section 8.1), per entry and length, with each control's verdict; [] when no read has it."""
    p = summary["protocol"]
    lengths, controls = p["lengths"], p.get("controls") or []
    entries = [e for e in summary["entries"] if any("first_acc" in r for r in e["lengths"].values())]
    if not entries:
        return []
    levels = p.get("no_binding_levels") or {
        "chance": p["chance"],
        "all_queries": p["elimination_guess"],
        "first_query": p["context_guess"],
    }
    lines = [
        "",
        "Recall controls (docs/mqar.md section 8.1): all-query / first-query accuracy [Wilson 95%]. No-binding "
        f"levels: {100 * levels['all_queries']:.2f}% over all queries (elimination), "
        f"{100 * levels['first_query']:.2f}% on the first query (context guess), chance "
        f"{100 * levels['chance']:.2f}%. A control other than queries_shuffled falls when both lower bounds are "
        "at or below these levels; queries_shuffled keeps when its interval meets the plain read's. Keys "
        "shuffled: 'bound' is the share of answers naming the value the queried key now precedes, 'binder "
        "level' the share of targets equal to it (what a perfect binder scores).",
        "",
        "| model | read | " + " | ".join(f"L={L:,}" for L in lengths) + " | verdict |",
        "|---|---|" + "---|" * len(lengths) + "---|",
    ]
    for e in entries:
        lines.append(
            f"| {e['label']} | plain | " + " | ".join(pair_cell(e["lengths"].get(str(L))) for L in lengths) + " | -- |"
        )
        for c in controls:
            v = (e.get("controls") or {}).get(c) or {"verdict": "not read", "reasons": {}}
            verdict = v["verdict"] + "".join(f"; {L}: {why}" for L, why in v["reasons"].items())
            lines.append(
                f"| {e['label']} | {c} | "
                + " | ".join(pair_cell((e["lengths"].get(str(L), {}).get("controls") or {}).get(c)) for L in lengths)
                + f" | {verdict} |"
            )
    return lines


def _bytes(n) -> str:
    if n is None:
        return "--"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def markdown(summary: dict) -> str:
    p = summary["protocol"]
    lengths = p["lengths"]
    control = p["control_length"]
    threshold = 100 * p["gate_threshold"]
    lines = [
        "# Distance MQAR",
        "",
        f"Vocabulary {p['vocab_size']}: query marker {p['marker']}, keys {p['keys'][0]}-{p['keys'][1]}, values "
        f"{p['values'][0]}-{p['values'][1]}, filler {p['filler'][0]}-{p['filler'][1]}. An example of L tokens holds "
        f"{p['pairs']} key-value pairs, L - {control} filler tokens, then the {p['pairs']} queries (marker, key, value) "
        f"in a random order; accuracy is the argmax over all {p['vocab_size']} logits at the {p['pairs']} query keys "
        f"(chance {100 * p['chance']:.2f}%), over {p['n_eval']:,} sequences x {p['pairs']} = "
        f"{p['n_eval'] * p['pairs']:,} targets per length (evaluation seed {p['eval_seed']}), with Wilson 95% intervals.",
        f"Without binding any key to its value a model reaches {100 * p['context_guess']:.2f}% (a random one of the "
        f"{p['pairs']} values in the context) or {100 * p['elimination_guess']:.2f}% (the same among the values not yet "
        "queried): only accuracy above these levels is recall.",
        (
            f"Training: the {control}-token control, fresh batches of {p['batch_size']}, AdamW lr {p['lr']:g} constant, "
            f"weight decay 0.01, clip 1.0, {p['steps']:,} steps, preset {p['preset']}"
            + (f", width {p['width']}" if p["width"] else "")
            + ", seeds "
            + ", ".join(map(str, p["seeds"]))
            + "."
            if p["models"]
            else "Nothing trained here: the weights are the run directories' (--ckpt)."
        ),
        f"Reads: up to {p['chunk']:,} input tokens in one forward; longer ones prefill {p['chunk']:,} tokens and step "
        "the rest with the decoding state carried (constant memory for a recurrent state).",
        f"Gates: control >= {threshold:.0f}% authorises the long reads; each longer length >= {threshold:.0f}%; the "
        f"decoding state at the longest length read <= {p['state_growth_limit']:g} x the length before it."
        + ("" if p["read_all"] else " Long lengths of a model whose control failed are not read."),
        "",
        "| model | params | "
        + " | ".join(f"L={L:,}" + (" (control)" if L == control else "") for L in lengths)
        + " | gates |",
        "|---|---:|" + "---|" * len(lengths) + "---|",
    ]
    for e in summary["entries"]:
        g = e["gates"]
        verdict = "pass" if g["passed"] else "fail: " + "; ".join(g["reasons"])
        params = f"{e['params']:,}" if e.get("params") else "--"
        lines.append(
            f"| {e['label']} | {params} | "
            + " | ".join(cell(e["lengths"].get(str(L))) for L in lengths)
            + f" | {verdict} |"
        )
    trained = [e for e in summary["entries"] if e.get("milestones")]
    if trained:
        steps = sorted({m["step"] for e in trained for m in e["milestones"]})
        lines += [
            "",
            f"Control accuracy ({control} tokens) at the training milestones:",
            "",
            "| model | " + " | ".join(f"step {s:,}" for s in steps) + " |",
            "|---|" + "---|" * len(steps),
        ]
        for e in trained:
            by_step = {m["step"]: m for m in e["milestones"]}
            lines.append(
                f"| {e['label']} | "
                + " | ".join(cell(dict(by_step[s], status="read")) if s in by_step else "--" for s in steps)
                + " |"
            )
    lines += controls_table(summary)
    lines += ["", "Reads (bytes of decoding state per sequence after the last token; tokens read per second):", ""]
    for e in summary["entries"]:
        parts = []
        for L in lengths:
            r = e["lengths"].get(str(L))
            if r and r.get("status") == "read":
                speed = f", {r['tokens_per_s']:,.0f} tok/s" if r.get("tokens_per_s") else ""
                peak = f", peak CUDA {_bytes(r['peak_cuda_bytes'])}" if r.get("peak_cuda_bytes") else ""
                parts.append(
                    f"L={L:,}: {r['mode']}, state {_bytes(r['state_bytes']) if r['state_bytes'] else '--'}"
                    f"{speed}{peak}, {r['seconds']:.1f} s"
                )
        lines.append(f"* {e['label']}: " + ("; ".join(parts) if parts else "nothing read"))
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> bool:
    """Accuracy against length (log axis), one line per entry with its Wilson intervals; chance and
    the gate as dashed lines. False when nothing was read."""
    entries = [
        (e, sorted(int(L) for L, r in e["lengths"].items() if r.get("status") == "read")) for e in summary["entries"]
    ]
    if not any(lengths for _, lengths in entries):
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for e, lengths in entries:
        if not lengths:
            continue
        recs = [e["lengths"][str(L)] for L in lengths]
        acc = [100 * r["acc"] for r in recs]
        err = [
            [max(0.0, a - 100 * r["ci95"][0]) for a, r in zip(acc, recs)],
            [max(0.0, 100 * r["ci95"][1] - a) for a, r in zip(acc, recs)],
        ]
        ax.errorbar(lengths, acc, yerr=err, marker="o", capsize=3, label=e["label"])
    p = summary["protocol"]
    ax.axhline(100 * p["chance"], color="gray", linestyle="--", label="chance")
    ax.axhline(100 * p["elimination_guess"], color="gray", linestyle="-.", label="elimination (no binding)")
    ax.axhline(100 * p["gate_threshold"], color="black", linestyle=":", label="gate")
    ax.set_xscale("log", base=2)
    ax.set_xticks(p["lengths"], [f"{L // 1024}K" if L >= 4096 and L % 1024 == 0 else str(L) for L in p["lengths"]])
    ax.minorticks_off()
    ax.set_ylim(0, 102)
    ax.set_xlabel("example length L (tokens)")
    ax.set_ylabel("query accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
