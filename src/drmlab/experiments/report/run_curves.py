"""The curves of a run's page (``drmlab report``): the training curves of metrics.jsonl (training loss
beside the sampled validation CE, learning rate, gradient norm, tokens/s; resumes marked) and the DRM
geometry diagnostics of each sampled evaluation (``docs/drm.md`` sections 2, 4 and 14), as PNG bytes."""

from __future__ import annotations

import math

from drmlab.experiments.report import html as h

# Diagnostics panels of a run: (title, the row keys drawn in it).
DIAGNOSTIC_PANELS = (
    ("dimD (active directions)", ("dimD_mean",)),
    ("gate quantiles", ("gate_q10", "gate_q50", "gate_q90")),
    ("metric energy v^T G v", ("metric_energy_mean",)),
    ("action", ("action", "action_euclidean")),
    ("metric condition number", ("metric_condition_number",)),
    ("state norm", ("state_norm_mean",)),
)


def _steps(rows: list[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    points = [
        (r["step"], r[key]) for r in rows if r.get("kind") == kind and h.is_number(r.get(key)) and math.isfinite(r[key])
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _resume_steps(rows: list[dict]) -> list[int]:
    return [r["step"] for r in rows if r.get("kind") == "resume"]


def _run_curves(rows: list[dict]) -> bytes | None:
    from matplotlib.ticker import MaxNLocator

    from drmlab.experiments.plotting import pyplot

    if not any(r.get("kind") in ("train", "eval") for r in rows):
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0, 0]
    x, y = _steps(rows, "train", "loss")
    ax.plot(x, y, lw=0.8, color="C0", label="training loss")
    x, y = _steps(rows, "train", "ce")
    if y and y != _steps(rows, "train", "loss")[1]:
        ax.plot(x, y, lw=0.8, color="C2", alpha=0.7, label="training CE (without auxiliary losses)")
    x, y = _steps(rows, "eval", "val_ce")
    ax.plot(x, y, "o-", color="C1", ms=4, label="sampled validation CE")
    ax.set_ylabel("nats/token")
    ax.legend(fontsize=8)
    for ax, key, label in (
        (axes[0, 1], "lr", "learning rate"),
        (axes[1, 0], "grad_norm", "gradient norm (before clipping)"),
        (axes[1, 1], "tok_s", "tokens/s"),
    ):
        x, y = _steps(rows, "train", key)
        ax.plot(x, y, lw=0.8, color="C0")
        ax.set_ylabel(label)
        if key == "grad_norm" and y and min(y) > 0 and max(y) > 10 * min(y):
            ax.set_yscale("log")
    for ax in axes.flat:
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        for step in _resume_steps(rows):
            ax.axvline(step, color="gray", ls=":", lw=1)
    fig.tight_layout()
    return h.figure_bytes(fig)


def _diagnostic_curves(rows: list[dict]) -> bytes | None:
    from matplotlib.ticker import MaxNLocator

    from drmlab.experiments.plotting import pyplot

    evals = [r for r in rows if r.get("kind") == "eval" and isinstance(r.get("diagnostics"), dict)]
    panels = [
        (title, [k for k in keys if any(h.is_number(r["diagnostics"].get(k)) for r in evals)])
        for title, keys in DIAGNOSTIC_PANELS
    ]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        return None
    plt = pyplot()
    columns = min(3, len(panels))
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.8 * columns, 2.9 * lines), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for i, key in enumerate(keys):
            points = [(r["step"], r["diagnostics"][key]) for r in evals if h.is_number(r["diagnostics"].get(key))]
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, color=f"C{i}", label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return h.figure_bytes(fig)
