"""The paired ablation protocol (docs/drm.md section A.7): several models x several seeds, one budget.

Every (model, seed) run uses the same train config, so for a given seed every model sees the same
batches in the same order (the batches are a function of (seed, step, micro) only; see
:mod:`drmlab.training.batches`), and the seed also drives each model's init. Runs go seed by seed
(all models of seed 1, then seed 2, ...) so complete pairs accumulate first. Each run lives in
``OUT/runs/LABEL-seedS`` and is an ordinary ``drmlab train`` run directory; a label is a registered
model name, ``NAME:ARM`` (``LOOPED:B``, folder ``LOOPED-B-seedS``) or a study's own label mapped to
a registered model (the loop study's arms).

Resuming: running the same study again skips finished runs (their ``summary.json``), continues a
half-finished run from its checkpoint (bit-exactly), and starts the rest. More models or seeds may
be added on a rerun; changing the budget, preset, train settings or data is refused.

Learning rates: with ``lr_grid`` every model is first trained once per grid rate (on the first seed,
``tune_tokens`` tokens, folders ``OUT/tuning/LABEL-lrR``) and scored on a held-out slice of the
training split (:mod:`drmlab.experiments.lr_sweep`); its paired runs then use its best rate.

Several processes may run the same study at once (one per core): each takes the runs no other
process holds (a run's lock says who holds it) and waits for the rest, so two terminals running the
same command share the work.

Python: ``run_study(spec, runtime, out)`` plans, trains and reports a
:class:`~drmlab.experiments.spec.StudySpec` under a :class:`~drmlab.experiments.spec.Runtime`;
:func:`plan_study` checks every name and setting first, on the meta device, before any data is read.
:func:`collect_results` turns the finished runs into the numbers (per-model mean +- population std, per-seed values, the promotion
gate of :mod:`drmlab.experiments.stats` for every ordered pair); :mod:`drmlab.experiments.ablate.report`
writes them as results.json / .md / .csv and the plots.

Its parts, one job each: the study record and its folders (:mod:`~drmlab.experiments.ablate.study`),
planning (:mod:`~drmlab.experiments.ablate.plan`) and the numbers (:mod:`~drmlab.experiments.ablate.results`);
this module runs the study. Every name they define is importable from here too.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate.plan import (  # noqa: F401 (re-exported)
    CHECK_VOCAB,
    DEFAULT_TOKENS,
    RESCORING_KEYS,
    check_seeds,
    distinct_names,
    plan_study,
    record_study,
    study_record,
)
from drmlab.experiments.ablate.results import (  # noqa: F401 (re-exported)
    collect_results,
    collect_runs,
    summarize,
    sweep_results,
    write_results,
)
from drmlab.experiments.ablate.study import STUDY_FILE, Study, run_dir, tuning_dir  # noqa: F401 (re-exported)
from drmlab.experiments.spec import DEFAULT_MODELS, DEFAULT_SEEDS, Log, Runtime, StudySpec  # noqa: F401 (re-exported)
from drmlab.training.run_info import DataInfo, RunInfo


@dataclasses.dataclass(frozen=True)
class Job:
    """One run of a planned study: a sweep run (``kind`` "tune", ``value`` its rate) or a paired run
    (``kind`` "run", ``value`` its seed)."""

    kind: str
    model: str
    value: float | int

    @property
    def tuning(self) -> bool:
        return self.kind == "tune"

    def seed(self, study: Study) -> int:
        return study.tune_seed if self.tuning else self.value

    def path(self, out: Path) -> Path:
        return tuning_dir(out, self.model, self.value) if self.tuning else run_dir(out, self.model, self.value)

    def title(self, number: int, total: int) -> str:
        what = f"sweep {self.model} lr {self.value:g}" if self.tuning else f"{self.model} seed {self.value}"
        return f"[{number}/{total}] {what}"


@dataclasses.dataclass(frozen=True)
class Split:
    """The tokens a run trains on and is scored on, and the byte counter of the scored ones."""

    corpus: object  # the study's TokenCorpus (its vocabulary, tokenizer and provenance)
    train: object
    scored: object
    count_bytes: object


# ---------------------------------------------------------------- running


def run_study(
    spec: StudySpec, runtime: Runtime, out: str | Path, *, corpus=None, sweep_only: bool = False
) -> dict | None:
    """Plan ``spec`` (:func:`plan_study`), run or resume it (:func:`run_planned`) and report; the results
    (None where ``runtime.leave_held`` left runs to other processes)."""
    return run_planned(plan_study(spec), runtime, out, corpus=corpus, sweep_only=sweep_only)


def run_planned(
    study: Study, runtime: Runtime, out: str | Path, *, corpus=None, sweep_only: bool = False
) -> dict | None:
    """Run (or resume) the sweep runs, then every (seed, model) of ``study``; collect and report.
    ``sweep_only``: stop after the sweep runs (the same call without it goes on with the paired runs).

    ``corpus``: the loaded :class:`~drmlab.data.TokenCorpus` of ``study.data_source`` (loaded here, with
    ``runtime.cache_dir``, when None). ``runtime.log`` receives one line per run (skipped, resuming,
    training, its val CE). A run that another process holds is left to it; this process waits
    ``runtime.wait_seconds`` between looks until every run is finished (a model's paired runs wait for
    its whole sweep). With ``runtime.leave_held`` it returns None instead of waiting, writing no report:
    every run it leaves is held by a live process or waits on one (a paired run on its sweep), and that
    process goes on to it.
    """
    from drmlab.evaluation import byte_counter

    if sweep_only and not study.lr_grid:
        raise ValueError("sweep_only needs an lr grid to sweep (lr_grid)")
    runtime.apply_threads()
    out = Path(out)
    if corpus is None:
        from drmlab.data import load_corpus

        corpus = load_corpus(source=study.data_source, tokenizer=study.tokenizer, cache_dir=runtime.cache_dir)
    record_study(out, study, corpus.meta)
    paired = Split(
        corpus, corpus.train, corpus.val, byte_counter(corpus.val, corpus.tokenizer, corpus.meta.get("val_bytes"))
    )
    tuning = None
    if study.lr_grid:
        tune_train, tune_heldout = lr_sweep.tuning_split(corpus.train)
        tuning = Split(corpus, tune_train, tune_heldout, byte_counter(tune_heldout, corpus.tokenizer))
    todo = [Job("tune", model, lr) for model in study.models for lr in (study.lr_grid or [])]
    if not sweep_only:
        todo += [Job("run", model, seed) for seed in study.seeds for model in study.models]
    waiting_logged: set = set()
    number = {job: i for i, job in enumerate(todo, 1)}
    while todo:
        left = []
        for job in todo:
            label = job.title(number[job], len(number))
            lr = None
            if not job.tuning and study.lr_grid:
                _check_grid_unchanged(out, study)
                sweep = sweep_results(out, study)[job.model]
                if not sweep["complete"]:  # its sweep is still running in another process
                    left.append(job)
                    continue
                if sweep["lr"] is None:
                    if job not in waiting_logged:
                        runtime.say(f"{label}: skipped, every rate of its sweep diverged")
                        waiting_logged.add(job)
                    continue
                lr = sweep["lr"]
            elif not job.tuning and study.rates is not None:
                lr = study.rates[job.model]
            status = _train_one(study, runtime, out, job, tuning if job.tuning else paired, label, lr=lr)
            if status != "done":
                left.append(job)
                if status == "locked" and job not in waiting_logged:
                    runtime.say(f"{label}: held by another process, left to it")
                    waiting_logged.add(job)
        if left and len(left) == len(todo):  # nothing this process can do now: the rest is held elsewhere
            if runtime.leave_held:
                runs = f"{len(left)} run{'s' * (len(left) != 1)}"
                runtime.say(
                    f"{runs} left, each held by another process or waiting on runs one holds: left to those "
                    "processes (--leave-held); the last to finish writes the report"
                )
                return None
            time.sleep(runtime.wait_seconds)
        todo = left
    return write_results(out, log=runtime.log)


def _check_grid_unchanged(out: Path, study: Study) -> None:
    """Refuse to choose a rate when another process has since changed the study's grid (study.json):
    the two processes would choose from different grids."""
    from drmlab.runs import read_json

    recorded = read_json(out / STUDY_FILE).get("lr_grid")
    if recorded != study.lr_grid:
        raise ValueError(
            f"{out / STUDY_FILE}: another process changed the lr grid to {recorded} while this one "
            f"runs {study.lr_grid}; rerun the command with the study's grid"
        )


def _train_one(
    study: Study, runtime: Runtime, out: Path, job: Job, split: Split, label: str, *, lr: float | None = None
) -> str:
    """Train (or resume) one run of the study unless it is finished; "done", or "locked" when another
    process holds it. A sweep run trains at its rate for the sweep's budget; a paired run at ``lr``
    (None: the study's). A sweep run that diverges is done (its score is missing); a paired run's
    divergence is raised."""
    from drmlab.evaluation import rescorer
    from drmlab.models import build_model, count_parameters
    from drmlab.runs import RunDir, RunLockedError
    from drmlab.training.config import TrainConfig
    from drmlab.training.trainer import NonFiniteLossError, train

    tuning, model, seed = job.tuning, job.model, job.seed(study)
    run = RunDir(job.path(out))
    done = run.finished_summary()
    if done is not None:
        runtime.say(f"{label}: done before ({'tuning' if tuning else 'val'} CE {done['val_ce']:.4f}), skipped")
        return "done"
    stopped = (run.read_summary() or {}).get("stopped")
    if tuning and stopped in ("non-finite", "diverged"):
        runtime.say(f"{label}: diverged before, skipped")
        return "done"
    try:  # a quick look first, so that a run held elsewhere is neither built nor announced (train() locks it)
        run.create().lock().release()
    except RunLockedError:
        return "locked"
    values = dict(study.train, seed=seed)
    if tuning:  # a sweep run is scored once, at its end
        lr = job.value
        values.update(tokens=study.tune_tokens, milestones=None)
    if lr is not None:
        values["lr"] = lr
    cfg = TrainConfig(**values).validate()
    corpus = split.corpus
    overrides = study.model_overrides.get(model, {})
    net = build_model(study.registry_name(model), study.preset, vocab_size=corpus.vocab_size, seed=seed, **overrides)
    resume = run.has_checkpoint()
    runtime.say(
        f"{label}: {'resuming' if resume else 'training'} ({count_parameters(net):,} parameters"
        + (f", lr {cfg.lr:g})" if lr is not None else ")")
    )
    t0 = time.perf_counter()
    data_meta = (
        dict(corpus.meta, tuning_split={"train_tokens": len(split.train), "heldout_tokens": len(split.scored)})
        if tuning
        else corpus.meta
    )
    try:
        summary = train(
            net,
            split.train,
            split.scored,
            cfg,
            run.path,
            resume=resume,
            overwrite=not resume,
            evaluate=rescorer(
                split.scored,
                cfg.seq_len,
                batch_size=cfg.eval_batch_size,
                max_targets=cfg.eval_tokens,
                count_bytes=split.count_bytes,
            ),
            device=runtime.device,
            quiet=runtime.quiet,
            tensorboard=runtime.tensorboard,
            run_info=RunInfo(
                study.registry_name(model),
                study.preset,
                overrides,
                label=model,
                data=DataInfo(corpus.vocab_size, corpus.tokenizer.name, study.data_source, data_meta),
            ),
        )
    except RunLockedError:
        return "locked"
    except NonFiniteLossError as exc:
        if not tuning:
            raise
        runtime.say(f"{label}: diverged ({str(exc).split(';')[0]}), scored as missing")
        return "done"
    runtime.say(
        f"{label}: {'tuning' if tuning else 'val'} CE {summary['val_ce']:.4f} nats/token in "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return "done"
