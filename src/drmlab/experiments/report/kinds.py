"""What a directory is, for ``drmlab report`` (:func:`directory_kind`): a run (``config.json``), an
ablation or a loop study (``study.json``, or a committed results.json holding its study record), or an
MQAR study (``mqar.json``); anything else is refused with one line (:class:`NotAReportDirectory`)."""

from __future__ import annotations

from pathlib import Path


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
