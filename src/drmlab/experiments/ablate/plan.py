"""Planning an ablation study (docs/drm.md section A.7): :func:`plan_study` checks every name and setting
of a :class:`~drmlab.experiments.spec.StudySpec` on the meta device, before any data is read, and
resolves the budget and the train config; :func:`record_study` writes ``study.json`` and refuses a
rerun under other settings (more models or seeds may be added; the lr grid may change until the
first paired run starts)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate.study import STUDY_FILE, Study
from drmlab.experiments.spec import StudySpec
from drmlab.naming import suggest
from drmlab.training.config import TRAIN_DEFAULTS, TRAIN_KEYS, parse_tokens, resolve_train_config, split_overrides

DEFAULT_TOKENS = 5_005_312  # the reference: 611 steps of 8,192 tokens
# Train settings that only change the final rescoring: a rerun may change them.
RESCORING_KEYS = ("eval_tokens", "eval_batch_size")
# Model settings are checked on a byte-vocabulary build: no setting name depends on the vocabulary.
CHECK_VOCAB = 256


# train settings added after studies were recorded: a study's record leaves them out at their default
ADDED_LATER = ("steps", "bf16_memory_products", "recipe")
# a train setting --fast gained after studies were run with it: how to continue such a study as it ran
LATER_FAST = {
    "bf16_memory_products": " (--fast now includes it, docs/drm.md A.4.7; --set bf16_memory_products=false "
    "continues the study as it ran)"
}


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
    rates = None if spec.rates is None else _check_rates(spec.rates, models, lr_grid, train_kw)
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
        # settings added after the first studies are left out at their value of before (a budget in tokens:
        # no ``steps``; float32 memory products), as the records made before them do
        train={
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if k != "seed" and not (k in ADDED_LATER and v == TRAIN_DEFAULTS[k])
        },
        model_overrides={label: kw for label, kw in overrides.items() if kw},
        data_source=spec.data,
        tokenizer=spec.tokenizer or "bytes",
        registry_names={label: name for label, (name, _) in entries.items() if name != label},
        lr_grid=lr_grid,
        tune_tokens=tune_tokens if lr_grid is not None else None,
        rates=rates,
    )


def _check_rates(rates: dict, models: list[str], lr_grid, train_kw: dict) -> dict[str, float]:
    """Each model's paired-run rate, checked: one per model, each a finite number above 0, instead of a
    shared ``lr`` and a grid."""
    import math

    if lr_grid is not None or "lr" in train_kw:
        raise ValueError("give one of: a learning rate (lr), a grid to sweep (lr_grid), each model's rate (rates)")
    missing = [m for m in models if m not in rates]
    extra = [m for m in rates if m not in models]
    if missing or extra:
        raise ValueError(
            "rates: one per model of the study"
            + (f"; none for {', '.join(missing)}" if missing else "")
            + (f"; {', '.join(map(str, extra))} not among the models" if extra else "")
        )
    checked = {}
    for model in models:
        value = rates[model]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"rates: {model}'s rate must be a finite number above 0, got {value!r}")
        checked[model] = float(value)
    return checked


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
        **({"rates": study.rates} if study.rates is not None else {}),  # absent from the records before it
    }


def _has_started(out: Path, model: str) -> bool:
    """Whether any sweep run or paired run of ``model`` has begun in the study at ``out``."""
    from drmlab.models.registry import spec_path_name

    name = spec_path_name(model)
    started = [*(out / "runs").glob(f"{name}-seed*"), *(out / "tuning").glob(f"{name}-lr*")]
    return any((p / "config.json").is_file() for p in started)


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
        if saved.get("rates") is not None and "rates" not in record:
            problems.append(f"rates: {saved['rates']!r} in the study, none now")
        if study.lr_grid is not None and saved.get("lr_grid") not in (None, study.lr_grid) and not regrid:
            problems.append("(the lr grid can change only before the first paired run starts)")
        saved_train = saved.get("train", {})
        # the recipe first (its settings follow it); a setting left out (ADDED_LATER) is at its default
        for k in dict.fromkeys(["recipe", *record["train"], *saved_train]):
            before = saved_train.get(k, TRAIN_DEFAULTS.get(k))  # a setting added later had its default
            v = record["train"].get(k, TRAIN_DEFAULTS.get(k))
            if k not in RESCORING_KEYS and before != v:
                problems.append(f"{k}: {before!r} in the study, {v!r} now" + LATER_FAST.get(k, ""))
        for model, overrides in study.model_overrides.items():
            before = saved.get("model_overrides", {}).get(model)
            if before is not None and before != overrides:
                problems.append(f"{model} settings: {before!r} in the study, {overrides!r} now")
            elif before is None and overrides and _has_started(out, model):
                # a model may gain settings only before it trains: its runs so far were made without them
                problems.append(f"{model} settings: none in the study, {overrides!r} now (its runs have started)")
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
