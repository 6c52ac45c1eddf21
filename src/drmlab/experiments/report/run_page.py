"""The page of a run directory (``drmlab report``): its status, the final numbers (summary.json and a
later eval.json), the curves (:mod:`~drmlab.experiments.report.run_curves`), the evaluations and resumes as
tables, the committed checkpoint with its sha256 sums (every file verified; a recovered pointer or a
damaged file stated in one line, the rest of the page rendered all the same), the configuration, the
data provenance and the runtime."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from drmlab.experiments.report import html as h
from drmlab.experiments.report.kinds import NotAReportDirectory
from drmlab.experiments.report.run_curves import _diagnostic_curves, _run_curves

EVAL_TABLE_DIAGNOSTICS = ("dimD_mean", "gate_q50", "metric_energy_mean", "action")


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
