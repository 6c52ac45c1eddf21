r"""The Zoology MQAR protocol (docs/mqar.md section 10): the task, recipe and widths of Figure 2 of
Arora et al., "Zoology: Measuring and Improving Recall in Efficient Language Models" (ICLR 2024),
as its code (HazyResearch/zoology) runs them, trained through drmlab's trainer.

Its parts, one job each: the task (:mod:`~drmlab.experiments.mqar.zoology_task`: :func:`generate`,
:class:`EpochBatches`, :func:`query_accuracy`), the recipe (:mod:`~drmlab.experiments.mqar.zoology_recipe`:
:class:`ZoologyRecipe`), the models (:mod:`~drmlab.experiments.mqar.zoology_models`:
:func:`protocol_model`), the plan (:mod:`~drmlab.experiments.mqar.zoology_plan`: :func:`plan_study`), the
probe (:mod:`~drmlab.experiments.mqar.zoology_probe`), the summary of the cells
(:mod:`~drmlab.experiments.mqar.zoology_summary`: :func:`summarize`) and the report
(:mod:`drmlab.experiments.mqar.zoology_report`). The names of the task, recipe, models and plan are
importable from here too, and :func:`summarize`.

**Runs** (this module, :func:`run_cell`): one (model, width, L, rate) per folder
``OUT/runs/<model>_w<W>_L<L>_lr<rate>/``; each epoch is one :func:`drmlab.training.trainer.train` call up
to the epoch's last step (``stop_after_step``) that resumes from the previous epoch's checkpoint, then
the test accuracy and the test queries' cross-entropy; ``result.json`` is written after every epoch, so
a killed run continues from its last epoch. A process holds ``OUT/locks/<run>.lock`` while it trains a
run, so several processes share a study. :func:`run_zoology_study` is the entry point with plain
arguments.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar.zoology_models import (  # noqa: F401 (re-exported)
    ATTENTION,
    decode_state_bytes,
    protocol_model,
    protocol_overrides,
    zoology_attention,
)
from drmlab.experiments.mqar.zoology_plan import (  # noqa: F401 (re-exported)
    DEFAULT_MODELS,
    PROTOCOL_TRAIN_KEYS,
    ZoologyStudy,
    parse_rates,
    plan_study,
)
from drmlab.experiments.mqar.zoology_probe import (
    finished_for,
    probe_as_it_ended,
    runs_after_the_probe,
    same_spec,
)
from drmlab.experiments.mqar.zoology_recipe import (  # noqa: F401 (re-exported)
    BATCH_SIZES,
    LR_GRID,
    RECIPE,
    SETTINGS,
    WIDTHS,
    ZoologyRecipe,
)
from drmlab.experiments.mqar.zoology_summary import summarize, with_whole_spec
from drmlab.experiments.mqar.zoology_task import (  # noqa: F401 (re-exported)
    EVAL_TOKENS,
    FILL,
    GAP_BLOCK,
    IGNORE,
    POWER_A,
    VOCAB_SIZE,
    EpochBatches,
    check_setting,
    data_sets,
    generate,
    query_accuracy,
    slot_weights,
)
from drmlab.naming import suggest
from drmlab.runs import RunDir, jsonable
from drmlab.training import pauses
from drmlab.training.run_info import RunInfo

MQAR_PROTOCOLS = ("fixed", "distance", "zoology")


def check_protocol(name: str) -> str:
    """``name`` if it is an MQAR protocol; otherwise ValueError listing the known ones."""
    if name not in MQAR_PROTOCOLS:
        raise ValueError(
            f"unknown MQAR protocol {name!r}{suggest(str(name), MQAR_PROTOCOLS)}; known: {', '.join(MQAR_PROTOCOLS)}"
        )
    return name


def run_name(name: str, width: int, seq_len: int, lr: float) -> str:
    from drmlab.models.registry import spec_path_name

    return f"{spec_path_name(name)}_w{width}_L{seq_len}_lr{lr_sweep.lr_label(lr)}"


_DATA_CACHE: dict = {}


def cached_data(study: ZoologyStudy, seq_len: int, kv: int):
    """The setting's data sets, kept for the last setting used (the study walks settings in order)."""
    r = study.recipe
    key = (seq_len, kv, r.n_train, r.n_test, r.data_seed)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data_sets(seq_len, kv, n_train=r.n_train, n_test=r.n_test, data_seed=r.data_seed)
    return _DATA_CACHE[key]


def run_spec(study: ZoologyStudy, name: str, width: int, seq_len: int, kv: int, lr: float) -> tuple[dict, str | None]:
    """(the spec a run trains under, None), or ({}, the reason) where the model cannot hold the setting
    (n/a). A saved result under another spec is trained again."""
    registry, kw, why = protocol_overrides(name, study.preset, width, seq_len, study.model_overrides, study.recipe)
    if why is not None:
        return {}, why
    r = study.recipe
    spec = {
        "model": name,
        "registry_model": registry,
        "preset": study.preset,
        "overrides": kw,
        "zoology_attention": name == ATTENTION,
        "dropout": r.dropout if name == ATTENTION else 0.0,
        "task": {
            "vocab_size": r.vocab_size,
            "power_a": r.power_a,
            "seq_len": seq_len,
            "kv": kv,
            "n_train": r.n_train,
            "n_test": r.n_test,
            "data_seed": r.data_seed,
        },
        "epochs": r.epochs,
        "early_stop": r.early_stop,
        "head_at_queries_only": True,
        "train": dataclasses.asdict(study.train_config(seq_len, lr)),
    }
    return jsonable(spec), None


def run_cell(
    study: ZoologyStudy,
    name: str,
    width: int,
    seq_len: int,
    kv: int,
    lr: float,
    out: Path,
    *,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    collect_only: bool = False,
    until: int | None = None,
) -> dict:
    """Train (or continue, or reuse) one run; its result (``status``: done, diverged, n/a or locked;
    with ``collect_only`` nothing is trained and an unfinished run is ``pending``). ``until``: stop after
    that many epochs (the rate probe) unless it stopped before; such a run is ``probed`` and goes on from
    its checkpoint when asked for more."""
    from drmlab.runs import RunLock, RunLockedError, write_json_atomic
    from drmlab.training.pieces import TrainPieces
    from drmlab.training.trainer import NonFiniteLossError, lm_loss_fn, train

    label = run_name(name, width, seq_len, lr)
    base = {"model": name, "width": width, "seq_len": seq_len, "kv": kv, "lr": lr}
    spec, why = run_spec(study, name, width, seq_len, kv, lr)
    if why is not None:
        return dict(base, status="n/a", why=why)
    registry, kw = spec["registry_model"], spec["overrides"]
    cfg = study.train_config(seq_len, lr)
    r = study.recipe
    target = r.epochs if until is None else min(until, r.epochs)
    run_dir = out / "runs" / label
    path = run_dir / "result.json"
    saved = json.loads(path.read_text()) if path.is_file() else None
    if finished_for(saved, spec, target) or (collect_only and finished_for(saved, spec, 0)):
        return dict(saved, reused=True)
    probed = probe_as_it_ended(saved, spec, until)  # the chosen rate, stopped while training on past its probe
    if probed is not None:  # its probe has finished: the cell's continuation goes on with it, not this call
        return dict(probed, reused=True)
    if collect_only:  # the report of what has finished: nothing is trained
        return dict(base, status="pending")
    try:
        lock = RunLock(out / "locks" / f"{label}.lock").acquire()
    except RunLockedError:
        return dict(base, status="locked")
    try:
        saved = json.loads(path.read_text()) if path.is_file() else None  # another process may have moved it on
        if finished_for(saved, spec, target):
            return dict(saved, reused=True)
        probed = probe_as_it_ended(saved, spec, until)
        if probed is not None:
            return dict(probed, reused=True)
        run = RunDir(run_dir)
        resume = same_spec(saved, spec) and run.has_checkpoint()
        result = saved if resume else dict(base, status="training", spec=spec, epochs=[], wall_seconds=0.0)
        result["status"] = "training"  # a probed run going on is training until its next stop
        if not resume:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, result)
        x, y, xt, yt = cached_data(study, seq_len, kv)
        model, _, _ = protocol_model(name, study.preset, width, seq_len, r.seed, study.model_overrides, r)
        batches = EpochBatches(x, y, cfg.batch_size)
        per_epoch = batches.per_epoch
        info = RunInfo(
            name,
            study.preset,
            kw,
            registry_model=registry,
            study={"mqar_zoology": {k: v for k, v in spec.items() if k not in ("train", "overrides")}},
        )
        done = result["epochs"][-1]["epoch"] if result["epochs"] else 0
        carried = carried_seconds(run, result["epochs"]) if resume else 0.0  # only a resumed first epoch carries
        while done < target:
            t0 = pauses.now()
            try:
                summary = train(
                    model,
                    batches,
                    None,
                    cfg,
                    run_dir,
                    resume=resume,
                    overwrite=not resume,
                    run_info=info,
                    device=device,
                    quiet=True,
                    stop_after_step=(done + 1) * per_epoch,
                    pieces=TrainPieces(loss_fn=lm_loss_fn(cfg.bf16, scored_only=True)),
                )
            except NonFiniteLossError as exc:
                result.update(status="diverged", why=str(exc).split(";")[0])
                write_json_atomic(path, result)
                if log is not None:
                    log(f"zoology {label}: diverged ({result['why']})")
                return result
            resume = True
            t1 = pauses.now()
            test = query_accuracy(model, xt, yt)
            epoch = summary["steps"] // per_epoch
            loss = summary["final_loss"]
            if (
                loss is None
            ):  # the checkpoint was already at this epoch's end (killed before result.json): the logged loss
                loss = next(
                    (
                        m["loss"]
                        for m in run.read_metrics()
                        if m.get("kind") == "train" and m["step"] == summary["steps"]
                    ),
                    None,
                )
            result["epochs"].append(
                {
                    "epoch": epoch,
                    "step": summary["steps"],
                    "loss": loss,
                    "test_acc": test["acc"],
                    "test_ce": test["ce"],
                    "train_seconds": t1 - t0 + carried,
                    "eval_seconds": pauses.now() - t1,
                    "trainer_seconds": summary["train_seconds"],
                }
            )
            result["wall_seconds"] += pauses.now() - t0 + carried
            carried = 0.0  # each later epoch starts at the checkpoint this process committed at its end
            result["params"] = summary["params"]
            done = epoch
            stop = test["acc"] > r.early_stop
            if stop or done >= target:
                result.update(
                    status="done" if stop or done >= r.epochs else "probed",
                    test_acc=test["acc"],
                    test_correct=test["correct"],
                    test_queries=test["total"],
                    epochs_run=done,
                    early_stopped=stop,
                    steps=summary["steps"],
                    seconds_per_step=sum(e["train_seconds"] for e in result["epochs"]) / max(1, summary["steps"]),
                )
            write_json_atomic(path, result)
            if log is not None and not quiet:
                log(f"zoology {label}: epoch {epoch} test acc {100 * test['acc']:.2f}%")
            if stop:
                break
        if log is not None:
            log(
                f"zoology {label}: test acc {100 * result['test_acc']:.2f}% after {result['epochs_run']} epochs"
                f"{' (early stop)' if result['early_stopped'] else ''}"
                f"{' (the rate probe)' if result['status'] == 'probed' else ''}, {result['wall_seconds']:.0f} s"
            )
        return result
    finally:
        lock.release()


def carried_seconds(run: RunDir, epochs: list[dict]) -> float:
    """Training time an earlier process put into the epoch about to resume: the trainer's seconds in the
    checkpoint less those at the last recorded epoch's end (``trainer_seconds``). Zero when the checkpoint
    sits at that epoch's end; more after a process stopped mid-epoch at a time-based checkpoint, whose steps
    this process does not train again. Steps trained past that checkpoint before the stop are lost and not
    counted. An epoch recorded before ``trainer_seconds`` was kept carries nothing."""
    if epochs and "trainer_seconds" not in epochs[-1]:
        return 0.0
    before = epochs[-1]["trainer_seconds"] if epochs else 0.0
    return max(0.0, float(run.read_state().get("train_seconds", 0.0)) - before)


def restore_runs(results_path: str | Path, out: str | Path) -> list[str]:
    """Put the finished runs of a committed ``results.json`` (its ``finished`` records, each with the spec
    it ran under, whole or as ``spec_own`` beside the record's ``spec_shared``) back as
    ``OUT/runs/<run>/result.json`` where OUT holds none, so a study continued in another checkout reuses
    them (:func:`run_cell` reuses a finished result whose spec matches, and retrains one whose spec
    differs). The names restored."""
    from drmlab.runs import write_json_atomic

    path = Path(results_path)
    try:
        committed = json.loads(path.read_text())
        records, shared = committed["finished"], committed.get("spec_shared", {})
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a Zoology results.json with finished runs") from None
    restored = []
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("spec_own"), dict) and isinstance(shared, dict):
            record = with_whole_spec(record, shared)  # a record written since the shared settings are kept once
        if not isinstance(record, dict) or not isinstance(record.get("spec"), dict):
            raise ValueError(f"{path}: a finished run without its spec cannot be restored")
        label = run_name(record["model"], record["width"], record["seq_len"], record["lr"])
        target = Path(out) / "runs" / label / "result.json"
        if target.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target, record)
        restored.append(label)
    return restored


def run_planned(
    study: ZoologyStudy,
    out: str | Path,
    *,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    wait_seconds: float = 30.0,
    collect_only: bool = False,
    leave_held: bool = False,
) -> dict | None:
    """Run (or reuse) every (model, width, length, rate) of ``study``, leaving runs held by another
    process to it and coming back to them; then write the report. The summary. ``collect_only``: train
    nothing, report what has finished (the rest of a cell's sweep shows as incomplete).

    With a probe, a cell's chosen rate goes on as soon as its last probe finishes, before the next cell's
    probes (so a cell's row is whole early), also where another process trained some of its probes: after
    each run this process trains, the runs it found held are looked at again. ``leave_held``: once a pass over the runs left finds every one
    held by another process, return None (no report) instead of waiting: each held run's process goes on
    to what waits on it (a cell's continuation after its probes)."""
    from drmlab.experiments.mqar import zoology_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    probe = study.recipe.probe_epochs
    todo = [
        (seq_len, kv, name, width, lr, probe)
        for seq_len, kv in study.settings
        for name in study.models
        for width in study.widths
        for lr in study.lr_grid
    ]
    results: dict = {}
    going_on: set = set()  # the cells whose chosen rate was queued to train on after the probe
    while todo:
        left, moved = [], False
        queue = list(todo)
        while queue:
            seq_len, kv, name, width, lr, until = job = queue.pop(0)
            r = run_cell(
                study,
                name,
                width,
                seq_len,
                kv,
                lr,
                out,
                device=device,
                quiet=quiet,
                log=log,
                collect_only=collect_only,
                until=until,
            )
            if r["status"] == "locked":
                left.append(job)
                continue
            results[(name, width, seq_len, lr)] = r
            moved = True
            if probe is not None and not collect_only:
                if not r.get("reused") and left:  # time has passed: a run held before may be finished now
                    queue[:0], left = left, []
                queue[:0] = runs_after_the_probe(study, results, going_on)  # a cell whose probe ended goes first
        if left and not moved:  # every run left is held by another process
            if leave_held:
                if log is not None:
                    runs = f"{len(left)} run{'s' * (len(left) != 1)}"
                    log(
                        f"zoology: {runs} left, each held by another process: left to those processes "
                        "(--leave-held); the last to finish writes the report"
                    )
                return None
            time.sleep(wait_seconds)
        todo = left
    summary = summarize(study, list(results.values()))
    zoology_report.write_report(summary, out, log=log)
    return summary


def run_zoology_study(
    models=DEFAULT_MODELS,
    widths=WIDTHS,
    seq_lens=None,
    *,
    out: str | Path,
    preset: str = "tiny",
    lr_grid=LR_GRID,
    epochs: int = RECIPE.epochs,
    n_train: int = RECIPE.n_train,
    n_test: int = RECIPE.n_test,
    batch_size: int | None = None,
    seed: int = RECIPE.seed,
    data_seed: int = RECIPE.data_seed,
    early_stop: float = RECIPE.early_stop,
    probe_epochs: int | None = None,
    settings: dict | None = None,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    collect_only: bool = False,
    leave_held: bool = False,
) -> dict | None:
    """``drmlab mqar --protocol zoology``: plan (:func:`plan_study`) and run the study into ``out``;
    the summary (also ``out/zoology.json``, ``zoology.md``). ``collect_only``: report without training;
    ``leave_held``: see :func:`run_planned` (None where it left runs to other processes)."""
    study = plan_study(
        models,
        widths,
        seq_lens,
        preset=preset,
        lr_grid=lr_grid,
        epochs=epochs,
        n_train=n_train,
        n_test=n_test,
        batch_size=batch_size,
        seed=seed,
        data_seed=data_seed,
        early_stop=early_stop,
        probe_epochs=probe_epochs,
        settings=settings,
    )
    return run_planned(
        study, out, device=device, quiet=quiet, log=log, collect_only=collect_only, leave_held=leave_held
    )
