"""The rate probe of the Zoology protocol at CPU budget (docs/mqar.md section 10.9): whether a saved run
needs more epochs (:func:`finished_for`), its score at the probe's end (:func:`probe_score`), the probe of a
run now training past it (:func:`probe_as_it_ended`), and the runs that go on past the probe at each cell's
chosen rate (:func:`runs_after_the_probe`)."""

from __future__ import annotations

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar.zoology_plan import ZoologyStudy


def same_spec(saved: dict | None, spec: dict) -> bool:
    """Whether a saved result ran under ``spec``: equal, once the train settings added to
    :class:`~drmlab.training.config.TrainConfig` since it was written take their defaults (each new setting
    defaults to the behaviour before it, so a committed run stays reusable as the trainer grows)."""
    from drmlab.training.config import with_train_defaults

    return isinstance(saved, dict) and with_train_defaults(saved.get("spec")) == spec


def finished_for(saved: dict | None, spec: dict, epochs: int) -> bool:
    """Whether a saved result ran under ``spec`` (:func:`same_spec`) and needs no more training for
    ``epochs`` epochs: done, diverged, or probed at least that far."""
    if not same_spec(saved, spec):
        return False
    return saved.get("status") in ("done", "diverged") or (
        saved.get("status") == "probed" and saved.get("epochs_run", 0) >= epochs
    )


def probe_as_it_ended(saved: dict | None, spec: dict, probe_epochs: int | None) -> dict | None:
    """A saved run under ``spec`` marked ``training`` that has trained its probe's epochs (a chosen rate
    going on past its probe, or a run of a study without the probe), as its probe ended (``probed`` after
    its first ``probe_epochs`` epochs, ``going_on``: True), for a report or a probe pass made while it
    trains or after it stopped; None for any other run. The probe's fields come from its
    epochs: the test accuracy of the last (correct answers out of the spec's test queries), the steps, and
    the wall seconds as they were counted (training and evaluation)."""
    if probe_epochs is None or not same_spec(saved, spec) or saved.get("status") != "training":
        return None
    epochs = [e for e in saved.get("epochs") or [] if e["epoch"] <= probe_epochs]
    if not epochs or epochs[-1]["epoch"] != probe_epochs:
        return None  # still in its probe
    last, queries = epochs[-1], spec["task"]["n_test"] * spec["task"]["kv"]
    return dict(
        saved,
        status="probed",
        epochs=epochs,
        epochs_run=probe_epochs,
        test_acc=last["test_acc"],
        test_correct=round(last["test_acc"] * queries),
        test_queries=queries,
        early_stopped=False,
        steps=last["step"],
        seconds_per_step=sum(e["train_seconds"] for e in epochs) / max(1, last["step"]),
        wall_seconds=sum(e["train_seconds"] + e["eval_seconds"] for e in epochs),
        going_on=True,
    )


def probe_score(run: dict, probe_epochs: int) -> float | None:
    """A run's test accuracy at the end of the rate probe (its first ``probe_epochs`` epochs, or its early
    stop before that); None where it diverged before the probe's end."""
    if run["status"] not in ("done", "diverged", "probed"):
        return None
    entries = [e for e in run.get("epochs") or [] if e["epoch"] <= probe_epochs]
    if not entries:
        return None
    last = entries[-1]
    stopped_early = run["status"] == "done" and run.get("early_stopped") and run.get("epochs_run") == last["epoch"]
    if last["epoch"] < probe_epochs and not stopped_early:
        return None  # it diverged within the probe
    return last["test_acc"]


def runs_after_the_probe(study: ZoologyStudy, results: dict, going_on: set) -> list[tuple]:
    """The runs to train on past the probe: each cell whose every rate has finished its probe, at its
    chosen rate, once (a cell whose rates all diverged, or whose chosen run is done, has none)."""
    jobs = []
    for seq_len, kv in study.settings:
        for name in study.models:
            for width in study.widths:
                cell = (name, width, seq_len)
                rows = [results.get((*cell, lr)) for lr in study.lr_grid]
                if cell in going_on or any(r is None for r in rows) or rows[0]["status"] == "n/a":
                    continue
                scores = {r["lr"]: probe_score(r, study.recipe.probe_epochs) for r in rows}
                lr = lr_sweep.choose(scores, lower_is_better=False)["lr"]
                going_on.add(cell)
                if lr is not None and results[(*cell, lr)]["status"] == "probed":
                    jobs.append((seq_len, kv, name, width, lr, None))
    return jobs
