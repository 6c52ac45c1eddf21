"""The figure of ``drmlab eval --by-position``: cross-entropy against position, log x axis, the 95% band
shaded, the training window marked and the positions a model cannot read shaded grey (the report's
buckets, :mod:`drmlab.evaluation.positions`)."""

from __future__ import annotations

import math
from pathlib import Path

from drmlab.experiments.plotting import pyplot


def draw_by_position(report: dict, path: Path, title: str | None = None) -> bool:
    """Draw the report's buckets to ``path`` (PNG); False when no bucket has a number."""
    rows = [r for r in report.get("buckets", []) if isinstance(r.get("ce"), float)]
    if not rows:
        return False
    plt = pyplot()
    # a bucket [lo, hi) of positions has read lo + 1 .. hi inputs: drawn at their geometric middle
    x = [math.sqrt((r["lo"] + 1) * r["hi"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, [r["ce"] for r in rows], marker="o", color="C0", label="CE per bucket")
    banded = [(xi, r) for xi, r in zip(x, rows) if r.get("low") is not None]
    if banded:
        ax.fill_between(
            [xi for xi, _ in banded],
            [r["low"] for _, r in banded],
            [r["high"] for _, r in banded],
            color="C0",
            alpha=0.2,
            label="95% band (over windows)",
        )
    window = report.get("train_seq_len")
    if window:
        ax.axvline(window, color="C3", linestyle="--", label=f"training window ({window})")
    limit = report.get("position_limit")
    if limit:
        ax.axvspan(
            limit, max(limit + 1, report.get("seq_len") or limit + 1), color="0.85", label="n/a: beyond its positions"
        )
    ax.set_xscale("log")
    ax.set_xlabel("tokens read (position + 1)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or "loss by position")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
