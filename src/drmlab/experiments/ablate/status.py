"""Where an ablation study stands (``drmlab ablate --status``; docs/drm.md section A.7.2), read from its folder
without writing to it.

Every run the study plans (its sweep runs, then its paired runs, numbered as ``drmlab ablate`` numbers them)
is one of: ``done`` (its summary: the CE, its tokens/s), ``diverged`` (a sweep run scored as missing),
``training`` (another process holds its lock: which one, and how far it is), ``stopped`` (a checkpoint part-way,
which the next ``drmlab ablate`` resumes from its step; and how far the run had trained past it, steps it
trains again) or ``not begun``. The training time left is estimated from the tokens each unfinished run still
has to train, at the mean tokens/s of that model's finished runs (its paired runs, else its sweep runs, else
its runs in progress), and the evaluations each still has to make (its milestones and its final one) at the
mean time of that model's evaluations so far: one process's hours.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from drmlab.experiments.ablate.protocol import Job
from drmlab.experiments.ablate.study import STUDY_FILE

STATES = ("done", "diverged", "training", "stopped", "not begun")


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """One planned run: its job, its state (one of :data:`STATES`), its budget and what its folder says."""

    job: Job
    state: str
    budget: int  # tokens
    tokens: int = 0  # trained so far (the budget when done); for a stopped run, its checkpoint's, where it resumes
    val_ce: float | None = None
    tokens_per_s: float | None = None
    holder: str | None = None  # who trains it now
    eval_seconds: tuple[float, ...] = ()  # its whole-stream evaluations so far (milestones, the final one)
    evals_to_come: int = 0  # the whole-stream evaluations it still has to make (milestones, the final one)
    trained_to: int | None = None  # a stopped run whose steps went past its checkpoint: how far (trained again)


def _planned_jobs(record: dict) -> list[Job]:
    grid = record.get("lr_grid") or []
    return [Job("tune", m, lr) for m in record["models"] for lr in grid] + [
        Job("run", m, s) for s in record["seeds"] for m in record["models"]
    ]


def _metrics(run) -> list[dict]:
    return run.read_metrics() if run.metrics_path.is_file() else []


def _eval_seconds(rows: list[dict], summary: dict | None) -> tuple[float, ...]:
    """The seconds of a run's milestone evaluations and of its final one, as far as it has them."""
    found = [r["eval_seconds"] for r in rows if r.get("kind") == "milestone" and r.get("eval_seconds")]
    if summary is not None and summary.get("eval_seconds"):
        found.append(summary["eval_seconds"])
    return tuple(found)


def _train_config(record: dict, tuning: bool = False):
    """The study's train settings as the trainer reads them (a sweep run's at the sweep's budget)."""
    from drmlab.training.config import TRAIN_KEYS, TrainConfig

    values = {k: v for k, v in record["train"].items() if k in TRAIN_KEYS}
    if tuning and record.get("tune_tokens"):
        values.update(tokens=record["tune_tokens"], milestones=None)
    return TrainConfig(**values)


def _budget(record: dict, tuning: bool) -> int:
    """The tokens a run of the study trains: its budget in whole optimizer steps, as the trainer counts them."""
    cfg = _train_config(record, tuning)
    return cfg.total_steps * cfg.tokens_per_step


def _evals_to_come(record: dict, job: Job, tokens: int) -> int:
    """The final evaluation, and for a paired run the milestones it has not reached."""
    milestones = [] if job.tuning else (record["train"].get("milestones") or [])
    return 1 + sum(m > tokens for m in milestones)


def run_status(out: Path, job: Job, record: dict) -> RunStatus:
    """What the folder of ``job`` in the study at ``out`` says, without writing to it."""
    from drmlab.runs import LOCK_FILE, RunDir, lock_holder

    budget = _budget(record, job.tuning)
    path = job.path(out)
    run = RunDir(path)
    if not path.is_dir():
        return RunStatus(job, "not begun", budget, evals_to_come=_evals_to_come(record, job, 0))
    done, rows = run.finished_summary(), _metrics(run)
    if done is not None:
        tokens = int(done.get("tokens") or budget)
        return RunStatus(
            job, "done", budget, tokens, done.get("val_ce"), done.get("tokens_per_s"), None, _eval_seconds(rows, done)
        )
    summary = run.read_summary() or {}
    if job.tuning and summary.get("stopped") in ("non-finite", "diverged"):
        return RunStatus(job, "diverged", budget, int(summary.get("tokens") or 0))
    trained = [r for r in rows if r.get("kind") == "train"]
    row = trained[-1] if trained else None
    tokens = int(row["tokens"]) if row else 0
    rate = row.get("tok_s") if row else None
    holder = lock_holder(path / LOCK_FILE)
    evals = _eval_seconds(rows, None)
    state = "training" if holder is not None else ("stopped" if run.has_checkpoint() else "not begun")
    trained_to = None
    if state == "stopped":  # a resume goes on from the checkpoint, not from the last step logged after it
        kept = _checkpoint_tokens(run, record)
        if kept is not None and kept < tokens:
            tokens, trained_to = kept, tokens
    return RunStatus(
        job, state, budget, tokens, None, rate, holder, evals, _evals_to_come(record, job, tokens), trained_to
    )


def _checkpoint_tokens(run, record: dict) -> int | None:
    """The tokens of the committed checkpoint a resume starts from (None where its pointer does not read)."""
    try:
        step = int(run.read_pointer()["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step * _train_config(record).tokens_per_step


def study_status(out: str | Path) -> list[RunStatus]:
    """Every planned run of the study at ``out``, in ``drmlab ablate``'s order. Raises ValueError naming the
    folder when it holds no study."""
    from drmlab.runs import read_json

    out = Path(out)
    if not (out / STUDY_FILE).is_file():
        raise ValueError(f"{out} holds no study ({STUDY_FILE} is missing): start one with drmlab ablate --out {out}")
    record = read_json(out / STUDY_FILE)
    return [run_status(out, job, record) for job in _planned_jobs(record)]


def model_rates(rows: list[RunStatus]) -> dict[str, float]:
    """Per model, the mean tokens/s of its finished paired runs, else of its finished sweep runs, else the
    latest of its runs in progress."""
    rates = {}
    for model in dict.fromkeys(r.job.model for r in rows):
        mine = [r for r in rows if r.job.model == model and r.tokens_per_s]
        for timed in (
            [r for r in mine if r.state == "done" and not r.job.tuning],
            [r for r in mine if r.state == "done" and r.job.tuning],
            [r for r in mine if r.state in ("training", "stopped")],
        ):
            if timed:
                rates[model] = sum(r.tokens_per_s for r in timed) / len(timed)
                break
    return rates


def eval_seconds(rows: list[RunStatus]) -> dict[tuple[str, bool], float]:
    """Per (model, sweep run or not), the mean seconds of one whole-stream evaluation of its runs so far."""
    timed: dict[tuple[str, bool], list[float]] = {}
    for r in rows:
        timed.setdefault((r.job.model, r.job.tuning), []).extend(r.eval_seconds)
    return {key: sum(v) / len(v) for key, v in timed.items() if v}


def hours_left(rows: list[RunStatus]) -> tuple[float, float, list[str], list[str]]:
    """(training hours, evaluation hours, models whose training is not timed, models whose evaluations are
    not timed) one process has left: each unfinished run's tokens at :func:`model_rates`, and its evaluations
    still to come at :func:`eval_seconds`. What cannot be timed yet is named, not counted."""
    rates, evals = model_rates(rows), eval_seconds(rows)
    train, evaluate, no_rate, no_eval = 0.0, 0.0, [], []
    for r in rows:
        if r.state in ("done", "diverged"):
            continue
        if r.job.model in rates:
            train += max(r.budget - r.tokens, 0) / rates[r.job.model]
        else:
            no_rate.append(r.job.model)
        per_eval = evals.get((r.job.model, r.job.tuning))
        if per_eval is not None:
            evaluate += r.evals_to_come * per_eval
        else:
            no_eval.append(r.job.model)
    return train / 3600, evaluate / 3600, list(dict.fromkeys(no_rate)), list(dict.fromkeys(no_eval))


def format_status(out: str | Path, rows: list[RunStatus]) -> str:
    """The status as lines: one per run, then the counts and the hours left."""
    lines, total = [], len(rows)
    width = max((len(_what(r.job)) for r in rows), default=0)
    for i, r in enumerate(rows, 1):
        number = f"[{i}/{total}]"
        lines.append(f"{number:>{2 * len(str(total)) + 3}} {_what(r.job):<{width}}  {_detail(r)}")
    counts = {s: sum(r.state == s for r in rows) for s in STATES}
    sweep = sum(r.job.tuning for r in rows)
    head = f"{out}: {total} runs ({sweep} sweep, {total - sweep} paired); " + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n
    )
    train, evaluate, no_rate, no_eval = hours_left(rows)
    tail = (
        f"left: about {train + evaluate:.1f} one-process hours ({train:.1f} training, {evaluate:.1f} evaluating), "
        "at the tokens/s and evaluation times of each model's runs so far"
    )
    tail += f"; not counted, no run timed yet: the training of {', '.join(no_rate)}" if no_rate else ""
    tail += f"; not counted, no evaluation timed yet: those of {', '.join(no_eval)}" if no_eval else ""
    return "\n".join([head, *lines, tail])


def _what(job: Job) -> str:
    return f"sweep {job.model} lr {job.value:g}" if job.tuning else f"{job.model} seed {job.value}"


def _detail(r: RunStatus) -> str:
    if r.state == "done":
        rate = f", {r.tokens_per_s:,.0f} tok/s" if r.tokens_per_s else ""
        return f"done: CE {r.val_ce:.4f}{rate}" if r.val_ce is not None else f"done{rate}"
    progress = f"{r.tokens:,} of {r.budget:,} tokens ({100 * r.tokens / r.budget:.0f}%)"
    if r.state == "training" and r.tokens >= r.budget:
        return f"trained, its final evaluation running now, by {r.holder}"
    if r.state == "training":
        rate = f", {r.tokens_per_s:,.0f} tok/s" if r.tokens_per_s else ""
        return f"training now, {progress}{rate}, by {r.holder}"
    if r.state == "stopped":
        again = (
            f" (it trained to {r.trained_to:,} after that checkpoint: those steps are trained again)"
            if r.trained_to
            else ""
        )
        return f"stopped, its checkpoint at {progress}; the next drmlab ablate resumes it from there{again}"
    return r.state
