"""The long-context study at tiny (``long-context-tiny``, collected by tools/collect_long_context.py): per
model its standard bits per byte (256-token windows), the same over 4,096-token windows and with the state
carried through each document, what carrying gains, the loss at four buckets of positions and the bucket
where it is lowest.
"""

from __future__ import annotations

from .format import LN2, markdown_table

# the buckets of positions the table prints: the first prediction, early, the end of the training window, far past
POSITION_BUCKETS = ((0, 1), (16, 32), (128, 256), (2048, 4096))


def _bucket_ce(buckets: list[dict], lo: int, hi: int) -> str:
    """A bucket's CE in nats per byte, 3 decimals; "n/a" past a position table; "-" where it is absent."""
    for row in buckets:
        if (row["lo"], row["hi"]) == (lo, hi):
            return f"{row['ce']:.3f}" if isinstance(row["ce"], float) else "n/a"
    return "-"


def _by_position_cell(by_position: dict | None) -> str:
    """Bits per byte over 4,096-token windows; for a model with a position table, of the positions it reads
    (the record has no bits per byte then: its CE over ln 2, the tokenizer being bytes)."""
    if by_position is None:
        return "-"
    limit = by_position["position_limit"]
    bits = by_position["bpb"] if by_position["bpb"] is not None else by_position["ce"] / LN2
    return f"{bits:.4f}" + (f" (first {limit:,} of each)" if limit is not None else "")


def _carried_cell(carried: dict | None) -> str:
    """Bits per byte with the state carried; an attention model's says the windows it was scored in."""
    if carried is None:
        return "-"
    bits = carried["bpb"] if carried["bpb"] is not None else carried["ce"] / LN2
    if carried["context"] == "windows":
        return f"{bits:.4f} (windows of {carried['window']:,})"
    return f"{bits:.4f}"


def _long_context_table(studies: dict[str, dict], name: str = "long-context-tiny") -> str:
    """One row per model evaluated so far, in the study's order: params; bits per byte in the run's
    256-token windows (its summary), in 4,096-token windows (by position) and with the state carried;
    the carried gain (the record's windowed minus carried CE, in bits); the by-position CE at
    :data:`POSITION_BUCKETS`; the lowest by-position bucket. A last row names the models still to come."""
    header = [
        "model",
        "params",
        "bits/byte: 256-token windows",
        "bits/byte: 4,096-token windows",
        "bits/byte: state carried",
        "carrying gains (bits/byte)",
        "CE (nats/byte) at positions " + " / ".join(f"[{lo}, {hi})" for lo, hi in POSITION_BUCKETS),
        "lowest CE: positions, nats/byte",
    ]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---"]
    record = studies.get(name)
    if record is None:
        return markdown_table(header, align, [["not collected yet", *["-"] * (len(header) - 1)]])
    rows = []
    for model, entry in record["models"].items():
        by_position, derived = entry["by_position"], entry["derived"]
        gain, lowest = derived["carried_gain"], derived["lowest"]
        buckets = by_position["buckets"] if by_position is not None else []
        rows.append(
            [
                model,
                f"{entry['params']:,}",
                f"{entry['windowed']['bpb']:.4f}",
                _by_position_cell(by_position),
                _carried_cell(entry["carried"]),
                "-" if gain is None else f"{gain / LN2:+.4f}",
                " / ".join(_bucket_ce(buckets, lo, hi) for lo, hi in POSITION_BUCKETS) if buckets else "-",
                "-" if lowest is None else f"[{lowest['lo']}, {lowest['hi']}): {lowest['ce']:.3f}",
            ]
        )
    missing = [model for model in record["runs"]["models"] if model not in record["models"]]
    if missing:
        rows.append([f"not evaluated yet: {', '.join(missing)}", *["-"] * (len(header) - 1)])
    return markdown_table(header, align, rows)
