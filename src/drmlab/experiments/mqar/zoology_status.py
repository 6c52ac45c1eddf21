"""Where a Zoology study stands (``drmlab mqar --protocol zoology SAME-OPTIONS --status``; docs/mqar.md
section 10.9), read from its folder without writing to it: each planned run's state, its epochs and test
accuracy, who trains it, and the one-process hours the study has left.

A run's state: ``done`` (all its epochs, or the early stop), ``diverged``, ``probed`` (its rate's probe is over;
it goes on only if its cell chooses it), ``training`` (a process holds its lock), ``stopped`` (epochs saved,
nobody holds it: the next run of the command goes on from its last epoch), ``other settings`` (a result
of another spec: trained again from its start), ``not begun`` or ``n/a`` (the model cannot hold the
setting). Hours left, for one process::

    epochs left x steps per epoch x seconds per step  +  epochs left x seconds per test evaluation

summed over the runs still to train: every rate up to the probe's end, then, per cell, the rate its probe
chose up to the last epoch; a cell whose probe is not over counts one rate's epochs after the probe. No
early stop is foreseen, so the figure is an upper bound on the epochs. A run's seconds per step and per
evaluation are its own epochs' so far, else the mean of its model's runs at the same length and width,
else at the same length; a run none of which has timed is named, not counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar.zoology import run_name, run_spec
from drmlab.experiments.mqar.zoology_plan import ZoologyStudy
from drmlab.experiments.mqar.zoology_probe import same_spec

__all__ = ["ZoologyRunStatus", "format_zoology_status", "zoology_hours_left", "zoology_status"]


@dataclass(frozen=True)
class ZoologyRunStatus:
    model: str
    width: int
    seq_len: int
    lr: float
    state: str
    epochs: int = 0  # epochs trained and scored
    test_acc: float | None = None  # after the last of them
    holder: str | None = None
    step_seconds: float | None = None  # mean over its epochs so far
    eval_seconds: float | None = None  # one test evaluation, mean over its epochs so far
    why: str | None = None  # n/a

    @property
    def cell(self) -> tuple[str, int, int]:
        return (self.model, self.width, self.seq_len)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_status(study: ZoologyStudy, out: Path, name: str, width: int, seq_len: int, kv: int, lr: float):
    """What the folder of one run of the study at ``out`` says."""
    from drmlab.runs import RunDir, lock_holder

    spec, why = run_spec(study, name, width, seq_len, kv, lr)
    key = {"model": name, "width": width, "seq_len": seq_len, "lr": lr}
    if why is not None:
        return ZoologyRunStatus(**key, state="n/a", why=why)
    label = run_name(name, width, seq_len, lr)
    saved = _read(out / "runs" / label / "result.json")
    holder = lock_holder(out / "locks" / f"{label}.lock")
    if not same_spec(saved, spec):
        state = "not begun" if saved is None else "other settings"
        return ZoologyRunStatus(**key, state="training" if holder else state, holder=holder)
    epochs = saved.get("epochs") or []
    steps = epochs[-1]["step"] if epochs else 0
    timed = {
        "epochs": epochs[-1]["epoch"] if epochs else 0,
        "test_acc": epochs[-1]["test_acc"] if epochs else None,
        "step_seconds": sum(e["train_seconds"] for e in epochs) / steps if steps else None,
        "eval_seconds": sum(e["eval_seconds"] for e in epochs) / len(epochs) if epochs else None,
    }
    state = saved.get("status")
    if state not in ("done", "diverged", "probed"):
        state = "stopped" if RunDir(out / "runs" / label).has_checkpoint() else "not begun"
    if holder is not None and state not in ("done", "diverged"):
        state = "training"
    return ZoologyRunStatus(**key, state=state, holder=holder, **timed)


def zoology_status(study: ZoologyStudy, out: str | Path) -> list[ZoologyRunStatus]:
    """Every planned run of ``study`` in ``out``, in the order ``drmlab mqar`` takes them."""
    out = Path(out)
    return [
        run_status(study, out, name, width, seq_len, kv, lr)
        for seq_len, kv in study.settings
        for name in study.models
        for width in study.widths
        for lr in study.lr_grid
    ]


def _timing(rows: list[ZoologyRunStatus], r: ZoologyRunStatus) -> tuple[float, float] | None:
    """(seconds per step, seconds per test evaluation) for ``r``: its own, else its model's at the same
    length and width, else at the same length; None where none of them has trained an epoch."""
    for same in (
        lambda o: o is r,
        lambda o: o.cell == r.cell,
        lambda o: (o.model, o.seq_len) == (r.model, r.seq_len),
    ):
        timed = [o for o in rows if same(o) and o.step_seconds is not None]
        if timed:
            return (
                sum(o.step_seconds for o in timed) / len(timed),
                sum(o.eval_seconds or 0.0 for o in timed) / len(timed),
            )
    return None


def _epochs_left(study: ZoologyStudy, rows: list[ZoologyRunStatus]) -> list[tuple[ZoologyRunStatus, int]]:
    """(run, epochs it has left to train) for each run that has any: up to the probe's end for every rate,
    then up to the last epoch for the rate its cell chose (for an unfinished probe: one rate, the best so far)."""
    epochs, probe = study.recipe.epochs, study.recipe.probe_epochs
    left = []
    for cell in dict.fromkeys(r.cell for r in rows):
        mine = [r for r in rows if r.cell == cell and r.state != "n/a"]
        if not mine:
            continue
        if probe is None:
            left += [(r, epochs - r.epochs) for r in mine if r.state not in ("done", "diverged")]
            continue
        left += [(r, probe - r.epochs) for r in mine if r.state not in ("done", "diverged") and r.epochs < probe]
        scores = {r.lr: _probe_score(r, probe) for r in mine}
        going = [r for r in mine if r.epochs > probe]  # past the probe: its cell's chosen rate
        if going:
            chosen = going[0].lr
        elif all(r.state in ("done", "diverged", "probed") for r in mine):
            chosen = lr_sweep.choose(scores, lower_is_better=False)["lr"]
        else:  # the probe is still running: one rate will go on; the best so far stands in for it
            scored = {lr: v for lr, v in scores.items() if v is not None}
            chosen = max(scored, key=scored.get) if scored else mine[0].lr
        run = next((r for r in mine if r.lr == chosen), None)
        if run is not None and run.state not in ("done", "diverged"):
            left.append((run, epochs - max(run.epochs, probe)))
    return [(r, n) for r, n in left if n > 0]


def _probe_score(r: ZoologyRunStatus, probe: int) -> float | None:
    """A run's accuracy at its probe's end (or its early stop within it); None before that or diverged."""
    if r.state == "diverged" or r.epochs > probe:
        return None
    return r.test_acc if r.epochs == probe or r.state == "done" else None


def zoology_hours_left(study: ZoologyStudy, rows: list[ZoologyRunStatus]) -> tuple[float, list[str]]:
    """(one-process hours left, the runs not counted as no run like them has trained an epoch yet)."""
    seconds, untimed = 0.0, []
    for r, epochs in _epochs_left(study, rows):
        timing = _timing(rows, r)
        if timing is None:
            untimed.append(f"{r.model} w{r.width} L{r.seq_len}")
            continue
        step, evaluation = timing
        seconds += epochs * (study.per_epoch(r.seq_len) * step + evaluation)
    return seconds / 3600, list(dict.fromkeys(untimed))


def format_zoology_status(study: ZoologyStudy, out: str | Path, rows: list[ZoologyRunStatus]) -> str:
    """The status as lines: the counts, one line per run, then the hours left."""
    total = len(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    lines = [f"{out}: {total} runs; " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    for i, r in enumerate(rows, 1):
        what = f"{r.model} w{r.width} L{r.seq_len} lr {r.lr:.3g}"
        lines.append(f"[{i}/{total}] {what:<40} {_detail(study, r)}")
    hours, untimed = zoology_hours_left(study, rows)
    tail = (
        f"left: at most about {hours:.1f} one-process hours (every epoch still planned, no early stop), at the "
        "seconds per step and per evaluation of the runs so far"
    )
    if untimed:
        tail += f"; not counted, nothing like them timed yet: {', '.join(untimed)}"
    return "\n".join([*lines, tail])


def _detail(study: ZoologyStudy, r: ZoologyRunStatus) -> str:
    epochs = f"{r.epochs} epoch{'s' if r.epochs != 1 else ''}"
    acc = f", test acc {100 * r.test_acc:.2f}%" if r.test_acc is not None else ""
    if r.state == "n/a":
        return f"n/a: {r.why}"
    if r.state == "training":
        return f"training now, {epochs} of {study.recipe.epochs} done{acc}, by {r.holder}"
    if r.state == "stopped":
        return f"stopped after {epochs}{acc}; the same command goes on from there"
    if r.state in ("done", "probed", "diverged"):
        return f"{r.state} after {epochs}{acc}"
    if r.state == "other settings":
        return "a result of other settings: trains again from its start"
    return r.state
