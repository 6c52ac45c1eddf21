"""The loop study's own report (docs/looped.md section 4), beside the ablation's: ``loop.md``, one
row per arm (stored blocks L, loops N, schedule, eps rule, mixer, validation CE mean and population
std over seeds), and ``loss_vs_n.png``, validation CE against N with one line for the scaled arms
(eps = 1/N) and one for the unscaled (eps = 1).

With the loop count at evaluation (docs/looped.md section 4.1): its table -- per arm and eps mode
(frozen at the trained value, or re-set to 1/N') the validation CE at every N' -- in ``loop.md``, in
``results.md`` and ``results.json`` (:func:`add_to_results`), and ``eval_loops.png`` (CE against N',
one colour per arm, solid for eps frozen, dashed for eps = 1/N', a star at the trained N).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from drmlab.experiments.plotting import draw_or_log, pyplot


def write_report(
    results: dict,
    settings: dict[str, dict],
    out: str | Path,
    log: Callable[[str], None] | None = None,
    loop_eval: dict | None = None,
) -> str:
    """Write loop.md and loss_vs_n.png for the ablation ``results`` of the arms, whose
    :func:`~drmlab.experiments.loop.study.arm_settings` are ``settings``; return the table. With
    ``loop_eval`` (:func:`~drmlab.experiments.loop.study.evaluate_loop_counts`) also its table and
    ``eval_loops.png``."""
    out = Path(out)
    text = table(results, settings)
    if loop_eval is not None:
        text += "\n" + eval_loops_markdown(loop_eval)
    (out / "loop.md").write_text(text)
    if results.get("models"):  # nothing to draw before the first paired run (a sweep-only study)
        draw_or_log(lambda: plot_loss_vs_n(results, settings, out / "loss_vs_n.png"), log, "loss_vs_n.png")
    if loop_eval is not None:
        draw_or_log(lambda: plot_eval_loops(loop_eval, out / "eval_loops.png"), log, "eval_loops.png")
    return text


def add_to_results(results: dict, out: str | Path) -> None:
    """Put ``results["eval_loops"]`` into the ablation's results.json and append its table to results.md
    (both were just rewritten by :func:`drmlab.experiments.ablate.protocol.write_results`)."""
    from drmlab.experiments.results import write

    out = Path(out)
    write(out / "results.json", results)
    markdown = (out / "results.md").read_text() if (out / "results.md").is_file() else ""
    (out / "results.md").write_text(markdown.rstrip("\n") + "\n\n" + eval_loops_markdown(results["eval_loops"]))


EPS_MODE_WORDS = {"frozen": "frozen (trained)", "1/N'": "re-set to 1/N'"}


def eval_loops_markdown(loop_eval: dict) -> str:
    """The loop-count-at-evaluation table: one row per arm and eps mode, one column per N'."""
    counts = loop_eval["loop_counts"]
    lines = [
        "## Loop count at evaluation",
        "",
        "Each trained looped arm rescored on the same validation tokens with its stored blocks applied N' "
        "times instead of the trained N, eps frozen at its trained value or re-set to 1/N' (no retraining). "
        "Validation CE in nats/token, mean +- population std over seeds; `trained` is the run's own "
        "evaluation at (N, eps).",
        "",
        "| arm | N | trained eps | eps at N' | trained | " + " | ".join(f"N'={n}" for n in counts) + " |",
        "|---|---:|---:|---|---:|" + "---:|" * len(counts),
    ]
    for arm, entry in loop_eval["arms"].items():
        if not entry["applicable"]:
            lines.append(
                f"| {arm} | {entry['n_loop']} | {entry['eps']} | not applicable ({entry['reason']}) | | "
                + " | ".join("--" for _ in counts)
                + " |"
            )
            continue
        trained = f"{entry['trained_ce_mean']:.4f} +- {entry['trained_ce_std']:.4f}"
        for mode in loop_eval["eps_modes"]:
            cells = {c["n_loop"]: c for c in entry["cells"] if c["eps_mode"] == mode}
            values = " | ".join(_cell_text(cells[n]) for n in counts)
            lines.append(
                f"| {arm} | {entry['n_loop']} | {entry['eps_trained']:.4g} | {EPS_MODE_WORDS[mode]} | "
                f"{trained} | {values} |"
            )
    return "\n".join(lines) + "\n"


def _cell_text(cell: dict) -> str:
    return f"{cell['ce_mean']:.4f} +- {cell['ce_std']:.4f}"


def plot_eval_loops(loop_eval: dict, path: Path) -> bool:
    arms = {arm: entry for arm, entry in loop_eval["arms"].items() if entry["applicable"]}
    if not arms:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for index, (arm, entry) in enumerate(arms.items()):
        colour = f"C{index % 10}"
        for mode, style in zip(loop_eval["eps_modes"], ("-", "--")):
            cells = sorted((c["n_loop"], c["ce_mean"]) for c in entry["cells"] if c["eps_mode"] == mode)
            ax.plot(
                [n for n, _ in cells],
                [ce for _, ce in cells],
                style,
                color=colour,
                marker="o",
                markersize=3,
                label=f"{arm}, eps {EPS_MODE_WORDS[mode]}",
            )
        ax.plot([entry["n_loop"]], [entry["trained_ce_mean"]], "*", color=colour, markersize=10)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N' (loops at evaluation; star: trained N)")
    ax.set_ylabel("validation CE (nats/token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def table(results: dict, settings: dict[str, dict]) -> str:
    rows = [
        "| arm | L stored | N loops | schedule | eps | mixer | val CE mean | std | seeds |",
        "|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for arm, stats in results.get("models", {}).items():
        s = settings[arm]
        rows.append(
            f"| {arm} | {s['n_stored']} | {s['n_loop']} | {s['schedule']} | {s['eps']} | {s['mixer']} | "
            f"{stats['ce_mean']:.4f} | {stats['ce_std']:.4f} | {stats['n_seeds']} |"
        )
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
