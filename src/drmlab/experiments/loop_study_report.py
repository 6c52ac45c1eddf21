"""The loop study's own report (docs/looped.md section 4), beside the ablation's: ``loop.md``, one
row per arm (stored blocks L, loops N, schedule, eps rule, mixer, validation CE mean and population
std over seeds), and ``loss_vs_n.png``, validation CE against N with one line for the scaled arms
(eps = 1/N) and one for the unscaled (eps = 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from drmlab.experiments.plotting import draw_or_log, pyplot


def write_report(results: dict, settings: dict[str, dict], out: str | Path,
                 log: Callable[[str], None] | None = None) -> str:
    """Write loop.md and loss_vs_n.png for the ablation ``results`` of the arms, whose
    :func:`~drmlab.experiments.loop_study.arm_settings` are ``settings``; return the table."""
    out = Path(out)
    text = table(results, settings)
    (out / "loop.md").write_text(text)
    draw_or_log(lambda: plot_loss_vs_n(results, settings, out / "loss_vs_n.png"), log, "loss_vs_n.png")
    return text


def table(results: dict, settings: dict[str, dict]) -> str:
    rows = ["| arm | L stored | N loops | schedule | eps | mixer | val CE mean | std | seeds |",
            "|---|---:|---:|---|---|---|---:|---:|---:|"]
    for arm, stats in results.get("models", {}).items():
        s = settings[arm]
        rows.append(f"| {arm} | {s['n_stored']} | {s['n_loop']} | {s['schedule']} | {s['eps']} | {s['mixer']} | "
                    f"{stats['ce_mean']:.4f} | {stats['ce_std']:.4f} | {stats['n_seeds']} |")
    return "\n".join(rows) + "\n"


def plot_loss_vs_n(results: dict, settings: dict[str, dict], path: Path) -> None:
    points = {True: [], False: []}
    for arm, stats in results.get("models", {}).items():
        points[settings[arm]["scaled"]].append((settings[arm]["n_loop"], stats["ce_mean"], arm))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for scaled, label in ((True, "eps = 1/N (scaled)"), (False, "eps = 1 (unscaled)")):
        pts = sorted(points[scaled])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            for n, ce, arm in pts:
                ax.annotate(arm, (n, ce), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (applications per stored block)")
    ax.set_ylabel("validation CE (nats/token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
