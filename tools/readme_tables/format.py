"""The cells and the markdown table every renderer of the package prints with: per-seed values in seed order,
bits per byte from nats, the number formats the pages use, and the table itself (header, alignment row,
rows). Nothing here knows a study.
"""

from __future__ import annotations

import math

from drmlab.experiments.stats import mean_std

LN2 = math.log(2)


def seed_values(per_seed: dict[str, float]) -> list[float]:
    """A record's per-seed values (keyed by the seed as text) in the seeds' order."""
    return [per_seed[s] for s in sorted(per_seed, key=int)]


def bits_per_byte_cells(record: dict) -> tuple[str, str]:
    """("mean +- std", "s1 / s2 / s3") of a record's bits per byte over its seeds (``per_seed``: the
    collect step's CE per seed; ``ce_per_seed`` in a transcribed record)."""
    bpb = [v / LN2 for v in seed_values(record["per_seed"] if "per_seed" in record else record["ce_per_seed"])]
    mean, std = mean_std(bpb)
    return f"{mean:.4f} +- {std:.4f}", " / ".join(f"{v:.4f}" for v in bpb)


def two_places_below_ten(x: float) -> str:
    """Two decimals below 10, one from 10 up: how the benchmark tables print times and ratios."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def scientific(x: float) -> str:
    """A learning rate as the pages write it: 4e-3, 2.5e-4."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def markdown_table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header, the alignment row (``---``, ``---:``) and one line per row, each cell
    as given."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
