"""The Zoology study's summary (docs/mqar.md section 10): each (model, width, length) cell from its runs.

:func:`summarize` gives a cell its rate and accuracy, as the protocol picks them: without a probe, the
rate of the best final test accuracy (Zoology's Figure-2 value); with the probe of the CPU budget
(section 10.9), the rate of the best test accuracy after the probe's epochs, and the final accuracy of
that rate. A probed cell also keeps what each rate's probe ended with (:func:`probe_rows`): its test
accuracy, the mean cross-entropy of the test queries (where the run recorded it) and the loss of its last
training batch, with the rate each loss would have chosen. Those are a diagnostic of the probe's rule,
not the protocol: the cell's rate is the one the accuracy chose.

The summary keeps each finished run whole, with the settings it ran under, so a study goes on from its
committed record in another checkout (:func:`~drmlab.experiments.mqar.zoology.restore_runs`). The settings
the runs share are written once (``spec_shared``) and each run keeps only its own (``spec_own``):
:func:`shared_settings` splits them and :func:`run_settings` puts one run's back together, exactly.
"""

from __future__ import annotations

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar.zoology_models import decode_state_bytes
from drmlab.experiments.mqar.zoology_plan import ZoologyStudy
from drmlab.experiments.mqar.zoology_probe import probe_score

_MISSING = object()


def shared_settings(specs: list[dict]) -> dict:
    """The part every one of ``specs`` holds with the same value, nested dicts compared key by key (a
    key missing from any spec, or holding another value in any, is left out)."""
    if not specs:
        return {}
    shared = {}
    for key, value in specs[0].items():
        values = [spec.get(key, _MISSING) for spec in specs]
        if all(isinstance(v, dict) for v in values):
            shared[key] = shared_settings(values)
        elif all(v == value for v in values):
            shared[key] = value
    return shared


def own_settings(shared: dict, spec: dict) -> dict:
    """What ``spec`` holds beyond ``shared`` (:func:`shared_settings` of a list that held it)."""
    own = {}
    for key, value in spec.items():
        if key in shared and isinstance(shared[key], dict) and isinstance(value, dict):
            inner = own_settings(shared[key], value)
            if inner:
                own[key] = inner
        elif key not in shared or shared[key] != value:
            own[key] = value
    return own


def run_settings(shared: dict, own: dict) -> dict:
    """One run's whole spec from the settings its study's runs share and its own: the inverse of
    :func:`own_settings`."""
    spec = dict(shared)
    for key, value in own.items():
        spec[key] = run_settings(shared[key], value) if isinstance(shared.get(key), dict) else value
    return spec


def probe_end(run: dict, probe_epochs: int) -> dict | None:
    """The epoch record a run's probe ended with (its ``probe_epochs``-th, or its early stop before it);
    None where it has no probe score (:func:`~drmlab.experiments.mqar.zoology_probe.probe_score`)."""
    if probe_score(run, probe_epochs) is None:
        return None
    return [e for e in run["epochs"] if e["epoch"] <= probe_epochs][-1]


def probe_rows(rows: list[dict], probe_epochs: int) -> dict:
    """Per rate of one cell whose probe has ended, what it ended with: ``{"rates": {label: {"acc",
    "test_ce", "train_loss"}}, "by_test_ce": lr | None, "by_train_loss": lr | None}``. ``test_ce``: the
    mean cross-entropy of the test queries (None in a run recorded before it was kept); ``train_loss``:
    the loss of the probe's last training batch. ``by_*``: the rate with the lowest of that loss, where
    every rate has one (a diverged rate has none and is passed over, as by the accuracy)."""
    ends = {r["lr"]: probe_end(r, probe_epochs) for r in rows}
    rates = {
        lr_sweep.lr_label(lr): {
            "acc": None if e is None else e["test_acc"],
            "test_ce": None if e is None else e.get("test_ce"),
            "train_loss": None if e is None else e.get("loss"),
        }
        for lr, e in sorted(ends.items())
    }

    def by(key: str) -> float | None:
        scores = {lr: (None if e is None else e.get(key)) for lr, e in ends.items()}
        if any(e is not None and s is None for e, s in zip(ends.values(), scores.values())):
            return None  # a rate that ended its probe without this loss: no choice by it
        return lr_sweep.choose(scores, lower_is_better=True)["lr"]

    return {"rates": rates, "by_test_ce": by("test_ce"), "by_train_loss": by("loss")}


def summarize(study: ZoologyStudy, results: list[dict]) -> dict:
    """Per (model, width, length): each rate's score (its final test accuracy, or with the probe its test
    accuracy at the probe's end; None: diverged), the chosen rate and the cell's accuracy (Zoology's
    figure value), or n/a with the reason; a probed cell whose rates have all ended their probe also has
    ``probe`` (:func:`probe_rows`). Then every run's status line (``runs``: its status, final accuracy,
    epochs run, seconds), and the finished ones whole (``finished``: with their epochs and specs, what
    ``--restore`` puts back); a run's epochs are written once, in ``finished``."""
    cells = {}
    for name in study.models:
        for width in study.widths:
            for seq_len, kv in study.settings:
                rows = [r for r in results if (r["model"], r["width"], r["seq_len"]) == (name, width, seq_len)]
                key = f"{name} w{width} L{seq_len}"
                na = [r for r in rows if r["status"] == "n/a"]
                if na:
                    cells[key] = {
                        "model": name,
                        "width": width,
                        "seq_len": seq_len,
                        "kv": kv,
                        "status": "n/a",
                        "why": na[0]["why"],
                    }
                    continue
                probe = study.recipe.probe_epochs
                if probe is None:  # Zoology's: every rate trained every epoch, the best final accuracy
                    scores = {
                        r["lr"]: (r.get("test_acc") if r["status"] == "done" else None)
                        for r in rows
                        if r["status"] in ("done", "diverged")
                    }
                else:  # each rate scored at the probe's end; the chosen one's final accuracy is the cell's
                    ended = [r for r in rows if r["status"] in ("done", "diverged", "probed")]
                    scores = {r["lr"]: probe_score(r, probe) for r in ended}
                complete = len(scores) == len(study.lr_grid)
                state = decode_state_bytes(name, study.preset, width, seq_len, study.model_overrides, study.recipe)
                choice = lr_sweep.choose(scores, lower_is_better=False) if scores else {"lr": None}
                best = scores.get(choice["lr"]) if choice.get("lr") is not None else None
                chosen = next((r for r in rows if choice.get("lr") is not None and r["lr"] == choice["lr"]), None)
                extra = {}
                if probe is not None:
                    if complete:  # every rate has ended its probe
                        extra["probe"] = probe_rows(ended, probe)
                    finished = chosen is None or chosen["status"] in ("done", "diverged")
                    complete = complete and finished
                    best = chosen.get("test_acc") if chosen is not None and chosen["status"] == "done" else None
                cells[key] = {
                    "model": name,
                    "width": width,
                    "seq_len": seq_len,
                    "kv": kv,
                    "status": "done" if complete else "incomplete",
                    "scores": {lr_sweep.lr_label(lr): s for lr, s in sorted(scores.items())},
                    "acc": best,
                    "epochs": chosen.get("epochs_run") if chosen is not None else None,
                    "state_bytes": state,
                    **choice,
                    "wall_seconds": {
                        lr_sweep.lr_label(r["lr"]): r.get("wall_seconds")
                        for r in rows
                        if r["status"] in ("done", "diverged")
                    },
                    **extra,
                }
    finished = [r for r in results if r["status"] in ("done", "diverged", "probed")]
    shared = shared_settings([r["spec"] for r in finished])
    return {
        "protocol": "zoology",
        "study": study.record(),
        "cells": cells,
        "runs": [{k: v for k, v in r.items() if k not in ("spec", "epochs")} for r in results],
        "spec_shared": shared,
        "finished": [_with_own_settings(r, shared) for r in finished],
    }


def _with_own_settings(run: dict, shared: dict) -> dict:
    """A finished run as the summary keeps it: its spec cut to ``spec_own`` (checked to rebuild exactly),
    in the place the spec held."""
    own = own_settings(shared, run["spec"])
    if run_settings(shared, own) != run["spec"]:  # the split must lose nothing
        raise AssertionError(f"{run['spec']} does not rebuild from its own settings {own}")
    return {("spec_own" if k == "spec" else k): (own if k == "spec" else v) for k, v in run.items() if k != "reused"}


def with_whole_spec(run: dict, shared: dict) -> dict:
    """A finished run of the summary with its whole spec (:func:`run_settings`) in the place of its
    ``spec_own``: the run as its own ``result.json`` holds it."""
    return {
        ("spec" if k == "spec_own" else k): (run_settings(shared, v) if k == "spec_own" else v) for k, v in run.items()
    }
