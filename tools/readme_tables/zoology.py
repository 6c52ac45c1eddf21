"""The Zoology MQAR tables: the protocol on the CPU (``zoology-cpu``, ``zoology-l64``), attention's published
figure first so the protocol is checked against the paper, and the study's cost in one-thread hours before
it runs (``zoology-budget``).
"""

from __future__ import annotations

from .format import markdown_table

# Zoology's Figure 2, attention's line, read from the published image by eye (docs/mqar.md section 10.7)
ZOOLOGY_ATTENTION_FIGURE = "0.97-0.99"


def _zoology_cell(cell: dict | None, n_rates: int) -> str:
    """The best rate's final test accuracy, its rate, the epochs that rate trained and how many of the grid's
    rates have finished; in a probed study still running, how far its probe has come or the rate it chose."""
    if cell is None:
        return "not run"
    if cell.get("status") == "n/a":
        return f"n/a ({cell['why']})"
    if cell.get("acc") is None:
        from drmlab.experiments.mqar.zoology_report import without_accuracy

        return without_accuracy(cell, n_rates)
    scores = cell.get("scores") or {}
    epochs = "" if cell.get("epochs") is None else f", {cell['epochs']} epochs"
    text = f"{100 * cell['acc']:.1f}% (lr {cell['lr']:.3g}{epochs})"
    return text if len(scores) == n_rates else f"{text}; {len(scores)} of {n_rates} rates"


def _zoology_table(studies: dict[str, dict], name: str = "zoology-cpu") -> str:
    """The Zoology MQAR protocol on the CPU (docs/mqar.md section 10): per model, width and length the
    best rate's final test accuracy and the epochs it trained, attention's published value first so the
    protocol is checked against the paper before any other row is read; the header names the protocol as
    the record ran it ("at CPU budget" when it trained fewer epochs than Zoology's)."""
    from drmlab.experiments.mqar.zoology_report import protocol_name

    if name not in studies:
        return markdown_table(["model", "accuracy", "state"], ["---", "---", "---:"], [["not run yet", "-", "-"]])
    study = studies[name]
    settings, widths = study["study"]["settings"], study["study"]["widths"]
    n_rates = len(study["study"]["lr_grid"])
    columns = [(L, w) for L, _ in settings for w in widths]
    rows = [["Zoology Fig. 2, attention (by eye)", *([ZOOLOGY_ATTENTION_FIGURE] * len(columns)), "-"]]
    for model in study["study"]["models"]:
        cells = [study["cells"].get(f"{model} w{w} L{L}") for L, w in columns]
        state = next((c.get("state_bytes") for c in cells if c and c.get("state_bytes")), None)
        rows.append([model, *(_zoology_cell(c, n_rates) for c in cells), "-" if state is None else f"{state:,} B"])
    header = [
        f"model ({protocol_name(study['study']['recipe'])})",
        *(f"L {L}, width {w}" for L, w in columns),
        f"state at L {columns[0][0]}, width {columns[0][1]}",
    ]
    return markdown_table(header, ["---"] + ["---"] * len(columns) + ["---:"], rows)


def _zoology_budget_table(studies: dict[str, dict]) -> str:
    """The Zoology study at CPU budget, costed before it runs (benchmarks/zoology_budget.py): per model and
    (length, width) the one-thread hours of the probe and the chosen rate's run, the faster of float32 and
    bf16 autocast, no early stop; the last row adds each column up."""
    rows_in = studies["zoology-budget"]["rows"]
    columns = list(dict.fromkeys((r["seq_len"], r["width"]) for r in rows_in))

    def hours(r: dict) -> float:
        return min(r[k]["probe_h"] + r[k]["rest_h"] for k in ("float32", "bf16") if k in r)

    rows = []
    for name in dict.fromkeys(r["model"] for r in rows_in):
        mine = {(r["seq_len"], r["width"]): r for r in rows_in if r["model"] == name}
        cells = []
        for col in columns:
            r = mine.get(col)
            cells.append("-" if r is None else ("n/a" if "na" in r else f"{hours(r):.1f} h ({r['params']:,})"))
        rows.append([name, *cells])
    totals = [sum(hours(r) for r in rows_in if (r["seq_len"], r["width"]) == col and "na" not in r) for col in columns]
    rows.append(["all models", *(f"**{t:.1f} h**" for t in totals)])
    header = ["model", *(f"L {L}, width {w}: hours (params)" for L, w in columns)]
    return markdown_table(header, ["---"] + ["---:"] * len(columns), rows)
