"""The loop proofs' figure: per proof, its plotted arms against N on log-log axes, one panel each."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from drmlab.experiments.loop.proofs.common import ProofResult
from drmlab.experiments.plotting import pyplot


def plot_results(results: list[ProofResult], path) -> Path:
    """One PNG: per proof, its plotted arms against N on log-log axes (one line per arm)."""
    plt = pyplot()
    path = Path(path)
    k = len(results)
    ncols = min(k, 3)
    nrows = -(-k // ncols)
    fig = plt.figure(figsize=(5.0 * ncols, 4.0 * nrows))
    for j, res in enumerate(results):
        ax = fig.add_subplot(nrows, ncols, j + 1)
        for key in res.plot_keys:
            pts = [(r["n"], r[key]) for r in res.rows if r.get(key) is not None and np.isfinite(r[key]) and r[key] > 0]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=key)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (loop count)")
        ax.set_ylabel(res.plot_ylabel)
        ax.set_title(f"Proof {res.proof}: {res.verdict}", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path
