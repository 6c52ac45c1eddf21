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
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate import report as ablate_report
from drmlab.experiments.spec import DEFAULT_MODELS, DEFAULT_SEEDS, Log, Runtime, StudySpec  # noqa: F401 (re-exported)
from drmlab.experiments.stats import GATE_RULE, gate, mean_std
from drmlab.naming import suggest
from drmlab.training.config import TRAIN_DEFAULTS, TRAIN_KEYS, parse_tokens, resolve_train_config, split_overrides
from drmlab.training.run_info import DataInfo, RunInfo

DEFAULT_TOKENS = 5_005_312  # the reference: 611 steps of 8,192 tokens
STUDY_FILE = "study.json"
# Train settings that only change the final rescoring: a rerun may change them.
RESCORING_KEYS = ("eval_tokens", "eval_batch_size")
# Model settings are checked on a byte-vocabulary build: no setting name depends on the vocabulary.
CHECK_VOCAB = 256


@dataclasses.dataclass(frozen=True)
class Study:
    """A planned study (:func:`plan_study`): every label trains once per seed under one train config;
    what ``study.json`` records."""

    models: list[str]  # labels, in report order
    seeds: list[int]
    preset: str
    train: dict  # TrainConfig fields except the seed
    model_overrides: dict[str, dict]  # label -> model settings (only labels that have some)
    data_source: str | None
    tokenizer: str
    # label -> registered name where they differ (NAME:ARM specs, the loop study's arms)
    registry_names: dict[str, str] = dataclasses.field(default_factory=dict)
    lr_grid: list[float] | None = None  # sweep these rates per model first (None: train["lr"] for all)
    tune_tokens: int | None = None  # budget of each sweep run (None: the study's budget)

    def registry_name(self, label: str) -> str:
        return self.registry_names.get(label, label)

    @property
    def tune_seed(self) -> int:
        return self.seeds[0]


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


def tuning_dir(out: str | Path, label: str, lr: float) -> Path:
    """Where the sweep run of ``label`` at rate ``lr`` lives."""
    from drmlab.models.registry import spec_path_name

    return Path(out) / "tuning" / f"{spec_path_name(label)}-lr{lr_sweep.lr_label(lr)}"


def run_dir(out: str | Path, label: str, seed: int) -> Path:
    """Where the run of ``label`` at ``seed`` lives."""
    from drmlab.models.registry import spec_path_name

    return Path(out) / "runs" / f"{spec_path_name(label)}-seed{seed}"


# ---------------------------------------------------------------- planning


def distinct_names(names, what: str) -> list[str]:
    """``names`` as a list; an empty list or a repeated name is an error naming ``what``."""
    names = [str(n).strip() for n in names]
    if not names or not all(names):
        raise ValueError(f"{what}: give at least one name, and no empty ones")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} lists a name twice: {', '.join(names)}")
    return names


def check_seeds(seeds) -> list[int]:
    """``seeds`` as a list of distinct non-negative integers."""
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds lists a seed twice: {seeds!r}")
    return seeds


def plan_study(spec: StudySpec) -> Study:
    """Check every name and setting of ``spec`` (meta-device builds: no data, no training) and plan it:
    the budget (default :data:`DEFAULT_TOKENS`), the resolved train config, each label's model settings."""
    from drmlab.models.registry import config_fields, parse_model_spec

    models = distinct_names(spec.models, "models")
    seeds = check_seeds(spec.seeds)
    preset = spec.preset
    registry_names = dict(spec.registry_names)
    entries = {
        label: (registry_names[label], {}) if label in registry_names else parse_model_spec(label) for label in models
    }
    overrides = {label: dict(kw) for label, (_, kw) in entries.items()}
    for label, settings in spec.model_settings.items():
        if label not in entries:
            raise ValueError(
                f"model settings for {label!r}, which is not one of the study's models"
                f"{suggest(label, models)}; models: {', '.join(models)}"
            )
        for key in settings:
            if key in TRAIN_KEYS:
                raise ValueError(f"{label}.{key}: {key!r} is a train setting, the same for every model")
        _, model_kw = split_overrides(settings, config_fields(entries[label][0], preset, CHECK_VOCAB))
        overrides[label].update(model_kw)
    train = dict(spec.train)
    if "seed" in train:
        raise ValueError("the seed of each run is one of the study's seeds, not a train setting")
    train_kw, _ = split_overrides(train, ())  # an unknown key names the nearest train setting
    budget = DEFAULT_TOKENS if spec.tokens is None else parse_tokens(spec.tokens)
    cfg = resolve_train_config(preset, **{"tokens": budget, **train_kw})
    lr_grid, tune_tokens = spec.lr_grid, spec.tune_tokens
    if lr_grid is not None:
        lr_grid = lr_sweep.parse_lr_grid(lr_grid)
        if "lr" in train_kw:
            raise ValueError("give one learning rate (lr) or a grid to sweep (lr_grid), not both")
        tune_tokens = budget if tune_tokens is None else parse_tokens(tune_tokens)
        resolve_train_config(
            preset,
            **{
                **train_kw,
                "tokens": tune_tokens,
                "lr": lr_grid[0],  # a budget too small fails now
                "milestones": None,
            },
        )
    elif tune_tokens is not None:
        raise ValueError("tune_tokens is the budget of the lr sweep: give lr_grid too")
    for label in models:  # a bad arm or setting fails now, not after the first runs
        fields = config_fields(entries[label][0], preset, CHECK_VOCAB, **overrides[label])
        limit = fields.get("n_positions")
        if isinstance(limit, int) and cfg.seq_len > limit:
            raise ValueError(
                f"seq_len {cfg.seq_len} exceeds {label}'s n_positions={limit}; "
                f"raise the model setting {label}.n_positions to {cfg.seq_len}"
            )
    return Study(
        models=models,
        seeds=seeds,
        preset=preset,
        # a budget in tokens leaves ``steps`` out (None), as the records made before that setting existed do
        train={k: v for k, v in dataclasses.asdict(cfg).items() if k != "seed" and not (k == "steps" and v is None)},
        model_overrides={label: kw for label, kw in overrides.items() if kw},
        data_source=spec.data,
        tokenizer=spec.tokenizer or "bytes",
        registry_names={label: name for label, (name, _) in entries.items() if name != label},
        lr_grid=lr_grid,
        tune_tokens=tune_tokens if lr_grid is not None else None,
    )


def study_record(study: Study, data_meta: dict) -> dict:
    """What ``study.json`` records of ``study`` besides its models, seeds and model settings."""
    return {
        "preset": study.preset,
        "train": study.train,
        "data_source": study.data_source,
        "tokenizer": study.tokenizer,
        "content_sha256": data_meta.get("content_sha256"),
        "lr_grid": study.lr_grid,
        "tune_tokens": study.tune_tokens,
        "tune_seed": study.tune_seed if study.lr_grid else None,
    }


def record_study(out: Path, study: Study, data_meta: dict) -> None:
    """Write ``out/study.json``; a study already there must have the same settings (it may gain
    models and seeds, and its lr grid may change until the first paired run starts)."""
    from drmlab.runs import read_json, write_json_atomic

    path = out / STUDY_FILE
    record = study_record(study, data_meta)
    if path.is_file():
        saved = read_json(path)
        # The grid may still change (gain or lose rates) while no paired run has started: the choice
        # is made only when a model's paired runs begin, and finished sweep runs are kept.
        regrid = (
            saved.get("lr_grid") is not None
            and study.lr_grid is not None
            and not any((p / "config.json").is_file() for p in (out / "runs").glob("*"))
        )
        problems = [
            f"{k}: {saved.get(k)!r} in the study, {v!r} now"
            for k, v in record.items()
            if k != "train"
            and saved.get(k) != v  # a study from before sweeps has no lr_grid: None
            and not (regrid and k == "lr_grid")
        ]
        if study.lr_grid is not None and saved.get("lr_grid") not in (None, study.lr_grid) and not regrid:
            problems.append("(the lr grid can change only before the first paired run starts)")
        saved_train = saved.get("train", {})
        for k, v in record["train"].items():
            before = saved_train.get(k, TRAIN_DEFAULTS.get(k))  # a setting added later had its default
            if k not in RESCORING_KEYS and before != v:
                problems.append(f"{k}: {before!r} in the study, {v!r} now")
        for model, overrides in study.model_overrides.items():
            before = saved.get("model_overrides", {}).get(model)
            if before is not None and before != overrides:
                problems.append(f"{model} settings: {before!r} in the study, {overrides!r} now")
        if problems:
            raise ValueError(
                f"{out} holds a study with other settings (give it another output folder): " + "; ".join(problems)
            )
        models = list(dict.fromkeys(saved.get("models", []) + study.models))
        seeds = sorted(set(saved.get("seeds", [])) | set(study.seeds))
        overrides = {**saved.get("model_overrides", {}), **study.model_overrides}
    else:
        models, seeds, overrides = study.models, study.seeds, study.model_overrides
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(record, models=models, seeds=seeds, model_overrides=overrides))


# ---------------------------------------------------------------- running


def run_study(spec: StudySpec, runtime: Runtime, out: str | Path, *, corpus=None, sweep_only: bool = False) -> dict:
    """Plan ``spec`` (:func:`plan_study`), run or resume it (:func:`run_planned`) and report; the results."""
    return run_planned(plan_study(spec), runtime, out, corpus=corpus, sweep_only=sweep_only)


def run_planned(study: Study, runtime: Runtime, out: str | Path, *, corpus=None, sweep_only: bool = False) -> dict:
    """Run (or resume) the sweep runs, then every (seed, model) of ``study``; collect and report.
    ``sweep_only``: stop after the sweep runs (the same call without it goes on with the paired runs).

    ``corpus``: the loaded :class:`~drmlab.data.TokenCorpus` of ``study.data_source`` (loaded here, with
    ``runtime.cache_dir``, when None). ``runtime.log`` receives one line per run (skipped, resuming,
    training, its val CE). A run that another process holds is left to it; this process waits
    ``runtime.wait_seconds`` between looks until every run is finished (a model's paired runs wait for
    its whole sweep).
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
            status = _train_one(study, runtime, out, job, tuning if job.tuning else paired, label, lr=lr)
            if status != "done":
                left.append(job)
                if status == "locked" and job not in waiting_logged:
                    runtime.say(f"{label}: held by another process, left to it")
                    waiting_logged.add(job)
        if left and len(left) == len(todo):  # nothing this process can do now: the rest is held elsewhere
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


def sweep_results(out: str | Path, study: Study | dict) -> dict[str, dict]:
    """Each model's sweep so far: ``{model: {"scores": {rate label: tuning CE or None}, "complete":
    every rate finished or diverged, "lr": the chosen rate (None until complete), "edge", "edge_side",
    "diverged"}}``; {} for a study without a grid."""
    from drmlab.runs import RunDir

    grid = study.lr_grid if isinstance(study, Study) else study.get("lr_grid")
    models = study.models if isinstance(study, Study) else study["models"]
    if not grid:
        return {}
    sweeps = {}
    for model in models:
        scores, finished = {}, 0
        for lr in grid:
            run = RunDir(tuning_dir(out, model, lr))
            summary = run.read_summary() or {}
            done = summary.get("finished") and summary.get("val_ce") is not None
            stopped = summary.get("stopped") in ("non-finite", "diverged")
            scores[lr] = summary["val_ce"] if done else None
            finished += bool(done or stopped)
        complete = finished == len(grid)
        choice = lr_sweep.choose(scores) if complete else {"lr": None, "edge": False, "edge_side": None, "diverged": []}
        sweeps[model] = {
            "scores": {lr_sweep.lr_label(lr): v for lr, v in scores.items()},
            "complete": complete,
            **choice,
        }
    return sweeps


# ---------------------------------------------------------------- results


def collect_runs(out: str | Path, study: dict) -> list[dict]:
    """Every finished run of the recorded ``study`` under ``out/runs``, with its curves (training loss and
    sampled validation CE, downsampled: :func:`drmlab.experiments.results.curves`)."""
    from drmlab.experiments.results import curves
    from drmlab.runs import RunDir

    runs = []
    for model in study["models"]:
        for seed in study["seeds"]:
            run = RunDir(run_dir(out, model, seed))
            summary = run.finished_summary()
            if summary is None:
                continue
            rows = run.read_metrics()
            milestones = [(r["tokens"], r["val_ce"], r["val_bpb"]) for r in rows if r.get("kind") == "milestone"]
            runs.append(
                {
                    "model": model,
                    "seed": seed,
                    "params": summary["params"],
                    "val_ce": summary["val_ce"],
                    "val_bpb": summary["val_bpb"],
                    "tokens": summary["tokens"],
                    "tokens_per_s": summary["tokens_per_s"],
                    "train_seconds": summary["train_seconds"],
                    "curves": curves(rows),
                    "milestones": milestones,
                }
            )
    return runs


def _milestone_means(rows: list[dict]) -> list[dict]:
    """Mean +- std over seeds of the rescored CE and bits/byte at each milestone every run reached."""
    marks = sorted({t for r in rows for t, _, _ in r.get("milestones", [])})
    out = []
    for tokens in marks:
        values = [(ce, bpb) for r in rows for t, ce, bpb in r.get("milestones", []) if t == tokens]
        if len(values) == len(rows):
            ce, ce_std = mean_std([v[0] for v in values])
            bpb, bpb_std = mean_std([v[1] for v in values])
            out.append(
                {
                    "tokens": tokens,
                    "ce_mean": ce,
                    "ce_std": ce_std,
                    "bpb_mean": bpb,
                    "bpb_std": bpb_std,
                    "n_seeds": len(values),
                }
            )
    return out


def summarize(runs: list[dict], models: list[str]) -> tuple[dict, list[dict]]:
    """(per-model statistics, the gate for every ordered pair of models with runs)."""
    per_model = {}
    for model in models:
        rows = [r for r in runs if r["model"] == model]
        if not rows:
            continue
        ce_mean, ce_std = mean_std([r["val_ce"] for r in rows])
        bpb_mean, bpb_std = mean_std([r["val_bpb"] for r in rows])
        speeds = [r["tokens_per_s"] for r in rows if r["tokens_per_s"]]
        per_model[model] = {
            "params": rows[0]["params"],
            "n_seeds": len(rows),
            "ce_mean": ce_mean,
            "ce_std": ce_std,
            "ce_min": min(r["val_ce"] for r in rows),
            "ce_max": max(r["val_ce"] for r in rows),
            "bpb_mean": bpb_mean,
            "bpb_std": bpb_std,
            "tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
            "per_seed": {r["seed"]: r["val_ce"] for r in rows},
            "milestones": _milestone_means(rows),
        }
    gates = []
    for cand in per_model:
        for base in per_model:
            if cand != base:
                gates.append(
                    dict(
                        candidate=cand, baseline=base, **gate(per_model[cand]["per_seed"], per_model[base]["per_seed"])
                    )
                )
    return per_model, gates


def collect_results(out: str | Path) -> dict:
    """The study under ``out`` as numbers: its record, per-model statistics, runs, gates, completeness, and
    the provenance of this collection (:func:`drmlab.experiments.results.provenance`)."""
    from drmlab.experiments.results import provenance
    from drmlab.runs import read_json

    study = read_json(Path(out) / STUDY_FILE)
    runs = collect_runs(out, study)
    per_model, gates = summarize(runs, study["models"])
    sweeps = sweep_results(out, study)
    for model, stats in per_model.items():
        stats["lr"] = sweeps[model]["lr"] if sweeps else study["train"]["lr"]
    results = {
        "provenance": provenance(study),
        "study": study,
        "models": per_model,
        "runs": runs,
        "gate": gates,
        "gate_rule": dict(GATE_RULE),
        "complete": len(runs) == len(study["models"]) * len(study["seeds"]),
    }
    if sweeps:
        results["lr_sweep"] = sweeps
    return results


def write_results(out: str | Path, log: Log | None = None) -> dict:
    """(Re)write the report of the finished runs under ``out``; return the results."""
    results = collect_results(out)
    ablate_report.write_report(results, out, log=log)
    return results
