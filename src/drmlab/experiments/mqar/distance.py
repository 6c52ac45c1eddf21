r"""The distance MQAR protocol (docs/mqar.md section 8; the upstream project's recall-over-distance
test): train on a 40-token recall task, then ask for the same eight associations after L - 40 tokens
of filler, for L up to 32,768, reading long sequences at constant memory. The pair count P is a setting
(``pairs``, 1-32, default 8; section 8.2): the control is then 5P tokens and each length P x n_eval targets.

Its parts, one job each: the task and its random draws (:mod:`~drmlab.experiments.mqar.distance_task`:
:func:`draw_example`, :func:`split_tokens`), the reading of one length at constant memory
(:mod:`~drmlab.experiments.mqar.distance_read`: :func:`read_scored`, :func:`read_length`), the Wilson
intervals and the gates (:mod:`~drmlab.experiments.mqar.distance_gates`), the study as asked for and
planned (:mod:`~drmlab.experiments.mqar.distance_plan`: :class:`DistanceSpec`, :func:`plan_study`) and
the report (:mod:`drmlab.experiments.mqar.distance_report`). Every name of those modules but the
report's is importable from here too. Without ``read_all`` the long lengths of a model whose control
failed are not read.

**Training** (this module, :func:`train_one`): the control (40 tokens at 8 pairs) through the ordinary trainer, AdamW
with weight decay 0.01 on every tensor, constant learning rate, clip 1.0, fresh batches; at each
milestone the run stops with a checkpoint, the control accuracy is measured and the run resumes. Each
run's files and ``result.json`` sit in ``OUT/runs/<model>_s<seed>/``; a finished milestone or length
whose settings match is reused, so a rerun skips what is done. A run directory from elsewhere
(``ckpts``) is evaluated through the same reads (:func:`evaluate_ckpt`), its results in
``OUT/evals/<name>/result.json``; :func:`summarize` gathers the study's numbers and its gate verdicts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn as nn

from drmlab.experiments.mqar import controls as recall_controls
from drmlab.experiments.mqar import distance_report
from drmlab.experiments.mqar.distance_gates import (  # noqa: F401 (re-exported)
    GATE_THRESHOLD,
    STATE_GROWTH_LIMIT,
    WILSON_Z,
    gate_verdicts,
    wilson_interval,
)
from drmlab.experiments.mqar.distance_plan import (  # noqa: F401 (re-exported)
    DEFAULT_BATCH_SIZE,
    DEFAULT_LENGTHS,
    DEFAULT_LR,
    DEFAULT_MILESTONES,
    DEFAULT_MODELS,
    DEFAULT_N_EVAL,
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    DistanceSpec,
    DistanceStudy,
    default_lengths,
    plan_study,
    resolve_model,
    with_default_pairs,
)
from drmlab.experiments.mqar.distance_read import (  # noqa: F401 (re-exported)
    DEFAULT_CHUNK,
    DEFAULT_EVAL_BATCH,
    DEFAULT_EVAL_SEED,
    context_limit,
    decode_state_grows,
    read_length,
    read_scored,
    state_nbytes,
)
from drmlab.experiments.mqar.distance_task import (  # noqa: F401 (re-exported)
    CHANCE,
    CONTEXT_GUESS,
    CONTROL_LENGTH,
    ELIMINATION_GUESS,
    FIRST_FILLER,
    FIRST_KEY,
    FIRST_VALUE,
    IGNORE,
    MARKER,
    MAX_PAIRS,
    N_KEYS,
    N_VALUES,
    PAIRS,
    VOCAB_SIZE,
    DistanceBatches,
    check_length,
    check_pairs,
    context_guess,
    control_length,
    draw_example,
    elimination_guess,
    evaluation_tokens,
    levels,
    scored_positions,
    split_tokens,
    training_tokens,
)
from drmlab.experiments.spec import Runtime
from drmlab.runs import jsonable
from drmlab.training.config import with_train_defaults
from drmlab.training.run_info import RunInfo


def _write(path: Path, result: dict) -> None:
    from drmlab.runs import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, result)


def _read_lengths(study: DistanceStudy, runtime: Runtime, model: nn.Module, result: dict, path: Path) -> None:
    """Fill ``result["lengths"]`` with every length of ``study`` not yet read under its settings;
    the long ones only after a passed control unless ``read_all``; then each length read gets the
    study's recall controls (its ``controls``) not yet read there. Saves after each read."""
    lengths = result.setdefault("lengths", {})
    spec = study.eval_spec()
    for length in study.lengths:
        saved = lengths.get(str(length))
        if saved is None or with_default_pairs(saved.get("spec")) != spec or saved.get("status") not in ("read", "n/a"):
            record = _read_one(study, runtime, model, result, length, None)
            if record is None:  # not authorised
                lengths[str(length)] = {
                    "length": length,
                    "status": "not read",
                    "spec": spec,
                    "why": "the control did not pass (read_all reads anyway)",
                }
                continue
            lengths[str(length)] = dict(record, spec=spec)
            _write(path, result)
        plain = lengths[str(length)]
        if plain.get("status") != "read":
            continue
        controls = plain.setdefault("controls", {})
        for control in study.controls:
            saved = controls.get(control)
            if (
                saved is not None
                and with_default_pairs(saved.get("spec")) == spec
                and saved.get("status") in ("read", "n/a")
            ):
                continue
            controls[control] = dict(_read_one(study, runtime, model, result, length, control), spec=spec)
            _write(path, result)
    _write(path, result)


def _read_one(
    study: DistanceStudy, runtime: Runtime, model: nn.Module, result: dict, length: int, control: str | None
) -> dict | None:
    """One length read plain (``control`` None) or under a recall control, said in one line; None for
    a long plain length that the control did not authorise; a memory control on a model
    without the memory is "n/a" with the reason."""
    lengths = result["lengths"]
    if control is None and length != study.control_length and not study.read_all:
        rec = lengths.get(str(study.control_length)) or {}
        if not (rec.get("status") == "read" and rec["acc"] >= GATE_THRESHOLD):
            return None
    label = result["label"] + ("" if control is None else f" [{control}]")
    why = None if control is None else recall_controls.applies(control, model)
    if why is not None:
        runtime.say(f"mqar-distance {label} L={length}: n/a ({why})")
        return {
            "length": length,
            "n_eval": study.n_eval,
            "eval_seed": study.eval_seed,
            "control": control,
            "status": "n/a",
            "why": why,
        }
    if result.get("context", "unknown") == "unknown":
        result["context"] = context_limit(model)
    record = read_length(
        model,
        length,
        study.n_eval,
        eval_seed=study.eval_seed,
        eval_batch=study.eval_batch,
        chunk=study.chunk,
        context=result["context"],
        control=control,
        pairs=study.pairs,
    )
    if record["status"] == "read":
        lo, hi = record["ci95"]
        flo, fhi = record["first_ci95"]
        bound = ""
        if "bound_acc" in record:
            bound = f"; on the values now bound to the keys {100 * record['bound_acc']:.2f}%"
        runtime.say(
            f"mqar-distance {label} L={length}: {100 * record['acc']:.2f}% [{100 * lo:.2f}, "
            f"{100 * hi:.2f}] ({record['correct']}/{record['total']}), first query {100 * record['first_acc']:.2f}% "
            f"[{100 * flo:.2f}, {100 * fhi:.2f}]{bound}, state {record['state_bytes']:,} B/seq, "
            f"{record['seconds']:.1f} s"
        )
    else:
        runtime.say(f"mqar-distance {label} L={length}: n/a (context {record['context']})")
    return record


def train_one(study: DistanceStudy, runtime: Runtime, out: Path, name: str, seed: int) -> dict:
    """Train ``name`` with ``seed`` on the control (resuming at the last milestone done), measure the
    control at each milestone, then read every length; the run's result (also its ``result.json``)."""
    from drmlab.models import build_model
    from drmlab.models.registry import spec_path_name
    from drmlab.runs import RunDir
    from drmlab.training.trainer import train

    cfg = study.train_config(seed)
    registry, kw = resolve_model(name, study.preset, study.width, study.model_overrides, study.pairs)
    run_dir = out / "runs" / f"{spec_path_name(name)}_s{seed}"
    path = run_dir / "result.json"
    spec = jsonable(
        {
            "model": name,
            "registry_model": registry,
            "preset": study.preset,
            "overrides": kw,
            "train_length": study.control_length,
            "milestones": study.milestones,
            "train": dataclasses.asdict(cfg),
            "pairs": study.pairs,
        }
    )
    result = json.loads(path.read_text()) if path.is_file() else None
    run = RunDir(run_dir)
    # The run directory continues only under the same settings (result.json is written before training).
    continue_run = result is not None and with_train_defaults(with_default_pairs(result.get("spec"))) == spec
    if not continue_run:
        result = {
            "label": f"{name} s{seed}",
            "kind": "trained",
            "model": name,
            "registry_model": registry,
            "seed": seed,
            "spec": spec,
            "milestones": [],
            "lengths": {},
        }
        _write(path, result)
    model = build_model(registry, preset=study.preset, vocab_size=VOCAB_SIZE, seed=seed, **kw)
    done = {m["step"] for m in result["milestones"]}
    batches = DistanceBatches(cfg.batch_size, pairs=study.pairs)
    trained_here = False
    for milestone in study.milestones:
        if milestone in done:
            continue
        resume = continue_run and run.has_checkpoint()
        continue_run = True
        summary = train(
            model,
            batches,
            None,
            cfg,
            run_dir,
            resume=resume,
            overwrite=not resume,
            run_info=RunInfo(
                name,
                study.preset,
                kw,
                registry_model=registry,
                study={
                    "mqar_distance": {
                        "train_length": study.control_length,
                        "milestones": study.milestones,
                        "pairs": study.pairs,
                    }
                },
            ),
            device=runtime.device,
            quiet=runtime.quiet,
            stop_after_step=milestone,
            **({"tensorboard": True} if runtime.tensorboard else {}),
        )
        trained_here = True
        if summary["steps"] != milestone:
            raise RuntimeError(
                f"{run_dir}: training stopped at step {summary['steps']}, expected milestone {milestone}"
            )
        record = read_length(
            model,
            study.control_length,
            study.n_eval,
            eval_seed=study.eval_seed,
            eval_batch=study.eval_batch,
            chunk=study.chunk,
            pairs=study.pairs,
        )
        result["params"] = summary["params"]
        loss = summary["final_loss"]
        if loss is None:  # resumed at the milestone itself (stopped before result.json was written): the logged loss
            loss = next(
                (r["loss"] for r in run.read_metrics() if r.get("kind") == "train" and r["step"] == milestone), None
            )
        result["milestones"].append(
            {
                "step": milestone,
                "loss": loss,
                "train_seconds": summary["train_seconds"],
                **{k: record[k] for k in ("acc", "correct", "total", "ci95", "n_eval", "eval_seed")},
            }
        )
        # the weights changed: every length is read again; the control just was
        result["lengths"] = {str(study.control_length): dict(record, spec=study.eval_spec())}
        _write(path, result)
        lo, hi = record["ci95"]
        loss = "" if loss is None else f", loss {loss:.3f}"
        runtime.say(
            f"mqar-distance {result['label']} step {milestone}: control {100 * record['acc']:.2f}% "
            f"[{100 * lo:.2f}, {100 * hi:.2f}]{loss}"
        )
    if not trained_here:
        state = run.load_checkpoint(model, optimizer=None, restore_rng=False)
        if int(state["step"]) != study.steps:
            raise RuntimeError(
                f"{run_dir}: the checkpoint is at step {state['step']}, result.json says training "
                f"finished at {study.steps}; delete {path} to train again"
            )
    model.to(_device_of(runtime.device))
    result.setdefault("params", sum(p.numel() for p in model.parameters()))
    _read_lengths(study, runtime, model, result, path)
    return result


def _device_of(device) -> torch.device:
    from drmlab.devices import resolve_device

    return resolve_device(str(device) if isinstance(device, torch.device) else device)


def _same_reading(spec):
    """What makes two reads of a checkpoint the same: its pointer (the files' sha256) and the pair count,
    not the folder it was read from (a moved or copied run reuses its reads)."""
    spec = with_default_pairs(spec)
    return {k: v for k, v in spec.items() if k != "ckpt"} if isinstance(spec, dict) else spec


def evaluate_ckpt(study: DistanceStudy, runtime: Runtime, out: Path, ckpt: str | Path) -> dict:
    """Read every length with the weights of the run directory ``ckpt`` (no training); its result,
    kept in ``OUT/evals/<name>/result.json`` and reused while the checkpoint is the same (wherever its folder
    now lies)."""
    from drmlab.runs import RunDir

    run = RunDir(ckpt)
    pointer = run.read_pointer()
    model, config, state = run.load_model(_device_of(runtime.device))
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab != VOCAB_SIZE:
        raise ValueError(
            f"--ckpt {ckpt}: the model's vocabulary has {vocab} ids; the distance protocol's tokens "
            f"need exactly {VOCAB_SIZE}"
        )
    name = Path(ckpt).resolve().name
    path = out / "evals" / name / "result.json"
    spec = jsonable({"ckpt": str(Path(ckpt).resolve()), "checkpoint": pointer, "pairs": study.pairs})
    result = json.loads(path.read_text()) if path.is_file() else None
    if result is None or _same_reading(result.get("spec")) != _same_reading(spec):
        result = {
            "label": f"{name} (ckpt)",
            "kind": "ckpt",
            "model": config.get("model"),
            "seed": config.get("train", {}).get("seed"),
            "step": int(state["step"]),
            "spec": spec,
            "milestones": [],
            "lengths": {},
            "params": sum(p.numel() for p in model.parameters()),
        }
    _read_lengths(study, runtime, model, result, path)
    return result


def summarize(study: DistanceStudy, results: list[dict]) -> dict:
    """The study's numbers: their provenance (:func:`drmlab.experiments.results.provenance`), the protocol,
    then per trained run or evaluated checkpoint its milestones, per-length records and gate verdicts."""
    from drmlab.experiments.results import provenance

    def bare(record: dict) -> dict:
        out = {key: v for key, v in record.items() if key != "spec"}
        if "controls" in out:
            out["controls"] = {c: bare(rec) for c, rec in out["controls"].items()}
        return out

    entries = []
    for r in results:
        lengths = {k: bare(rec) for k, rec in r["lengths"].items()}
        entries.append(
            {
                key: r.get(key)
                for key in (
                    "label",
                    "kind",
                    "model",
                    "registry_model",
                    "seed",
                    "step",
                    "params",
                    "milestones",
                    "context",
                )
            }
            | {
                "lengths": lengths,
                "gates": gate_verdicts(lengths, control=study.control_length),
                "controls": recall_controls.control_verdicts(lengths, study.controls, study.pairs),
            }
        )
    protocol = jsonable(dataclasses.asdict(study)) | {
        "vocab_size": VOCAB_SIZE,
        "marker": MARKER,
        "keys": [FIRST_KEY, FIRST_KEY + N_KEYS - 1],
        "values": [FIRST_VALUE, FIRST_VALUE + N_VALUES - 1],
        "filler": [FIRST_FILLER, VOCAB_SIZE - 1],
        **levels(study.pairs),
        "no_binding_levels": recall_controls.binding_levels(study.pairs),
        "gate_threshold": GATE_THRESHOLD,
        "state_growth_limit": STATE_GROWTH_LIMIT,
    }
    return {"provenance": provenance(protocol), "protocol": protocol, "entries": entries}


def result_paths(study: DistanceStudy, out: Path) -> list[Path]:
    """The ``result.json`` of every trained run and evaluated checkpoint of ``study`` in ``out``."""
    from drmlab.models.registry import spec_path_name

    paths = [out / "runs" / f"{spec_path_name(m)}_s{s}" / "result.json" for m in study.models for s in study.seeds]
    return paths + [out / "evals" / Path(c).resolve().name / "result.json" for c in study.ckpts]


def refuse_other_pairs(study: DistanceStudy, out: Path) -> None:
    """One ValueError line when a run or evaluation of ``study`` in ``out`` was made with another pair
    count: continuing it under ``study.pairs`` would train or read another task over it."""
    for path in result_paths(study, out):
        if not path.is_file():
            continue
        try:
            saved = with_default_pairs(json.loads(path.read_text()).get("spec")) or {}
        except (ValueError, AttributeError):
            continue  # not ours to judge: the run's own checks read it
        if saved.get("pairs", study.pairs) != study.pairs:
            raise ValueError(
                f"{path.parent} holds a run of {saved['pairs']} pairs; --pairs {study.pairs} needs another --out "
                "(or the same pairs to continue it)"
            )


def run_planned(study: DistanceStudy, runtime: Runtime, out: str | Path) -> dict:
    """Train (or reuse) every (model, seed), evaluate every checkpoint, then summarize and write
    results.json, results.md and results.png into ``out``; the summary. A run or evaluation already in
    ``out`` under another pair count is refused before anything trains (:func:`refuse_other_pairs`)."""
    runtime.apply_threads()
    out = Path(out)
    refuse_other_pairs(study, out)
    out.mkdir(parents=True, exist_ok=True)
    results = [train_one(study, runtime, out, name, seed) for name in study.models for seed in study.seeds]
    results += [evaluate_ckpt(study, runtime, out, ckpt) for ckpt in study.ckpts]
    summary = summarize(study, results)
    distance_report.write_report(summary, out, log=runtime.log)
    return summary


def run_study(spec: DistanceSpec, runtime: Runtime, out: str | Path) -> dict:
    """Plan ``spec`` (:func:`plan_study`) and run the study (:func:`run_planned`); the summary."""
    return run_planned(plan_study(spec), runtime, out)
