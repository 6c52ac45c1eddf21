"""The MQAR study (docs/mqar.md sections 4, 6 and 7): models x kv x seeds trained on multi-query
associative recall through the trainer, scored on the test set's query positions.

**Training** goes through :func:`drmlab.training.trainer.train` with a
:class:`~drmlab.training.batches.BatchSource`: the micro-batch of step k is ``batch_size`` rows drawn
with replacement from the train set by ``default_rng([seed, k, micro])`` (a pure function of the
coordinates, like the LM batches), or with ``n_train = 0`` generated from that same generator.
Defaults are the study's: AdamW lr 1e-3 constant, wd 0.01 on every tensor, batch 256, 1,500 steps,
clip 1.0, fp32, seeds 0 and 1. There is no LM evaluation; the test accuracy is computed after
training. Each run's trainer files (config.json, metrics.jsonl, checkpoint, summary.json) and its
``result.json`` sit in ``OUT/runs/<model>_kv<kv>_s<seed>/``; a run whose ``result.json`` records
the same settings is reused, not retrained.

**Learning rates**: with ``lr_grid`` every (model, kv) first trains once per rate on the first seed,
holding out the last tenth of its training sequences (with fresh sequences: a held-out set of its own
stream) and scoring accuracy there, never on the test set; its seeds then train at its best rate
(:mod:`drmlab.experiments.lr_sweep`; folders ``OUT/tuning/<model>_kv<kv>_lr<rate>/``).

Python: ``run_study(MQARSpec(models=..., kvs=..., seeds=..., steps=..., settings=..., lr_grid=...), runtime, out)``
under a :class:`~drmlab.experiments.spec.Runtime`; :func:`plan_study` checks every model and setting on the
meta device before anything trains, and :func:`run_planned` runs a planned study.
:func:`summarize` turns the runs into the numbers (mean +- population std over seeds, first-query
accuracy, the no-binding levels, the study's anchor value where the setting is comparable);
:mod:`drmlab.experiments.mqar.report` writes ``mqar.md``, ``mqar.json`` and ``mqar.png``. The task is
:mod:`drmlab.experiments.mqar.task`, the models :mod:`drmlab.experiments.mqar.models`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar import report
from drmlab.experiments.mqar.models import ANCHOR_ACC, ANCHOR_ARMS, ARM_BASE, ARM_MODELS, build, registry_entry
from drmlab.experiments.mqar.task import FreshMQARBatches, MQARTask, accuracy, probe_train_config, test_set, train_set
from drmlab.experiments.spec import Runtime, Spec
from drmlab.experiments.stats import mean, mean_std
from drmlab.naming import suggest
from drmlab.runs import jsonable
from drmlab.training import pauses
from drmlab.training.batches import FixedSetBatches
from drmlab.training.config import with_train_defaults
from drmlab.training.run_info import RunInfo

DEFAULT_MODELS = ("L1_ds64", "L4_ds64", "L4u_ds64")
DEFAULT_KVS = (4, 16)
DEFAULT_SEEDS = (0, 1)
# Train settings the probe itself decides (steps, sequence length, seeds).
PROBE_TRAIN_KEYS = ("tokens", "seq_len", "seed")


@dataclass(frozen=True)
class MQARSpec(Spec):
    """An MQAR study as asked for: ``models`` (registered ``NAME``, ``NAME:ARM`` or anchor arms) x ``kvs``
    x ``seeds``; the task (``vocab_kv``, ``queries``, ``seq_len``, ``n_train``, ``n_test``), the training
    (``steps``, ``batch_size``, ``settings``: TrainConfig or model-config fields for every run), the
    model (``preset``, ``width``, ``arm_model``) and the lr sweep (``lr_grid``)."""

    models: tuple = DEFAULT_MODELS
    kvs: tuple = DEFAULT_KVS
    seeds: tuple = DEFAULT_SEEDS
    preset: str = "tiny"
    width: int | None = None
    steps: int = 1500
    batch_size: int = 256
    vocab_kv: int = 64
    queries: int | None = None
    seq_len: int | None = None
    n_train: int = 4096
    n_test: int = 1024
    arm_model: str = "study"
    settings: dict = dataclasses.field(default_factory=dict)
    lr_grid: tuple | str | None = None


@dataclass(frozen=True)
class MQARStudy:
    """A planned MQAR study (:func:`plan_study`): the spec's settings split into train and model overrides."""

    models: list[str]
    kvs: list[int]
    seeds: list[int]
    preset: str = "tiny"
    width: int | None = None
    steps: int = 1500
    batch_size: int = 256
    vocab_kv: int = 64
    queries: int | None = None
    seq_len: int | None = None
    n_train: int = 4096
    n_test: int = 1024
    arm_model: str = "study"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)
    lr_grid: list | None = None  # rates swept per (model, kv) before the seeds; None: one rate for all

    def task(self, kv: int) -> MQARTask:
        return MQARTask(
            kv=kv,
            vocab_kv=self.vocab_kv,
            queries=self.queries,
            seq_len=self.seq_len,
            n_train=self.n_train,
            n_test=self.n_test,
        ).validate()

    def train_config(self, task: MQARTask, seed: int):
        return probe_train_config(
            batch_size=self.batch_size,
            seq_len=task.length,
            seed=seed,
            lr=1e-3,
            steps=self.steps,
            overrides=self.train_overrides,
        )


def _integers(values, what: str) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ValueError(f"{what} must be a non-empty list of integers, got {values!r}")
    return values


def plan_study(spec: MQARSpec) -> MQARStudy:
    """Check every model (registered ``NAME``, ``NAME:ARM`` or an anchor arm), the task and every
    setting of ``spec`` and plan the study."""
    from drmlab.models import list_models
    from drmlab.models.registry import config_fields
    from drmlab.training.config import split_overrides

    models = [str(m).strip() for m in spec.models]
    if not models or not all(models):
        raise ValueError("models: give at least one name, and no empty ones")
    known = set(list_models()) | set(ANCHOR_ARMS)
    fields: set = set()  # every model's config keys, for the settings
    for name in models:
        if name.partition(":")[0] not in known:
            raise ValueError(f"unknown model {name!r}{suggest(name, known)}; anchor arms: {', '.join(ANCHOR_ARMS)}")
        registry, kw = registry_entry(name)
        fields |= set(config_fields(registry, spec.preset, 2 * spec.vocab_kv + 2, **kw))  # a bad arm fails now
    kvs, seeds = _integers(spec.kvs, "kvs"), _integers(spec.seeds, "seeds")
    if spec.arm_model not in ARM_MODELS:
        raise ValueError(f"arm_model must be one of {ARM_MODELS}, got {spec.arm_model!r}")
    if spec.steps <= 0:
        raise ValueError(f"steps must be positive, got {spec.steps}")
    train_kw, model_kw = split_overrides(spec.settings, fields) if spec.settings else ({}, {})
    for key in PROBE_TRAIN_KEYS:
        if key in train_kw:
            raise ValueError(f"the train setting {key!r} is the probe's own (its steps, seq_len and seeds decide it)")
    lr_grid = None
    if spec.lr_grid is not None:
        lr_grid = lr_sweep.parse_lr_grid(spec.lr_grid)
        if "lr" in train_kw:
            raise ValueError("give one learning rate (lr) or a grid to sweep (lr_grid), not both")
    study = MQARStudy(
        models=models,
        kvs=kvs,
        seeds=seeds,
        preset=spec.preset,
        width=spec.width,
        steps=spec.steps,
        batch_size=spec.batch_size,
        vocab_kv=spec.vocab_kv,
        queries=spec.queries,
        seq_len=spec.seq_len,
        n_train=spec.n_train,
        n_test=spec.n_test,
        arm_model=spec.arm_model,
        model_overrides=model_kw,
        train_overrides=train_kw,
        lr_grid=lr_grid,
    )
    for kv in kvs:
        study.train_config(study.task(kv), seeds[0])  # validate early
    return study


# The generator stream of a sweep's held-out sequences when training uses fresh ones (a two-entry seed
# never equals the training batches' three-entry seeds nor the integer seeds of the fixed sets).
TUNING_STREAM = 7919


def tuning_sets(task: MQARTask, seed: int):
    """(training sequences or None for fresh ones, held-out sequences) of a sweep run: the last tenth
    of the training set is held out; with fresh training sequences, ``n_test`` of a stream of their own."""
    from drmlab.experiments.mqar.task import generate

    if task.n_train == 0:
        return None, generate(task, task.n_test, [seed, TUNING_STREAM])
    x, y = train_set(task, seed)
    hold = max(1, task.n_train // 10)
    if hold >= task.n_train:
        raise ValueError(f"n_train={task.n_train} is too small to hold out sweep sequences")
    return (x[:-hold], y[:-hold]), (x[-hold:], y[-hold:])


def run_one(
    study: MQARStudy,
    runtime: Runtime,
    out: Path,
    name: str,
    kv: int,
    seed: int,
    *,
    lr: float | None = None,
    tuning: bool = False,
) -> dict:
    """Train and score one (model, kv, seed) cell; reuse ``result.json`` when its settings match.
    ``lr`` overrides the study's rate; ``tuning``: a sweep run, scored on held-out training sequences
    (:func:`tuning_sets`) instead of the test set."""
    from drmlab.models.registry import spec_path_name
    from drmlab.runs import RunDir, write_json_atomic
    from drmlab.training.trainer import train

    task = study.task(kv)
    cfg = study.train_config(task, seed)
    if lr is not None:
        cfg = dataclasses.replace(cfg, lr=lr).validate()
    run_dir = (
        out / "tuning" / f"{spec_path_name(name)}_kv{kv}_lr{lr_sweep.lr_label(cfg.lr)}"
        if tuning
        else out / "runs" / f"{spec_path_name(name)}_kv{kv}_s{seed}"
    )
    spec = jsonable(
        {
            "model": name,
            "preset": study.preset,
            "width": study.width,
            "arm_model": study.arm_model,
            "overrides": study.model_overrides,
            "task": dataclasses.asdict(task),
            "train": dataclasses.asdict(cfg),
            **({"tuning": True} if tuning else {}),
        }
    )
    result_path = run_dir / "result.json"
    if result_path.is_file():
        saved = json.loads(result_path.read_text())
        if with_train_defaults(saved.get("spec")) == spec:  # settings added since at their defaults
            if "test_by_query" not in saved:  # written before per-query accuracy: score the saved weights
                model = build(name, study.preset, task, seed, study.width, study.model_overrides, study.arm_model)[0]
                RunDir(run_dir).load_checkpoint(model)
                test = accuracy(model, *test_set(task, seed))
                if test["correct"] != saved["test_correct"]:
                    raise RuntimeError(
                        f"{run_dir}: the saved weights score {test['correct']} test queries, "
                        f"result.json says {saved['test_correct']}"
                    )
                saved["test_by_query"] = test["by_query"]
                write_json_atomic(result_path, saved)
            return dict(saved, reused=True)
    model, registry, kw = build(name, study.preset, task, seed, study.width, study.model_overrides, study.arm_model)
    fresh = task.n_train == 0
    if tuning:
        fit, (x_test, y_test) = tuning_sets(task, seed)
        x_train, y_train = (None, None) if fresh else fit
    else:
        x_train, y_train = (None, None) if fresh else train_set(task, seed)
        x_test, y_test = test_set(task, seed)
    batches = FreshMQARBatches(task, cfg.batch_size) if fresh else FixedSetBatches(x_train, y_train, cfg.batch_size)
    t0 = pauses.now()
    summary = train(
        model,
        batches,
        None,
        cfg,
        run_dir,
        overwrite=True,
        run_info=RunInfo(
            name,
            study.preset,
            kw,
            registry_model=registry,
            study={"mqar": dataclasses.asdict(task), "arm_model": study.arm_model},
        ),
        device=runtime.device,
        quiet=runtime.quiet,
        tensorboard=runtime.tensorboard,
    )
    wall = pauses.now() - t0
    test = accuracy(model, x_test, y_test)
    train_acc = {"acc": None} if fresh else accuracy(model, x_train, y_train)
    result = {
        "model": name,
        "registry_model": registry,
        "overrides": jsonable(kw),
        "kv": kv,
        "seed": seed,
        "params": summary["params"],
        "steps": summary["steps"],
        "final_loss": summary["final_loss"],
        "test_acc": test["acc"],
        "test_correct": test["correct"],
        "test_queries": test["total"],
        "test_by_query": test["by_query"],
        "train_acc": train_acc["acc"],
        "chance": task.chance,
        "seq_len": task.length,
        "lr": cfg.lr,
        "train_seconds": summary["train_seconds"],
        "seconds_per_step": summary["train_seconds"] / max(summary["steps"], 1),
        "wall_seconds": wall,
        "spec": spec,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def anchor_comparable(study: MQARStudy) -> bool:
    """Whether the anchor arms of ``study`` are the study's model on the study's task (steps and
    batch may differ; the table states them)."""
    default = MQARTask()
    return (
        study.vocab_kv == default.vocab_kv
        and study.queries is None
        and study.seq_len is None
        and study.n_train == default.n_train
        and study.n_test == default.n_test
        and study.width in (None, ARM_BASE["d_model"])
        and study.arm_model == "study"
        and not study.model_overrides
    )


def summarize(study: MQARStudy, results: list[dict]) -> dict:
    """The study's numbers: per model and kv the test accuracy mean +- population std over seeds,
    first-query and per-query means, train accuracy, chance and the anchor value; the levels; the runs;
    the provenance (:func:`drmlab.experiments.results.provenance`)."""
    comparable = anchor_comparable(study)
    models: dict[str, dict] = {}
    for name in study.models:
        cells = {}
        for kv in study.kvs:
            rows = [r for r in results if r["model"] == name and r["kv"] == kv]
            if not rows:
                continue
            accs = [r["test_acc"] for r in rows]
            acc_mean, acc_std = mean_std(accs)
            by_query = [r["test_by_query"] for r in rows if r.get("test_by_query")]
            first_mean, first_std = mean_std([q[0] for q in by_query]) if by_query else (None, None)
            cells[str(kv)] = {
                "acc_mean": acc_mean,
                "acc_std": acc_std,
                "n_seeds": len(rows),
                "accs": accs,
                "first_query_mean": first_mean,
                "first_query_std": first_std,
                "by_query_mean": [mean(col) for col in zip(*by_query)] if by_query else None,
                "seeds": [r["seed"] for r in rows],
                "train_acc_mean": (
                    None if any(r["train_acc"] is None for r in rows) else mean_std([r["train_acc"] for r in rows])[0]
                ),
                "chance": rows[0]["chance"],
                "anchor_acc": ANCHOR_ACC.get((name, kv)) if comparable else None,
                "seconds_per_step": mean_std([r["seconds_per_step"] for r in rows])[0],
                "params": rows[0]["params"],
                "lr": rows[0].get("lr"),
            }
        models[name] = {"cells": cells}
    levels = {
        str(kv): {
            "chance": study.task(kv).chance,
            "context_guess": study.task(kv).context_guess,
            "elimination_guess": study.task(kv).elimination_guess,
        }
        for kv in study.kvs
    }
    from drmlab.experiments.results import provenance

    settings = jsonable(dataclasses.asdict(study))
    return {
        "provenance": provenance(settings),
        "study": settings,
        "chance": 1.0 / study.vocab_kv,
        "levels": levels,
        "models": models,
        "runs": [{k: v for k, v in r.items() if k != "spec"} for r in results],
    }


def sweep_one(study: MQARStudy, runtime: Runtime, out: Path, name: str, kv: int) -> dict:
    """The learning-rate sweep of one (model, kv): each rate trained on the first seed and scored on
    held-out training sequences (accuracy, higher is better); a rate whose run diverged scores None."""
    from drmlab.training.trainer import NonFiniteLossError

    scores = {}
    for lr in study.lr_grid:
        try:
            r = run_one(study, runtime, out, name, kv, study.seeds[0], lr=lr, tuning=True)
            scores[lr] = r["test_acc"]
        except NonFiniteLossError as exc:
            scores[lr] = None
            runtime.say(f"mqar sweep {name} kv={kv} lr {lr:g}: diverged ({str(exc).split(';')[0]})")
            continue
        runtime.say(
            f"mqar sweep {name} kv={kv} lr {lr:g}: held-out acc {100 * r['test_acc']:.1f}%"
            + (" (reused)" if r.get("reused") else "")
        )
    choice = lr_sweep.choose(scores, lower_is_better=False)
    return {"scores": {lr_sweep.lr_label(lr): v for lr, v in scores.items()}, "complete": True, **choice}


def run_planned(study: MQARStudy, runtime: Runtime, out: str | Path) -> dict:
    """Train (or reuse) every (model, kv, seed) of ``study`` (after its lr sweep, when it has a grid),
    then summarize and report; the summary."""
    runtime.apply_threads()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results, sweeps = [], {}
    for name in study.models:
        for kv in study.kvs:
            lr = None
            if study.lr_grid:
                sweep = sweeps[f"{name} kv={kv}"] = sweep_one(study, runtime, out, name, kv)
                if sweep["lr"] is None:
                    runtime.say(f"mqar {name} kv={kv}: every rate of its sweep diverged, no seeds trained")
                    continue
                lr = sweep["lr"]
            for seed in study.seeds:
                r = run_one(study, runtime, out, name, kv, seed, lr=lr)
                results.append(r)
                runtime.say(
                    f"mqar {name} kv={kv} seed={seed}: test acc {100 * r['test_acc']:.1f}% (chance "
                    f"{100 * r['chance']:.1f}%), train acc {report.percent(r['train_acc'])}, "
                    f"{r['seconds_per_step']:.3f} s/step" + (" (reused)" if r.get("reused") else "")
                )
    summary = summarize(study, results)
    if sweeps:
        summary["lr_sweep"] = sweeps
    report.write_report(summary, out, log=runtime.log)
    return summary


def run_study(spec: MQARSpec, runtime: Runtime, out: str | Path) -> dict:
    """Plan ``spec`` (:func:`plan_study`) and run the study (:func:`run_planned`); the summary."""
    return run_planned(plan_study(spec), runtime, out)
