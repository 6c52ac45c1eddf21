"""The distance MQAR tables: recall per read length with its Wilson interval (``distance-tiny``, with the
specialised model's long reads) and upstream's PMCS-64 comparison (``pmcs-tiny``), language CE beside the
distance reads after the interleaved recipe.
"""

from __future__ import annotations

from drmlab.experiments.stats import mean_std

from .format import markdown_table, seed_values


def _distance_cell(cell: dict | None) -> str:
    """One length of the distance protocol: accuracy with its Wilson interval, or why it was not read."""
    if cell is None:
        return "-"
    if cell.get("status") == "n/a":
        return f"n/a (context {cell['context']:,})"
    if cell.get("status") != "read":
        return "not read"
    low, high = cell["ci95"]
    return f"{100 * cell['acc']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def _distance_table(studies: dict[str, dict]) -> str:
    """The distance MQAR protocol at tiny (docs/mqar.md section 8): per model the control and every
    read length, and the decode state carried at the longest read."""
    study = studies["distance-tiny"]
    lengths = study["protocol"]["lengths"]
    special = studies["specialise-tiny"]["long_reads"]
    entries = study["entries"] + [
        {"model": special["label"], "params": special["params"], "lengths": special["lengths"]}
    ]
    rows = []
    for entry in entries:
        cells = [_distance_cell(entry["lengths"].get(str(n))) for n in lengths]
        longest = entry["lengths"].get(str(lengths[-1])) or {}
        state = (
            f"{longest['state_bytes']:,} B" if longest.get("status") == "read" and longest.get("state_bytes") else "-"
        )
        rows.append([entry["model"], f"{entry['params']:,}", *cells, state])
    header = [
        "model",
        "params",
        *(f"L = {n:,}" + (" (control)" if n == 40 else "") for n in lengths),
        f"state at {lengths[-1]:,}",
    ]
    return markdown_table(header, ["---", "---:"] + ["---"] * len(lengths) + ["---:"], rows)


def _mqar_cells(reads: dict[str, dict], lengths: list[int]) -> str:
    """``a / b / c / d`` percentages of the mean accuracy per length over the seeds read."""
    cells = []
    for L in lengths:
        accs = [r[str(L)]["acc"] for r in reads.values() if str(L) in r]
        cells.append("-" if not accs else f"{100 * sum(accs) / len(accs):.1f}")
    return " / ".join(cells)


def _passing(reads: dict[str, dict], longest: int) -> str:
    """``n seeds, k >= 80% at L``: how many seeds were read and how many recall at the longest length."""
    passing = sum(1 for r in reads.values() if str(longest) in r and r[str(longest)]["acc"] >= 0.8)
    return f"{len(reads)} seed{'s' if len(reads) > 1 else ''}, {passing} >= 80% at {longest:,}"


def _pmcs_table(studies: dict[str, dict]) -> str:
    """Upstream's PMCS-64 comparison at preset tiny (docs/variable-rank.md section 11): per arm the
    language CE over paired seeds, the training rate, and the distance reads after the interleaved
    recipe, each beside upstream's figure for its arm."""
    study = studies["pmcs-tiny"]
    lengths, upstream = study["lengths"], study["upstream"]
    rows = []
    for arm in study["arms"]:
        lang, up = arm["language"], upstream.get(arm.get("upstream_arm") or "", {})
        values = seed_values(lang["per_seed"])
        mean, std = mean_std(values)
        reads = {seed: r["reads"] for seed, r in (arm.get("specialised") or {}).items() if r.get("reads")}
        rows.append(
            [
                arm["arm"],
                f"{arm['params']:,}",
                f"{mean:.4f} +- {std:.4f} ({len(values)})",
                f"{lang['tokens_per_s']:,.0f}",
                "-" if not reads else f"{_mqar_cells(reads, lengths)} ({_passing(reads, lengths[-1])})",
                up.get("arm", "-"),
                "-" if "test_ce" not in up else f"{up['test_ce'][0]:.4f} +- {up['test_ce'][1]:.4f}",
                up.get("mqar", "-"),
            ]
        )
    header = [
        "arm",
        "params",
        "val CE, nats/byte (seeds)",
        "train tok/s",
        "MQAR % after the recipe, L " + " / ".join(f"{L:,}" for L in lengths) + " (seeds)",
        "upstream arm",
        "upstream test CE",
        "upstream MQAR %",
    ]
    return markdown_table(header, ["---", "---:", "---:", "---:", "---", "---", "---:", "---"], rows)
