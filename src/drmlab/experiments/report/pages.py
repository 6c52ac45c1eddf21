"""``drmlab report``: one self-contained HTML page for a run directory or a study directory.

What a directory is decides the page (:func:`directory_kind`):

* a **run** (``config.json``; :mod:`drmlab.runs`): its status, the final numbers (summary.json and a
  later eval.json), the curves of metrics.jsonl (training loss beside the sampled validation CE,
  learning rate, gradient norm, tokens/s, and the DRM geometry diagnostics of each evaluation when
  the rows hold them; resumes marked), the evaluations and resumes as tables, the committed
  checkpoint with its sha256 sums (every file verified; a recovered pointer or a damaged file stated in one
  line, the rest of the page rendered all the same), the configuration, the data provenance and the runtime;
* an **ablation** (``study.json``, or a results.json holding its study record: a committed copy in
  docs/studies; :mod:`drmlab.experiments.ablate.protocol`) or a **loop study** (the same,
  its models being LOOPED arms; :mod:`drmlab.experiments.loop.study`): the study's own report --
  results.md and its figures, redrawn by :mod:`~drmlab.experiments.ablate.report` (and
  :mod:`~drmlab.experiments.loop.report`) from the finished runs -- the promotion-gate verdicts
  of :mod:`drmlab.experiments.stats`, every run, and the study's settings and data provenance;
* an **MQAR study** (``mqar.json``; :mod:`drmlab.experiments.mqar.study`): mqar.md and the accuracy plot
  of :mod:`~drmlab.experiments.mqar.report`, and the study's settings.

The study reports are written by their own writers into a temporary folder and embedded, so the
page shows the same tables and figures as the files beside the study. Everything goes into one
file (:mod:`drmlab.experiments.report.html`): figures as base64 PNGs, no script, no outside resource;
every string read from a file is escaped. Anything else is refused with one line.
"""

from __future__ import annotations

import math
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

from drmlab.experiments.report import html as h

REPORT_FILE = "report.html"
# Figures the study writers draw, in page order, with what each shows.
FIGURE_CAPTIONS = {
    "curves.png": "Sampled validation CE during training (thin: each seed; thick: the mean over seeds)",
    "seeds.png": "Final validation CE per seed and model",
    "lr_sweep.png": "Learning-rate sweep: tuning CE against the rate, the chosen rate circled",
    "loss_vs_n.png": "Validation CE against the loop count N, scaled (eps = 1/N) and unscaled (eps = 1) arms",
    "eval_loops.png": "Validation CE against the loop count at evaluation N' (solid: eps frozen; dashed: eps = 1/N')",
    "mqar.png": "MQAR test accuracy against the number of key-value pairs (crosses: the reference study)",
}
# Diagnostics panels of a run: (title, the row keys drawn in it).
DIAGNOSTIC_PANELS = (
    ("dimD (active directions)", ("dimD_mean",)),
    ("gate quantiles", ("gate_q10", "gate_q50", "gate_q90")),
    ("metric energy v^T G v", ("metric_energy_mean",)),
    ("action", ("action", "action_euclidean")),
    ("metric condition number", ("metric_condition_number",)),
    ("state norm", ("state_norm_mean",)),
)
EVAL_TABLE_DIAGNOSTICS = ("dimD_mean", "gate_q50", "metric_energy_mean", "action")


class NotAReportDirectory(ValueError):
    """The directory is neither a run nor a study; the message names it and what was looked for."""


def directory_kind(path: str | Path) -> str:
    """``"run"``, ``"ablate"``, ``"loop-study"`` or ``"mqar"``; anything else raises one line."""
    from drmlab.experiments.ablate.protocol import STUDY_FILE
    from drmlab.runs import CONFIG_FILE, read_json

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not path.is_dir():
        raise NotAReportDirectory(f"{path} is a file; give a run directory or a study directory")
    if (path / CONFIG_FILE).is_file():
        return "run"
    study = read_json(path / STUDY_FILE) if (path / STUDY_FILE).is_file() else _committed_study(path)
    if study is not None:
        overrides = study.get("model_overrides", {}) if isinstance(study, dict) else {}
        models = study.get("models") if isinstance(study, dict) else None
        if not isinstance(models, list) or not models:
            raise NotAReportDirectory(f"{path}: its study record names no models; it is not a drmlab study")
        if all((overrides.get(m) or {}).get("arm") == m for m in models):  # the loop study's labels are arms
            return "loop-study"
        return "ablate"
    if (path / "mqar.json").is_file():
        return "mqar"
    raise NotAReportDirectory(
        f"{path} is neither a run directory (no {CONFIG_FILE}) nor a study directory (no {STUDY_FILE} of "
        "drmlab ablate or loop-study, no mqar.json of drmlab mqar); nothing to report"
    )


def _committed_study(path: Path) -> dict | None:
    """The study record inside ``path/results.json`` when the folder holds an ablation's or loop study's
    results without its runs (a committed copy, docs/studies/NAME); None otherwise."""
    from drmlab.runs import read_json

    if not (path / "results.json").is_file():
        return None
    try:
        saved = read_json(path / "results.json")
    except ValueError:
        return None
    return saved["study"] if isinstance(saved, dict) and isinstance(saved.get("study"), dict) else None


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the page of ``path`` to ``out`` (default ``path/report.html``); return where it went."""
    text = render(path)
    target = Path(out) if out is not None else Path(path) / REPORT_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OSError(f"could not write {target}: {exc.strerror or exc}") from None
    return target


def render(path: str | Path) -> str:
    """The HTML page of the run or study in ``path``."""
    path = Path(path)
    kind = directory_kind(path)
    if kind == "run":
        return run_page(path)
    if kind == "mqar":
        return mqar_page(path)
    return study_page(path, loop=kind == "loop-study")


# ---------------------------------------------------------------- a run


def run_page(path: Path) -> str:
    from drmlab.runs import RunDir, read_json

    run = RunDir(path)
    config = run.read_config()
    if not isinstance(config, dict):
        raise NotAReportDirectory(f"{run.config_path} is not a run config (not a JSON object)")
    damaged = []  # outputs without a checksum: a damaged one is stated and the rest of the page drawn
    summary, evaluation = {}, None
    try:
        summary = run.read_summary() or {}
    except ValueError as exc:
        damaged.append(str(exc))
    rows = run.read_metrics() if run.metrics_path.is_file() else []
    try:
        evaluation = read_json(run.eval_path) if run.eval_path.is_file() else None
    except ValueError as exc:
        damaged.append(str(exc))
    check = _check_checkpoint(run)
    metrics_damage = run.metrics_problem() if check.verdict != "damaged" else None  # its checksum is the checkpoint's
    result = read_json(path / "result.json") if (path / "result.json").is_file() else None  # an MQAR cell

    name = config.get("label") or config.get("model", "?")
    seed = (config.get("train") or {}).get("seed")
    title = f"Run {name} ({config.get('preset', '?')}, seed {seed})"
    body = [
        h.paragraph(
            _run_status(summary, check, rows, metrics_damage),
            "note" if check.verdict == "damaged" or metrics_damage else None,
        ),
        *(h.paragraph(f"Damaged: {reason}.", "note") for reason in damaged),
        h.section(
            "Results",
            _results_table(summary) if summary else h.paragraph("No summary.json yet.", "note"),
            h.section("Later evaluation (eval.json)", h.key_value_table(evaluation, 8), level=3)
            if isinstance(evaluation, dict)
            else "",
            h.section("MQAR result (result.json)", h.key_value_table(result, 16), level=3)
            if isinstance(result, dict)
            else "",
        ),
        h.section(
            "Curves",
            h.drawn_figure(lambda: _run_curves(rows), "Training curves from metrics.jsonl"),
            h.drawn_figure(
                lambda: _diagnostic_curves(rows),
                "DRM geometry diagnostics at each sampled evaluation (docs/drm.md sections 2, 4, 14)",
            ),
        )
        if rows
        else h.section("Curves", h.paragraph("metrics.jsonl holds no rows yet.", "note")),
        _evaluations_section(rows),
        _resumes_section(rows),
        _checkpoint_section(check),
        h.section("Configuration", _configuration(config)),
        h.section("Data provenance", _provenance(config)),
        h.section("Runtime", h.key_value_table(config.get("runtime") or {})),
    ]
    return h.page(title, f"drmlab run directory {path}", body)


class CheckpointCheck(NamedTuple):
    """What the report found of a run's checkpoint: ``verdict`` is ``"none"``, ``"verified"``, ``"recovered"``
    (``detail``: how, the pointer being lost or damaged) or ``"damaged"`` (``detail``: the one-line reason);
    ``pointer`` is the verified record (None when there is none)."""

    verdict: str
    pointer: dict | None
    detail: str


def _check_checkpoint(run) -> CheckpointCheck:
    """Verify every file of the run's checkpoint (size and sha256 of the weights, the optimizer state and the
    trainer state; :func:`drmlab.runs.checkpoint.resolve_checkpoint`), never raising for a damaged one."""
    from drmlab.runs import CorruptCheckpointError

    try:
        if not run.has_checkpoint():
            return CheckpointCheck("none", None, "")
        _, pointer, note = run.resolve_checkpoint(only=None)
    except (CorruptCheckpointError, OSError, ValueError) as exc:  # OSError: FileNotFoundError, unreadable files
        lines = str(exc).strip().splitlines()
        return CheckpointCheck("damaged", None, lines[0] if lines else type(exc).__name__)
    if note is not None:
        return CheckpointCheck("recovered", pointer, note)
    return CheckpointCheck("verified", pointer, "")


def _checkpoint_sentence(check: CheckpointCheck) -> str:
    if check.verdict == "verified":
        return f"Checkpoint at step {check.pointer.get('step')} verified: every file matches its sha256."
    if check.verdict == "recovered":
        return f"Checkpoint at step {check.pointer.get('step')} recovered from its manifest: {check.detail}."
    if check.verdict == "damaged":
        return f"Checkpoint damaged: {check.detail}."
    return "No checkpoint."


def _run_status(summary: dict, check: CheckpointCheck, rows: list[dict], metrics_damage: str | None = None) -> str:
    steps = [r["step"] for r in rows if r.get("kind") == "train"]
    if summary.get("finished"):
        head = f"Finished: {h.fmt(summary.get('steps'))} steps, {h.fmt(summary.get('tokens'))} tokens."
    elif summary.get("stopped"):
        head = f"Stopped ({summary['stopped']}): {summary.get('message', '')}"
    elif check.verdict != "none":
        head = f"Interrupted or still running: {max(steps) if steps else 0} steps logged."
    else:
        return "Started: no checkpoint yet."
    if metrics_damage:  # the run is not verified as a whole: the curves and tables below are not its whole record
        sentence = _checkpoint_sentence(check)
        if check.verdict == "verified":
            sentence = f"Checkpoint at step {check.pointer.get('step')}: every file matches its sha256."
        return f"{head} {sentence} Metrics incomplete or damaged: {metrics_damage}."
    return f"{head} {_checkpoint_sentence(check)}"


def _results_table(summary: dict) -> str:
    first = (
        "val_ce",
        "val_bpb",
        "val_ppl",
        "val_targets",
        "val_bytes",
        "final_loss",
        "last_sampled_val_ce",
        "steps",
        "total_steps",
        "tokens",
        "params",
        "tokens_per_s",
        "train_seconds",
        "eval_seconds",
    )
    keys = [k for k in first if k in summary] + [k for k in summary if k not in first]
    return h.key_value_table({k: summary[k] for k in keys})


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


def _evaluations_section(rows: list[dict]) -> str:
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not evals:
        return ""
    extra = [k for k in EVAL_TABLE_DIAGNOSTICS if any(k in (r.get("diagnostics") or {}) for r in evals)]
    table = h.table(
        ["step", "tokens", "sampled val CE"] + extra,
        [
            [r.get("step"), r.get("tokens"), r.get("val_ce")] + [(r.get("diagnostics") or {}).get(k) for k in extra]
            for r in evals
        ],
    )
    return h.section("Sampled evaluations", table)


def _resumes_section(rows: list[dict]) -> str:
    resumes = [r for r in rows if r.get("kind") == "resume"]
    if not resumes:
        return ""
    table = h.table(
        ("from step", "settings changed", "device", "threads"),
        [
            (
                r.get("step"),
                "; ".join(
                    f"{k}: {v[0]} -> {v[1]}" if isinstance(v, list) and len(v) == 2 else f"{k}: {v}"
                    for k, v in (r.get("changed") or {}).items()
                )
                or "none",
                r.get("device"),
                r.get("threads"),
            )
            for r in resumes
        ],
    )
    return h.section("Resumes", table)


def _checkpoint_section(check: CheckpointCheck) -> str:
    if check.verdict == "none":
        return h.section("Checkpoint", h.paragraph("No committed checkpoint (no checkpoint.json)."))
    if check.verdict == "damaged":
        return h.section(
            "Checkpoint",
            h.paragraph(f"Damaged: {check.detail}. The report changed nothing.", "note"),
        )
    pointer = check.pointer
    files = pointer.get("files") or {}
    table = h.table(
        ("file", "bytes", "sha256"),
        [(name, (f or {}).get("bytes"), (f or {}).get("sha256")) for name, f in files.items()],
    )
    verdict = (
        "Every file verified (size and sha256)."
        if check.verdict == "verified"
        else f"Recovered: {check.detail}; every file of that folder verified (size and sha256)."
    )
    return h.section(
        "Checkpoint",
        h.paragraph(f"Step {pointer.get('step')}, in {pointer.get('dir')} (format {pointer.get('format')})."),
        h.paragraph(verdict, "note" if check.verdict == "recovered" else None),
        table,
    )


def _configuration(config: dict) -> str:
    head = {k: config.get(k) for k in ("model", "label", "preset", "params", "overrides") if k in config}
    parts = [h.key_value_table(head)]
    if isinstance(config.get("train"), dict):
        parts.append(h.section("Train settings", h.key_value_table(config["train"]), level=3))
    if isinstance(config.get("derived"), dict):
        parts.append(h.section("Derived", h.key_value_table(config["derived"]), level=3))
    if isinstance(config.get("model_config"), dict):
        parts.append(h.details("Model configuration (every field)", h.key_value_table(config["model_config"], 16)))
    return "\n".join(parts)


def _provenance(config: dict) -> str:
    keys = ("data_source", "tokenizer", "vocab_size", "registry_model", "arm_model", "mqar")
    top = {k: config[k] for k in keys if k in config}
    if not top and not isinstance(config.get("data"), dict):
        return h.paragraph("The run's config.json records no data provenance.")
    parts = [h.key_value_table(top)] if top else []
    if isinstance(config.get("data"), dict):
        parts.append(h.section("Corpus (data)", h.key_value_table(config["data"], 12), level=3))
    return "\n".join(parts)


# ---------------------------------------------------------------- ablation and loop studies


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


# ---------------------------------------------------------------- MQAR


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
