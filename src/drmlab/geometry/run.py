"""Every geometry instrument on a model and a token stream (``docs/geometry.md`` section 7).

:func:`geometry_of_model` measures a built model on token windows and returns a JSON-able record
(one entry per instrument, each with its cost in seconds); :func:`run_geometry` does it for a run
directory -- the checkpoint's model in float64 on the first N tokens of the run's validation stream
(the data and tokenizer :mod:`drmlab.cli.eval` uses) -- and writes ``geometry.json``,
``tables.md`` and plots into the run's ``geometry/`` folder. One function per instrument
(``measure_*``) takes a :class:`~.model_adapter.ModelView`.

Each measurement says what it is: numerical ranks name their tolerance, an estimated pullback says
so, a solver that did not converge gives its residual and no number, and the action ratio is a
diagnostic, not evidence that the model's paths are geodesics.

The instruments themselves are :mod:`~.measures`; every name of it listed in ``__all__`` (and the
helpers the tests use) is importable from here too.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from .measures import (  # noqa: F401 (re-exported)
    GeometryBudget,
    _dense_metric,
    _g_angle,
    exact_rank_source,
    measure_agreement,
    measure_connection,
    measure_geodesics,
    measure_metric,
    measure_pullback,
    measure_strata,
    measure_topology,
)
from .model_adapter import INSTRUMENTS, model_view

__all__ = [
    "GeometryBudget",
    "exact_rank_source",
    "geometry_of_model",
    "measure_agreement",
    "measure_connection",
    "measure_geodesics",
    "measure_metric",
    "measure_pullback",
    "measure_strata",
    "measure_topology",
    "run_geometry",
]


def geometry_of_model(
    model, tokens: torch.Tensor, budget: GeometryBudget | None = None, only: tuple[str, ...] | None = None
) -> dict:
    """Every applicable instrument on ``model`` and tokens [B, T]; the model should be in float64.

    Returns {'model', 'windows', 'tokens', 'instruments': {name: result with 'seconds'},
    'not_applicable': {name: reason}, 'notes': [...]}."""
    from .topology import have_gudhi

    budget = budget or GeometryBudget()
    t0 = time.perf_counter()
    view = model_view(model, tokens)
    record: dict = {
        "model": view.name,
        "windows": int(tokens.shape[0]),
        "tokens": int(tokens.numel()),
        "d_state": view.d_state,
        "vocab_size": view.vocab_size,
        "budget": asdict(budget),
        "instruments": {},
        "not_applicable": dict(view.not_applicable),
        "notes": [],
        "view_seconds": time.perf_counter() - t0,
    }
    if not have_gudhi():
        record["not_applicable"]["topology"] = "gudhi is not installed (pip install 'drmlab[geometry]')"
    cache: dict = {}
    plan = [
        ("metric", lambda: measure_metric(view)),
        ("pullback", lambda: measure_pullback(view, budget, cache)),
        ("strata", lambda: measure_strata(view, budget)),
        ("agreement", lambda: measure_agreement(view, cache)),
        ("connection", lambda: measure_connection(view, budget)),
        ("geodesics", lambda: measure_geodesics(view, budget)),
        ("topology", lambda: measure_topology(view, budget)),
    ]
    for name, measure in plan:
        if name in record["not_applicable"] or (only is not None and name not in only):
            continue
        start = time.perf_counter()
        try:
            result = measure()
        except torch.linalg.LinAlgError as exc:  # a factorisation at states the instrument moved to: stated, not hidden
            result = {"failed": str(exc).splitlines()[0]}
            record["notes"].append(f"{name} failed: {result['failed']}")
        result["seconds"] = time.perf_counter() - start
        record["instruments"][name] = result
    if record["not_applicable"]:
        record["notes"].append(
            "not applicable: " + "; ".join(f"{k} ({v})" for k, v in record["not_applicable"].items())
        )
    if "how" in record["instruments"].get("pullback", {}) and record["instruments"]["pullback"]["how"].startswith(
        "estimated"
    ):
        record["notes"].append(record["instruments"]["pullback"]["how"])
    record["seconds"] = time.perf_counter() - t0
    record["_cache"] = cache
    return record


def _validation_windows(config: dict, tokens: int, data=None, tokenizer=None, cache_dir=None) -> torch.Tensor:
    """The first ``tokens`` tokens of the run's validation stream as windows [B, seq_len] (the last
    window as long as the others: a shorter remainder is dropped, unless it is all there is)."""
    import numpy as np

    from drmlab.data import load_corpus

    source = data if data is not None else config.get("data_source")
    tok = tokenizer or config.get("tokenizer") or "bytes"
    if tok != config.get("tokenizer", tok):
        raise ValueError(f"the run was trained with the {config.get('tokenizer')} tokenizer, not {tok}")
    corpus = load_corpus(source=source, tokenizer=tok, cache_dir=cache_dir)
    if corpus.vocab_size != config.get("vocab_size", corpus.vocab_size):
        raise ValueError(
            f"the corpus vocabulary ({corpus.vocab_size}) differs from the run's ({config.get('vocab_size')})"
        )
    seq_len = int(config["train"]["seq_len"])
    stream = torch.from_numpy(np.array(corpus.val[: max(tokens, 1)], dtype=np.int64))
    if len(stream) < 2:
        raise ValueError(f"the validation stream of {source!r} has {len(stream)} tokens: nothing to measure")
    seq_len = min(seq_len, len(stream))
    count = max(1, len(stream) // seq_len)
    return stream[: count * seq_len].view(count, seq_len)


def run_geometry(
    run_dir,
    tokens: int = 512,
    out=None,
    device: str = "cpu",
    data=None,
    tokenizer=None,
    cache_dir=None,
    budget: GeometryBudget | None = None,
) -> tuple[dict, list[Path]]:
    """Load the run's checkpoint, measure it on its validation stream, write the outputs.

    Returns (the record, the files written). The model runs in float64 on ``device``."""
    from drmlab.runs import RunDir, jsonable, write_json_atomic

    from .report import write_plots, write_tables

    run = RunDir(run_dir)
    model, config, state = run.load_model(device)
    model = model.to(torch.float64).requires_grad_(False)
    windows = _validation_windows(config, tokens, data, tokenizer, cache_dir).to(next(model.parameters()).device)
    record = geometry_of_model(model, windows, budget)
    cache = record.pop("_cache")
    record.update(
        {
            "run": str(run_dir),
            "step": int(state.get("step", 0)),
            "preset": config.get("preset"),
            "instruments_known": list(INSTRUMENTS),
        }
    )
    folder = Path(out) if out is not None else Path(run_dir) / "geometry"
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "geometry.json", folder / "tables.md"]
    write_json_atomic(files[0], jsonable(_public(record)))
    files[1].write_text(write_tables(record))
    files += write_plots(record, cache, folder)
    return record, files


def _public(record: dict) -> dict:
    """The record without the bulky underscore entries (spectra, diagrams), which go to the plots."""
    if isinstance(record, dict):
        return {k: _public(v) for k, v in record.items() if not str(k).startswith("_")}
    if isinstance(record, list):
        return [_public(v) for v in record]
    return record
