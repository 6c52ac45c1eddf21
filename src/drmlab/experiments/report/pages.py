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

Its parts, one job each: what a directory is (:mod:`~drmlab.experiments.report.kinds`), the run page
(:mod:`~drmlab.experiments.report.run_page`, its curves :mod:`~drmlab.experiments.report.run_curves`) and
the study pages (:mod:`~drmlab.experiments.report.study_pages`); every name they define is importable
from here too.
"""

from __future__ import annotations

from pathlib import Path

from drmlab.experiments.report.kinds import NotAReportDirectory, directory_kind  # noqa: F401 (re-exported)
from drmlab.experiments.report.run_curves import DIAGNOSTIC_PANELS  # noqa: F401 (re-exported)
from drmlab.experiments.report.run_page import (  # noqa: F401 (re-exported)
    EVAL_TABLE_DIAGNOSTICS,
    CheckpointCheck,
    run_page,
)
from drmlab.experiments.report.study_pages import (  # noqa: F401 (re-exported)
    FIGURE_CAPTIONS,
    _gate_verdicts,
    mqar_page,
    study_page,
)

REPORT_FILE = "report.html"


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
