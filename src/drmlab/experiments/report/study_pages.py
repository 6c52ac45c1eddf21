"""The pages of study directories (``drmlab report``): an ablation or a loop study -- its own report,
results.md and its figures, redrawn by :mod:`~drmlab.experiments.ablate.report` (and
:mod:`~drmlab.experiments.loop.report`) from the finished runs, the promotion-gate verdicts of
:mod:`drmlab.experiments.stats`, every run, and the study's settings and data provenance -- and an MQAR
study: mqar.md and the accuracy plot of :mod:`~drmlab.experiments.mqar.report`, and the study's settings.
The study reports are written by their own writers into a temporary folder and embedded
(:func:`_written_report`)."""

from __future__ import annotations

import tempfile
from fractions import Fraction
from pathlib import Path

from drmlab.experiments.report import html as h
from drmlab.experiments.report.kinds import NotAReportDirectory
from drmlab.experiments.report.run_page import _provenance

# Figures the study writers draw, in page order, with what each shows.
FIGURE_CAPTIONS = {
    "curves.png": "Sampled validation CE during training (thin: each seed; thick: the mean over seeds)",
    "seeds.png": "Final validation CE per seed and model",
    "lr_sweep.png": "Learning-rate sweep: tuning CE against the rate, the chosen rate circled",
    "loss_vs_n.png": "Validation CE against the loop count N, scaled (eps = 1/N) and unscaled (eps = 1) arms",
    "eval_loops.png": "Validation CE against the loop count at evaluation N' (solid: eps frozen; dashed: eps = 1/N')",
    "mqar.png": "MQAR test accuracy against the number of key-value pairs (crosses: the reference study)",
}


def _study_results(path: Path) -> dict:
    """The study's numbers from its finished runs (:func:`drmlab.experiments.ablate.protocol.collect_results`),
    with what only its results.json holds (e.g. the loop study's ``eval_loops``); or results.json
    alone when the runs are not there (a copied results folder)."""
    from drmlab.experiments.ablate import protocol as ablate
    from drmlab.runs import read_json

    saved = read_json(path / "results.json") if (path / "results.json").is_file() else None
    if (path / "runs").is_dir() or (path / "tuning").is_dir():  # a study still sweeping has no runs/ yet
        results = ablate.collect_results(path)
        if isinstance(saved, dict):
            results.update({k: v for k, v in saved.items() if k not in results})
        return results
    if isinstance(saved, dict) and isinstance(saved.get("study"), dict):
        return saved
    raise NotAReportDirectory(
        f"{path} holds a study record ({ablate.STUDY_FILE}) but neither runs/, tuning/ nor results.json"
    )


def _written_report(write) -> tuple[dict[str, str], dict[str, bytes]]:
    """({name: text} of the .md files, {name: bytes} of the .png files) that ``write(folder)`` writes
    into a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="drmlab-report-") as tmp:
        folder = Path(tmp)
        write(folder)
        texts = {p.name: p.read_text() for p in sorted(folder.glob("*.md"))}
        images = {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}
    return texts, images


def _figures(images: dict[str, bytes]) -> list[str]:
    order = list(FIGURE_CAPTIONS) + sorted(n for n in images if n not in FIGURE_CAPTIONS)
    return [h.png_figure(images[name], FIGURE_CAPTIONS.get(name, name)) for name in order if name in images]


def _not_drawn(names: list[str], images: dict[str, bytes], warnings: list[str]) -> str:
    missing = [n for n in names if n not in images]
    if not missing:
        return ""
    why = "; ".join(warnings) if warnings else "nothing to draw"
    return h.paragraph(f"Not drawn: {', '.join(missing)} ({why}).", "note")


def _gate_verdicts(results: dict) -> str:
    gates = results.get("gate") or []
    if not gates:
        return h.paragraph("No pair of models with runs: no gate to apply.")
    rule = results.get("gate_rule") or {}
    promoted = [g for g in gates if g.get("promoted")]
    intro = (
        f"<p>The promotion gate (docs/drm.md section A.7; rule: at least {h.esc(rule.get('min_seeds', 3))} paired "
        f"seeds, mean gain at least {h.esc(rule.get('min_gain', 0.005))} nats, wins on at least "
        f"{h.esc(_fraction(rule.get('min_win_fraction', 2 / 3)))} of the pairs, candidate "
        f"{h.esc(rule.get('std', 'population'))} std at most {h.esc(rule.get('max_std', 0.03))}): "
        f"{len(promoted)} of {len(gates)} ordered pairs promoted.</p>"
    )
    items = []
    for g in gates:
        if g.get("promoted"):
            items.append(
                f'<li><span class="yes">promoted</span>: {h.esc(g["candidate"])} over {h.esc(g["baseline"])} '
                f"(gain {h.esc(format(g['gain'], '+.4f'))} nats, wins {h.esc(g['wins'])}/{h.esc(g['n'])})</li>"
            )
        else:
            items.append(
                f'<li><span class="no">not promoted</span>: {h.esc(g.get("candidate"))} over '
                f"{h.esc(g.get('baseline'))} ({h.esc('; '.join(g.get('reasons') or []))})</li>"
            )
    return intro + "<ul>" + "".join(items) + "</ul>"


def _fraction(value) -> str:
    """2/3 rather than 0.666667."""
    if not h.is_number(value):
        return h.fmt(value)
    ratio = Fraction(value).limit_denominator(12)
    return f"{ratio.numerator}/{ratio.denominator}" if abs(float(ratio) - value) < 1e-9 else h.fmt(value)


def _first_run_config(path: Path, runs: list[dict], study: dict) -> dict | None:
    """config.json of the study's first run that has one (its data provenance and runtime)."""
    from drmlab.experiments.ablate.protocol import run_dir
    from drmlab.runs import RunDir

    candidates = [(r["model"], r["seed"]) for r in runs] + [
        (m, s) for m in study.get("models", []) for s in study.get("seeds", [])
    ]
    for model, seed in candidates:
        run = RunDir(run_dir(path, model, seed))
        if run.has_config():
            return run.read_config()
    return None


def study_page(path: Path, loop: bool = False) -> str:
    from drmlab.experiments.ablate import report as ablate_report

    results = _study_results(path)
    study = results["study"]
    warnings: list[str] = []

    def write(folder: Path) -> None:
        ablate_report.write_report(results, folder, log=warnings.append)
        if loop and results.get("models"):
            from drmlab.experiments.loop import report as loop_study_report
            from drmlab.experiments.loop import study as loop_study

            settings = {arm: loop_study.arm_settings(arm, study["preset"]) for arm in results["models"]}
            extra = {"loop_eval": results["eval_loops"]} if results.get("eval_loops") else {}
            loop_study_report.write_report(results, settings, folder, log=warnings.append, **extra)

    texts, images = _written_report(write)
    kind = "Loop study" if loop else "Ablation study"
    title = f"{kind}: {', '.join(map(str, study.get('models', [])))}"
    subtitle = (
        f"drmlab study directory {path}; preset {study.get('preset')}, seeds "
        f"{', '.join(map(str, study.get('seeds', [])))}"
    )
    runs = results.get("runs") or []
    first_config = _first_run_config(path, runs, study)
    body = [
        h.paragraph(
            "Incomplete: some runs are missing." if not results.get("complete") else f"Complete: {len(runs)} runs.",
            None if results.get("complete") else "note",
        ),
        h.section("Loop table", h.markdown_html(texts["loop.md"])) if "loop.md" in texts else "",
        h.section("Promotion gate verdicts", _gate_verdicts(results)),
        h.section("Figures", *_figures(images), _not_drawn(["curves.png", "seeds.png"], images, warnings)),
        h.section("Results (results.md)", h.markdown_html(texts.get("results.md", ""), heading_shift=2)),
        h.section(
            "Runs",
            h.table(
                ("model", "seed", "params", "val CE (nats/token)", "bits/byte", "tokens", "tokens/s", "train seconds"),
                [
                    (
                        r.get("model"),
                        r.get("seed"),
                        r.get("params"),
                        r.get("val_ce"),
                        r.get("val_bpb"),
                        r.get("tokens"),
                        r.get("tokens_per_s"),
                        r.get("train_seconds"),
                    )
                    for r in runs
                ],
            )
            if runs
            else h.paragraph("No finished run yet.", "note"),
        ),
        h.section("Study settings (study.json)", h.key_value_table(study)),
        h.section("Data provenance (the first run's config.json)", _provenance(first_config)) if first_config else "",
        h.section("Runtime (the first run's config.json)", h.key_value_table(first_config.get("runtime") or {}))
        if first_config
        else "",
    ]
    return h.page(title, subtitle, body)


def mqar_page(path: Path) -> str:
    from drmlab.experiments.mqar import report as mqar_report
    from drmlab.runs import RunDir, read_json

    summary = read_json(path / "mqar.json")
    if not isinstance(summary, dict) or not isinstance(summary.get("study"), dict) or "models" not in summary:
        raise NotAReportDirectory(f"{path / 'mqar.json'} is not the summary of a drmlab mqar study")
    warnings: list[str] = []
    texts, images = _written_report(lambda folder: mqar_report.write_report(summary, folder, log=warnings.append))
    study = summary["study"]
    runtime = None
    for run_folder in sorted((path / "runs").glob("*")) if (path / "runs").is_dir() else []:
        if RunDir(run_folder).has_config():
            runtime = RunDir(run_folder).read_config().get("runtime")
            break
    title = f"MQAR study: {', '.join(map(str, study.get('models', [])))}"
    subtitle = f"drmlab study directory {path}; kv {', '.join(map(str, study.get('kvs', [])))}"
    body = [
        h.section("Figure", *_figures(images), _not_drawn(["mqar.png"], images, warnings)),
        h.section("Results (mqar.md)", h.markdown_html(texts.get("mqar.md", ""), heading_shift=2)),
        h.section("Study settings", h.key_value_table(study)),
        h.section("Runtime (the first run's config.json)", h.key_value_table(runtime))
        if isinstance(runtime, dict)
        else "",
    ]
    return h.page(title, subtitle, body)
