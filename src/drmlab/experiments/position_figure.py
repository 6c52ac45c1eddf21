"""The figures of loss by position (the buckets of :mod:`drmlab.evaluation.positions`): ``drmlab eval
--by-position``'s for one run (cross-entropy against position, log x axis, the 95% band shaded, the training
window marked and the positions a model cannot read shaded grey), and several runs' curves in one figure
(the long-context study's, drawn by ``tools/readme.py``)."""

from __future__ import annotations

import math
from pathlib import Path

from drmlab.experiments.plotting import pyplot


def plot_buckets(ax, rows: list[dict], *, color: str, label: str, band_alpha: float, band_label=None, **line) -> None:
    """One curve of buckets with a number (``lo``, ``hi``, ``ce``, the band's ``low`` and ``high``) on ``ax``:
    a bucket [lo, hi) of positions has read lo + 1 .. hi inputs, drawn at their geometric middle; the band
    shaded where the bucket has one. ``line``: further keywords of the line."""
    x = [math.sqrt((r["lo"] + 1) * r["hi"]) for r in rows]
    ax.plot(x, [r["ce"] for r in rows], marker="o", color=color, label=label, **line)
    banded = [(xi, r) for xi, r in zip(x, rows) if r.get("low") is not None and r.get("high") is not None]
    if banded:
        ax.fill_between(
            [xi for xi, _ in banded],
            [r["low"] for _, r in banded],
            [r["high"] for _, r in banded],
            color=color,
            alpha=band_alpha,
            linewidth=0,
            label=band_label,
        )


def draw_by_position(report: dict, path: Path, title: str | None = None) -> bool:
    """Draw the report's buckets to ``path`` (PNG); False when no bucket has a number."""
    rows = [r for r in report.get("buckets", []) if isinstance(r.get("ce"), float)]
    if not rows:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    plot_buckets(ax, rows, color="C0", label="CE per bucket", band_alpha=0.2, band_label="95% band (over windows)")
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


def draw_models_by_position(inputs: dict, path: Path, metadata: dict | None = None) -> bool:
    """Several runs' loss by position in one figure: ``inputs["curves"]`` maps a model to its buckets with a
    number, ``train_seq_len`` is the training window (dashed), ``seq_len`` the scored window and ``seed`` the
    runs' seed (the title); one line per model, its 95% band lightly shaded, log2 x axis. ``metadata`` goes
    into the PNG's text chunks. False when no model has a bucket to draw."""
    curves = {model: rows for model, rows in inputs["curves"].items() if rows}
    if not curves:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    for i, (model, rows) in enumerate(curves.items()):
        plot_buckets(ax, rows, color=f"C{i % 10}", label=model, band_alpha=0.12, markersize=3, linewidth=1.2)
    window = inputs["train_seq_len"]
    ax.axvline(window, color="grey", linestyle="--", linewidth=1, label=f"training window ({window:,})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens read (position + 1)")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(
        f"Loss by position at tiny: {inputs['seq_len']:,}-token windows, each from a fresh state\n"
        f"(field recipe, seed {inputs['seed']}, trained on {window:,}-token windows; 95% bands over windows)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=metadata)
    plt.close(fig)
    return True
