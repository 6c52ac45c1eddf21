"""Learning-rate sweeps for the study protocols (docs/drm.md section A.7.1): each model at its own rate.

A study given a grid (``--lr-grid 5e-4,1e-3,2e-3,4e-3``) first trains every model once per grid rate
on one seed, scores each on a *tuning split* that is not the reported validation split (the language
studies: a held-out slice at the end of the training split, :func:`tuning_split`; MQAR: held-out
training sequences), picks each model's best rate and only then runs its paired seeds at that rate.
The whole sweep is recorded; a choice at either end of the grid is flagged, since the optimum may
lie outside it. A rate whose run diverged (or stopped on a non-finite loss) scores as missing; a
model whose every rate diverged gets no rate and no paired runs.

This module holds what the protocols share: parsing and checking a grid, the choice with its edge
flag, the markdown table and the sweep plot.
"""

from __future__ import annotations

import math
from pathlib import Path

# The held-out slice of the training split that scores the language studies' sweeps: at most this
# many tokens, and at most a tenth of the split.
TUNING_TOKENS = 524_288
TUNING_FRACTION = 0.1


def parse_lr_grid(grid) -> list[float]:
    """``"5e-4,1e-3"`` or a list of numbers -> the sorted rates; at least two distinct, each finite and > 0."""
    if isinstance(grid, str):
        parts = [p.strip() for p in grid.split(",") if p.strip()]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"lr grid {grid!r}: give comma-separated numbers, e.g. 5e-4,1e-3,2e-3,4e-3") from None
    else:
        values = list(grid)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise ValueError(f"lr grid {values!r}: give numbers")
        values = [float(v) for v in values]
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"lr grid {grid!r}: every rate must be a finite number above 0")
    if len(set(values)) != len(values):
        raise ValueError(f"lr grid {grid!r} lists a rate twice")
    if len(values) < 2:
        raise ValueError(f"lr grid {grid!r}: a sweep needs at least two rates")
    return sorted(values)


def lr_label(lr: float) -> str:
    """A rate as a folder-name component and a JSON key (``0.0005`` -> ``0.0005``), exact: it parses
    back to the same float."""
    short = f"{lr:g}"
    return short if float(short) == lr else repr(lr)


def tuning_split(train_tokens, tokens: int = TUNING_TOKENS, fraction: float = TUNING_FRACTION):
    """(the tokens a sweep trains on, the held-out slice that scores it): the last
    ``min(tokens, fraction * len)`` tokens of the training split are held out."""
    n = min(int(tokens), int(len(train_tokens) * fraction))
    if n < 2:
        raise ValueError(f"the training split ({len(train_tokens):,} tokens) is too small to hold out a tuning slice")
    return train_tokens[:-n], train_tokens[-n:]


def choose(scores: dict[float, float | None], lower_is_better: bool = True) -> dict:
    """The best rate of one model's sweep.

    ``scores``: rate -> score (None for a run that diverged). Returns ``{"lr": best or None,
    "edge": whether the best is the smallest or largest rate of the grid, "edge_side": "low" |
    "high" | None, "diverged": [rates]}``. Ties go to the smaller rate.
    """
    grid = sorted(scores)
    finite = {lr: s for lr, s in scores.items() if s is not None and math.isfinite(s)}
    diverged = [lr for lr in grid if lr not in finite]
    if not finite:
        return {"lr": None, "edge": False, "edge_side": None, "diverged": diverged}
    best = min(finite, key=lambda lr: ((finite[lr] if lower_is_better else -finite[lr]), lr))
    side = "low" if best == grid[0] else "high" if best == grid[-1] else None
    return {"lr": best, "edge": side is not None, "edge_side": side, "diverged": diverged}


def markdown(sweeps: dict[str, dict], score_name: str) -> list[str]:
    """The sweep table: one row per model, one column per rate, the choice in bold, edge flags."""
    grid = sorted({float(lr) for s in sweeps.values() for lr in s["scores"]})
    lines = [
        "| model | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | chosen |",
        "|---|" + "---:|" * len(grid) + "---|",
    ]
    for model, s in sweeps.items():
        scores = {float(lr): v for lr, v in s["scores"].items()}
        cells = []
        for lr in grid:
            if lr not in scores:
                cells.append("")
            elif scores[lr] is None:
                cells.append("diverged" if lr in s.get("diverged", []) else "pending")
            else:
                text = f"{scores[lr]:.4f}"
                cells.append(f"**{text}**" if lr == s.get("lr") else text)
        if s.get("lr") is None:
            chosen = "none (every rate diverged)" if s.get("complete") else "pending"
        else:
            chosen = f"{s['lr']:g}" + (
                f" (edge of the grid: the best may be {'lower' if s['edge_side'] == 'low' else 'higher'})"
                if s["edge"]
                else ""
            )
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {chosen} |")
    lines += [
        "",
        f"Scores: {score_name}. A choice at the edge of the grid is flagged: the best rate may lie beyond it.",
    ]
    return lines


def plot(sweeps: dict[str, dict], path: Path, ylabel: str) -> bool:
    """``path``: score against learning rate (log axis) per model, the chosen rate circled."""
    from drmlab.experiments.plotting import pyplot

    rows = {m: sorted((float(lr), v) for lr, v in s["scores"].items() if v is not None) for m, s in sweeps.items()}
    if not any(rows.values()):
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (model, points) in enumerate(rows.items()):
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], "-o", color=f"C{i}", label=model, ms=4)
        best = sweeps[model].get("lr")
        if best is not None:
            ax.plot([best], [dict(points)[best]], "o", ms=11, mfc="none", color=f"C{i}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
