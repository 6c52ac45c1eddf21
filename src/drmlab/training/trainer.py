"""The training loop: :func:`train`, built from small pieces (:class:`Trainer`), and its loss.

One optimizer step ``k`` (1-based) runs ``grad_accum`` micro-batches; micro-batch ``m`` comes from
the run's :class:`~drmlab.training.batches.BatchSource` at (seed, k, m) -- by default
:class:`~drmlab.training.batches.LMWindows` over a token stream, where a window ``w`` of
``seq_len + 1`` tokens is scored as ``CE(model(w[:, :T], step=k).logits[:, t], w[:, t + 1])``
(the explicit next-token target; no model is ever handed labels to shift), plus
``aux["loss_aux"]`` when the model gives one. The loss is divided by ``grad_accum``, gradients
are clipped to a global norm, AdamW steps at ``optim.lr_at(k)``.

A study swaps pieces of this (:class:`~drmlab.training.pieces.TrainPieces`): the loss
(``loss_fn``), the optimizer (``optimizer_builder``: parameter groups at their own base rates, each
scheduled from its own), evaluation hooks at given steps (rows of metrics.jsonl, a checkpoint
committed before each) and entries of the finished summary; the step, the guards, checkpoints,
resume and the signal handling stay here.

The pieces: :meth:`Trainer.start` (fresh or resumed), :meth:`Trainer.train_step` (micro-batches,
clipping, the non-finite guard), :meth:`Trainer.after_step` (metrics, sampled evaluation,
checkpoint) and :meth:`Trainer.finish` (summary and the final evaluation). The files of the run
directory are :mod:`drmlab.runs`'s.

``resume=True`` reloads the checkpoint (weights, optimizer state, RNG) and continues; since the
batches and the learning rate are functions of the step alone, the losses and weights are
bit-identical to an uninterrupted run. Resuming refuses other data, tokenizer, model or
schedule-defining settings (listing each difference); :data:`RESUMABLE_CHANGES` may change, and a
run stopped by the non-finite guard may also take the fixes in :data:`FIXES_AFTER_NON_FINITE`;
each change is recorded in a ``resume`` row of metrics.jsonl. Training into a directory that
already holds a run is refused unless ``resume`` or ``overwrite``; the writing process holds the
run's lock (:class:`drmlab.runs.RunLock`).

``cfg.compile`` runs the training forward through ``torch.compile(fullgraph=True)``
(:mod:`drmlab.training.compiling`); evaluation and checkpoints use the uncompiled model. A model
that cannot be compiled as one graph stops the run at its first step with
:class:`~drmlab.training.compiling.CompileError`, one line naming the operation that broke the graph.

Each sampled evaluation row carries the model's geometry diagnostics when it has some (DRM:
:mod:`drmlab.training.diagnostics`). ``tensorboard=True`` hands every metrics row to a TensorBoard
sink as well (:mod:`drmlab.training.tensorboard`): an output option, like ``quiet``, not a train
setting, so it is not part of the run's config and may differ on every resume.

``fsdp=True`` under torchrun shards the model with FSDP2 instead of wrapping it in DDP
(:mod:`drmlab.training.distributed`); the run directory and its checkpoints keep the
single-process format.

Stops, each leaving the last committed checkpoint loadable and finite: a non-finite loss, gradient
norm or weight, or a linear-algebra failure inside the model (:class:`NonFiniteLossError`, before
the optimizer touches the weights); a loss ``divergence_nats`` above the uniform guess ln(vocab)
for ``divergence_steps`` steps in a row (:class:`DivergenceError`); SIGINT or SIGTERM, which
finish the current step, commit a checkpoint and raise :class:`TrainingInterrupted`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from drmlab.models.parameters import count_parameters
from drmlab.runs import MetricsLog, RunDir, jsonable, non_finite_parameters
from drmlab.training import distributed as dist_utils
from drmlab.training.batches import BatchSource, LMWindows, eval_sample
from drmlab.training.compile_report import CompileReport, describe, time_eager_pass
from drmlab.training.compiling import compile_errors, compile_model
from drmlab.training.config import TRAIN_DEFAULTS, TrainConfig
from drmlab.training.diagnostics import WINDOWS as DIAGNOSTIC_WINDOWS
from drmlab.training.diagnostics import evaluation_diagnostics
from drmlab.training.optim import build_optimizer, lr_at
from drmlab.training.pieces import LossFn, TrainPieces
from drmlab.training.run_info import RunInfo
from drmlab.training.tensorboard import open_sink, require_tensorboard
from drmlab.training.utilisation import Utilisation, count_step_flops, gemm_peak_gflops

IGNORE_INDEX = BatchSource.IGNORE_INDEX  # a target that is not scored

# Train settings that may differ when resuming: they change neither the batches nor the updates
# (``tokens`` -- or ``steps``, which sets it -- only under the constant schedule, where it does not shape the
# learning rate; ``compile`` only the order of rounding, as another device or thread count does).
RESUMABLE_CHANGES = (
    "tokens",
    "steps",
    "eval_every",
    "eval_windows",
    "eval_tokens",
    "eval_batch_size",
    "checkpoint_every",
    "divergence_nats",
    "divergence_steps",
    "compile",
    "milestones",
)
# Runtime entries of config.json that a resume may change, though they change the float rounding.
RUNTIME_BITS = ("device", "threads")
# ... and after a stop by the non-finite guard or the divergence guard, the advised fixes too.
FIXES_AFTER_NON_FINITE = ("lr", "warmup_fraction", "grad_clip")
# Data provenance that must not change on resume (entries of config.json).
DATA_IDENTITY = ("tokenizer", "vocab_size")
PROGRESS_SECONDS = 30.0  # without a terminal, a progress line this often

# evaluate(model, device, progress) -> {"ce", "bpb", "ppl", "targets", "bytes", ...}: the final
# evaluation of a finished run (for a language model, drmlab.evaluation.rescorer's rescoring).
Evaluate = Callable[[torch.nn.Module, torch.device, bool], dict]


class NonFiniteLossError(RuntimeError):
    """The loss, the gradient norm or the weights became NaN or infinite, or the model's linear
    algebra failed; the message names the step, the kept checkpoint and what to try."""


class DivergenceError(NonFiniteLossError):
    """The loss stayed far above the uniform guess for ``divergence_steps`` steps in a row."""


class StoppedAtOnce(KeyboardInterrupt):
    """A second SIGINT or SIGTERM: the run stops without finishing its step; ``exit_code`` is 128 + the signal,
    as a shell reports a process the signal ended, and the message says what is kept."""

    def __init__(self, signum: int, kept: str):
        super().__init__(f"{signal.Signals(signum).name} received twice: stopped at once, {kept}")
        self.exit_code = 128 + signum


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a committed checkpoint; ``signal`` and ``step`` say which and where."""

    def __init__(self, message: str, signum: int, step: int):
        super().__init__(message)
        self.signal, self.step = signum, step


def lm_loss(
    model: torch.nn.Module, window: torch.Tensor, step: int | None = None, *, bf16: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, next-token CE) of ``window`` [B, T + 1]: logits[:, t] are scored against window[:, t + 1]."""
    return targets_loss(model, window[:, :-1], window[:, 1:], step, bf16=bf16)


def targets_loss(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    step: int | None = None,
    *,
    bf16: bool = False,
    scored_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, CE) of ``model(inputs)``: logits[:, t] scored against targets[:, t], mean over the
    targets that are not :data:`IGNORE_INDEX`; the total adds ``aux["loss_aux"]`` when the model gives one.
    ``scored_only``: the model's head runs at the scored positions only (``logits_at``,
    :mod:`drmlab.models.inputs`) -- the same loss up to float rounding, and much cheaper when few
    positions are scored (MQAR's queries) and the vocabulary is large."""
    device_type = inputs.device.type
    scored = targets != IGNORE_INDEX if scored_only else None
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        out = model(inputs, step=step) if scored is None else model(inputs, step=step, logits_at=scored)
    logits = out.logits.float()
    if scored is None:
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    else:
        ce = F.cross_entropy(logits, targets[scored])
    aux = out.aux.get("loss_aux") if out.aux else None
    loss = ce + aux.float() if aux is not None else ce
    return loss, ce


def lm_loss_fn(bf16: bool = False, scored_only: bool = False) -> LossFn:
    """The default loss piece: :func:`targets_loss` of the batch (inputs, targets), its CE as the row's ``ce``."""

    def loss_fn(model: torch.nn.Module, batch: tuple, step: int) -> tuple[torch.Tensor, dict]:
        loss, ce = targets_loss(model, batch[0], batch[1], step, bf16=bf16, scored_only=scored_only)
        return loss, {"ce": ce}

    return loss_fn


@torch.no_grad()
def sampled_eval(model: torch.nn.Module, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token CE (nats) over the fixed validation ``windows`` [n, T + 1]; fp32, eval mode, step=None."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, windows.shape[0], batch_size):
            rows = windows[i : i + batch_size].to(device)
            logits = model(rows[:, :-1], step=None).logits.float()
            total += float(
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum")
            )
            count += rows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / max(count, 1)


def resolved_config(model, cfg: TrainConfig, run_info: RunInfo | None, world_size: int, device: torch.device) -> dict:
    """config.json of a run: model, preset, overrides, the model's config, train settings, what
    they derive to, the caller's ``run_info`` (data provenance, tokenizer) and the runtime."""
    import drmlab

    info = run_info.record() if run_info is not None else {}
    config = getattr(model, "config", None)
    return jsonable(
        {
            "model": info.pop("model", getattr(model, "model_name", type(model).__name__)),
            "preset": info.pop("preset", getattr(model, "preset", None)),
            "overrides": info.pop("overrides", {}),
            "model_config": dataclasses.asdict(config)
            if config is not None and dataclasses.is_dataclass(config)
            else None,
            "params": count_parameters(model),
            "train": dataclasses.asdict(cfg),
            "derived": {
                "tokens_per_step": cfg.tokens_per_step,
                "total_steps": cfg.total_steps,
                "total_tokens": cfg.total_steps * cfg.tokens_per_step,
                "warmup_steps": cfg.warmup_steps,
                "eval_every_steps": cfg.eval_every_steps,
                "checkpoint_every_steps": cfg.checkpoint_every_steps,
            },
            **info,
            "runtime": {
                "world_size": world_size,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "drmlab": drmlab.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
        }
    )


def config_defaults(model) -> dict:
    """{field: default} of ``model.config``'s dataclass (empty for a model without one)."""
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return {}
    defaults = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return jsonable(defaults)


_ABSENT = object()


def _model_config_problems(saved: dict | None, fresh: dict | None, defaults: dict) -> list[str]:
    """The model-config fields that differ, one entry each. A field the run's config.json lacks (it was
    written before the field existed) counts as its default: at the default it changes nothing."""
    if not isinstance(saved, dict) or not isinstance(fresh, dict):
        return [] if saved == fresh else [f"model_config: {saved!r} in the run, {fresh!r} now"]
    problems = []
    for key in sorted(set(saved) | set(fresh)):
        before, now = saved.get(key, _ABSENT), fresh.get(key, _ABSENT)
        if before is _ABSENT and now == defaults.get(key, _ABSENT):
            continue
        if before != now:
            show = ["(absent)" if v is _ABSENT else repr(v) for v in (before, now)]
            problems.append(f"model_config.{key}: {show[0]} in the run, {show[1]} now")
    return problems


def check_resumable(
    saved: dict, fresh: dict, *, after_non_finite: bool = False, model_defaults: dict | None = None
) -> dict:
    """Refuse to resume a run under other data, model or schedule-defining settings, listing each
    difference; return the allowed changes ``{key: [before, now]}``. ``model_defaults``
    (:func:`config_defaults`): a model-config field newer than the run is accepted at its default."""
    problems, changed = [], {}
    for key in ("model", "preset", "overrides") + DATA_IDENTITY:
        if saved.get(key) != fresh.get(key):
            problems.append(f"{key}: {saved.get(key)!r} in the run, {fresh.get(key)!r} now")
    problems += _model_config_problems(saved.get("model_config"), fresh.get("model_config"), model_defaults or {})
    saved_hash = (saved.get("data") or {}).get("content_sha256")
    fresh_hash = (fresh.get("data") or {}).get("content_sha256")
    if saved_hash != fresh_hash:
        problems.append(f"training data: content sha256 {saved_hash} in the run, {fresh_hash} now")
    allowed = RESUMABLE_CHANGES + (FIXES_AFTER_NON_FINITE if after_non_finite else ())
    saved_train = saved.get("train", {})
    for key, value in fresh["train"].items():
        before = saved_train.get(key, TRAIN_DEFAULTS.get(key))
        if before == value:
            continue
        if key == "tokens" and fresh["train"].get("schedule") == "cosine":
            problems.append(
                f"tokens: {before!r} in the run, {value!r} now (under the cosine schedule the budget "
                "shapes the learning rate)"
            )
        elif key in allowed:
            changed[key] = [before, value]
        else:
            problems.append(f"{key}: {before!r} in the run, {value!r} now")
    if problems:
        raise ValueError("cannot resume: the settings differ from the run's config.json: " + "; ".join(problems))
    saved_runtime, fresh_runtime = saved.get("runtime") or {}, fresh.get("runtime") or {}
    for key in RUNTIME_BITS:  # allowed, but an uninterrupted run would have given other last bits
        if key in saved_runtime and saved_runtime[key] != fresh_runtime.get(key):
            changed[key] = [saved_runtime[key], fresh_runtime.get(key)]
    return changed


def runtime_drift_note(changed: dict) -> str | None:
    """One line when a resume runs on another device or thread count than the run's config.json records:
    allowed, but the float rounding differs, so the numbers part from an uninterrupted run's in their
    last bits (exact continuation needs the same device and --threads)."""
    drift = [f"{key} {now} (the run had {before})" for key, (before, now) in changed.items() if key in RUNTIME_BITS]
    if not drift:
        return None
    return (
        f"drmlab: resuming with {', '.join(drift)}: the run continues, but its numbers will differ in the last "
        "bits from an uninterrupted run's; resume with the same device and --threads for an exact continuation"
    )


class Trainer:
    """One training run in pieces; :func:`train` drives it. See the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        batches: BatchSource,
        cfg: TrainConfig,
        run: RunDir | None,
        *,
        val_tokens: np.ndarray | None,
        evaluate: Evaluate | None,
        run_info: RunInfo | None,
        device,
        quiet: bool,
        progress_seconds: float = PROGRESS_SECONDS,
        fsdp: bool = False,
        tensorboard: bool = False,
        pieces: TrainPieces | None = None,
    ):
        cfg.validate()
        self.cfg, self.batches, self.run, self.evaluate = cfg, batches, run, evaluate
        self.pieces = pieces = pieces if pieces is not None else TrainPieces()
        self.loss_fn = pieces.loss_fn if pieces.loss_fn is not None else lm_loss_fn(cfg.bf16)
        self.hook_steps, self.advice, self.kept_rows = pieces.hook_steps, pieces.advice, set()
        self.compile_report: CompileReport | None = None  # under cfg.compile, made in start()
        self.info, self.device = dist_utils.setup(str(device) if isinstance(device, torch.device) else device)
        self.main = self.info.is_main
        self.model = model.to(self.device)
        self.config = resolved_config(self.model, cfg, run_info, self.info.world_size, self.device)
        self.sharded = fsdp and self.info.enabled  # FSDP2: every process holds 1/N of the weights
        self.config["runtime"]["data_parallel"] = "fsdp" if self.sharded else "ddp" if self.info.enabled else None
        if self.sharded:
            self.model = dist_utils.shard_model(self.model, self.info, self.device)
        self.optimizer = (pieces.optimizer_builder or build_optimizer)(self.model, cfg)
        # each group's own base rate, as built (a resumed optimizer's saved rates do not replace it)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.group_names = [group.get("name") for group in self.optimizer.param_groups]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.eval_windows = (
            eval_sample(val_tokens, cfg.eval_windows, cfg.seq_len)
            if val_tokens is not None and cfg.eval_windows
            else None
        )
        self.start_step, self.last_ckpt_step = 0, None
        self.elapsed_before = self.train_seconds_before = self.train_seconds = 0.0
        self.quiet, self.bar, self.net, self.log, self.lock = quiet, None, None, None, None
        self.progress_seconds, self.last_progress = progress_seconds, time.perf_counter()
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        self.uniform_ce = math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None
        self.diverging_steps = 0
        self.stop_signal: int | None = None
        self.tensorboard = tensorboard
        self.utilisation: Utilisation | None = None  # made in start() (not in a distributed run)

    # -- setup and resume
    def start(self, resume: bool, overwrite: bool = False) -> None:
        run, main = self.run, self.main
        changed: dict = {}
        if run is not None and main:
            run.create()
            self.lock = run.lock()
            for note in (n for n in run.clean_orphans() if n.startswith("recovered ")):  # said, not only done
                print(f"note: {run.path}: {note}", file=sys.stderr)
            if not resume and run.holds_run():
                if not overwrite:
                    raise FileExistsError(
                        f"{run.path} already holds {run.describe()}; resume it, choose another "
                        "directory, or overwrite it (its files are then deleted)"
                    )
                run.remove_run()
        lost_rows = None
        if resume:
            if not run.has_checkpoint():
                raise FileNotFoundError(f"nothing to resume in {run.path}: no checkpoint")
            if run.has_config():
                try:
                    summary = run.read_summary() or {}
                except ValueError as exc:  # an output, rewritten at the end; only the last stop's kind is read
                    print(f"note: {exc}; resuming as after an ordinary stop (it is written again)", file=sys.stderr)
                    summary = {}
                changed = check_resumable(
                    run.read_config(),
                    self.config,
                    after_non_finite=summary.get("stopped") in ("non-finite", "diverged"),
                    model_defaults=config_defaults(self.model),
                )
                note = runtime_drift_note(changed)
                if note:
                    print(note, file=sys.stderr)
            state = (
                dist_utils.load_sharded_checkpoint(run, self.model, self.optimizer)
                if self.sharded
                else run.load_checkpoint(self.model, self.optimizer)
            )
            self.start_step = self.last_ckpt_step = int(state["step"])
            self.elapsed_before = float(state.get("elapsed", 0.0))
            self.train_seconds_before = float(state.get("train_seconds", 0.0))
            if main:
                lost_rows = run.truncate_metrics(self.start_step, state.get("metrics"))
                if lost_rows:  # resumable (the checkpoint holds the state), but the record has a hole: say so
                    print(f"note: {lost_rows}", file=sys.stderr)
                run.summary_path.unlink(missing_ok=True)
        else:
            torch.manual_seed(self.cfg.seed)
        self.utilisation = self._measure_utilisation()
        if run is not None and main:
            run.write_config(self.config)
        dist_utils.barrier(self.info)
        if resume and self.pieces.hooks and run.metrics_path.is_file():  # which hook rows the kept metrics hold
            self.kept_rows = {(row.get("kind"), row.get("step")) for row in run.read_metrics()}
        probe = self.batches.batch(self.cfg.seed, 1, 0)[0][:1, : min(self.cfg.seq_len, 16)]
        self.net = dist_utils.wrap_model(self.model, self.info, self.device, probe=probe)
        if self.cfg.compile:  # the training forward only: evaluation and checkpoints use self.model
            self.compile_report = CompileReport(self._eager_seconds(), self.cfg.grad_accum)
            self.net = compile_model(self.net)
        sinks = []
        if self.tensorboard and run is not None and main:  # the rows kept so far, then every new one
            sinks.append(open_sink(run.path, run.read_metrics() if run.metrics_path.is_file() else ()))
        self.log = MetricsLog(run.metrics_path if (run is not None and main) else None, sinks)
        if resume and main:
            self.log.log(
                {
                    "kind": "resume",
                    "step": self.start_step,
                    "changed": changed,
                    "device": str(self.device),
                    "threads": torch.get_num_threads(),
                    **({"lost_rows": lost_rows} if lost_rows else {}),
                }
            )
        self.t_start = time.perf_counter()
        if main and not self.quiet and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.cfg.total_steps, initial=self.start_step, unit="step", dynamic_ncols=True)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t_start

    def _measure_utilisation(self) -> Utilisation | None:
        """The counted FLOPs of a step and this machine's GEMM peak (:mod:`drmlab.training.utilisation`),
        recorded in config.json's runtime; None in a distributed run, or (said in one line) where the
        count fails -- a measurement, never a reason to stop training."""
        if self.info.enabled:
            return None
        cfg, step = self.cfg, self.start_step + 1
        try:
            inputs, targets = self.batches.batch(cfg.seed, step, 0)
            batch = (inputs.to(self.device), targets.to(self.device))
            flops = count_step_flops(self.model, self.loss_fn, batch, step, cfg.batch_size * cfg.grad_accum)
            dtype = torch.bfloat16 if cfg.bf16 else next(self.model.parameters()).dtype
            utilisation = Utilisation(flops, gemm_peak_gflops(self.device, dtype))
        except Exception as exc:  # noqa: BLE001 -- a diagnostic; the run goes on without it
            print(f"note: no FLOP count for this run ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        if self.run is not None and self.main:
            self.config["runtime"]["utilisation"] = jsonable(utilisation.record())
        return utilisation

    def _eager_seconds(self) -> float | None:
        """Before compiling: one eager forward and backward of the next step's first micro-batch, timed
        and undone (compile_report.time_eager_pass); None in a distributed run (its collectives would
        be timed too)."""
        if self.info.enabled:
            return None
        cfg, step = self.cfg, self.start_step + 1
        inputs, targets = self.batches.batch(cfg.seed, step, 0, self.info.rank, self.info.world_size)
        batch = (inputs.to(self.device), targets.to(self.device))

        def run_pass():
            self.net.train()
            loss, _ = self.loss_fn(self.net, batch, step)
            (loss / cfg.grad_accum).backward()

        return time_eager_pass(run_pass, self.model, self.device)

    # -- one optimizer step
    def train_step(self, step: int) -> dict:
        """Micro-batches, gradient clipping and the non-finite guard; the optimizer update. Returns the row."""
        cfg, dev, info = self.cfg, self.device, self.info
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        rates = {}
        for group, base, name in zip(self.optimizer.param_groups, self.base_lrs, self.group_names):
            group["lr"] = lr_at(step, cfg, base)  # equals lr for a group at cfg.lr
            if name is not None:
                rates[f"lr_{name}"] = group["lr"]
        self.net.train()
        total = torch.zeros((), device=dev)
        sums: dict = {}  # the loss piece's tensor entries, averaged over the micro-batches
        entries: dict = {}
        for micro in range(cfg.grad_accum):
            inputs, targets = self.batches.batch(cfg.seed, step, micro, info.rank, info.world_size)
            sync = (
                info.enabled and not self.sharded and micro < cfg.grad_accum - 1
            )  # FSDP reduce-scatters each micro-batch
            try:
                with self.net.no_sync() if sync else contextlib.nullcontext(), self._compile_errors():
                    loss, aux = self.loss_fn(self.net, (inputs.to(dev), targets.to(dev)), step)
                    (loss / cfg.grad_accum).backward()
            except torch.linalg.LinAlgError as exc:  # e.g. a Cholesky of a metric the weights broke
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(
                    f"a linear-algebra failure inside the model at {self._where(step)} "
                    f"({str(exc).splitlines()[0]}); stopped, {self._kept()}. {self.advice}"
                ) from None
            total += loss.detach() / cfg.grad_accum
            for key, value in aux.items():
                if isinstance(value, torch.Tensor):
                    if key not in sums:
                        sums[key] = torch.zeros((), device=dev)
                    sums[key] += value.detach() / cfg.grad_accum
                entries[key] = value
        if self.compile_report is not None and not self.compile_report.done:  # its first steps only
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            self.compile_report.observe(time.perf_counter() - t0)
        loss_value = float(dist_utils.all_reduce_mean(total, info))
        for key, value in sums.items():
            entries[key] = float(dist_utils.all_reduce_mean(value, info))
        if not math.isfinite(loss_value):
            raise NonFiniteLossError(
                f"non-finite training loss ({loss_value}) at {self._where(step)}; stopped, {self._kept()}. "
                f"{self.advice}"
            )
        if self.sharded:
            grad_norm = dist_utils.sharded_grad_norm(self.params, cfg.grad_clip)
        elif cfg.grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip))
        else:
            grad_norm = float(
                torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
            )
        if not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"non-finite gradient norm ({grad_norm}) at {self._where(step)} "
                f"(loss {loss_value:.4f}); stopped, {self._kept()}. {self.advice}"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._check_divergence(step, loss_value)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        self.train_seconds += dt
        return {
            "kind": "train",
            "step": step,
            "tokens": step * cfg.tokens_per_step,
            "loss": loss_value,
            **entries,
            "lr": lr,
            **rates,
            "grad_norm": grad_norm,
            "tok_s": cfg.tokens_per_step / dt,
            **(self.utilisation.entries(dt) if self.utilisation is not None else {}),
            "elapsed": self.elapsed(),
        }

    def _compile_errors(self):
        """Under ``compile``: a model that cannot compile raises CompileError naming the operation."""
        return compile_errors(str(self.config["model"])) if self.cfg.compile else contextlib.nullcontext()

    def _check_divergence(self, step: int, loss: float) -> None:
        cfg = self.cfg
        if self.uniform_ce is None or not cfg.divergence_steps:
            return
        self.diverging_steps = self.diverging_steps + 1 if loss > self.uniform_ce + cfg.divergence_nats else 0
        if self.diverging_steps >= cfg.divergence_steps:
            raise DivergenceError(
                f"the loss diverged: {loss:.4f} at {self._where(step)}, above the uniform guess "
                f"{self.uniform_ce:.4f} + {cfg.divergence_nats:g} nats for {self.diverging_steps} steps "
                f"in a row; stopped, {self._kept()}. {self.advice}"
            )

    def _refuse_diverged(self, ce: float | None, what: str, step: int) -> None:
        """A validation CE above the uniform guess + ``divergence_nats`` ends the run as diverged, however short
        it is (the loss check needs ``divergence_steps`` steps in a row; a short run never reaches them)."""
        if ce is None or self.uniform_ce is None or ce <= self.uniform_ce + self.cfg.divergence_nats:
            return
        raise DivergenceError(
            f"the run diverged: {what} is {ce:.4f} nats/token after {self._where(step)}, above the "
            f"uniform guess {self.uniform_ce:.4f} + {self.cfg.divergence_nats:g} nats; stopped, "
            f"{self._kept()}. {self.advice}"
        )

    def _where(self, step: int) -> str:
        return f"step {step} ({(step - 1) * self.cfg.tokens_per_step:,} tokens trained)"

    def _kept(self) -> str:
        if self.run is not None and self.last_ckpt_step is not None:
            return f"the last good checkpoint (step {self.last_ckpt_step}) is in {self.run.path}"
        return "no checkpoint was written"

    # -- hooks after a step
    def after_step(self, row: dict, last_step: int) -> None:
        step, cfg = row["step"], self.cfg
        if self.main:
            self.log.log(row)
            report = self.compile_report
            if report is not None and not report.done and (report.ready() or step == last_step):
                report.done = True
                compile_row = report.row(step, cfg.total_steps)
                self.log.log(compile_row)
                if not self.quiet:
                    print(describe(compile_row), file=sys.stderr, flush=True)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix_str(f"loss {row['loss']:.3f} {row['tok_s']:,.0f} tok/s{_util_text(row)}")
            elif not self.quiet and time.perf_counter() - self.last_progress >= self.progress_seconds:
                self.last_progress = time.perf_counter()
                print(
                    f"step {step}/{cfg.total_steps} ({row['tokens']:,} tokens): loss {row['loss']:.4f}, "
                    f"lr {row['lr']:.3g}, {row['tok_s']:,.0f} tok/s{_util_text(row)}, {row['elapsed']:,.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        if cfg.eval_every_steps and (step % cfg.eval_every_steps == 0 or step == cfg.total_steps):
            self.sampled_evaluation(step)
        if cfg.milestones and self.evaluate is not None and step < cfg.total_steps:
            before, now = (step - 1) * cfg.tokens_per_step, step * cfg.tokens_per_step
            if any(before < mark <= now for mark in cfg.milestones):
                self.milestone_evaluation(step)
        if self.info.enabled:  # every process stops after the same step (a signal may reach only some of them)
            signum = dist_utils.all_reduce_max(float(self.stop_signal or 0), self.info, self.device)
            self.stop_signal = int(signum) or None
        if (
            self.stop_signal is not None
            or step == last_step
            or step in self.hook_steps
            or (cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0)
        ):
            self.save(step)
        if self.stop_signal is not None:
            name = signal.Signals(self.stop_signal).name
            where = f"in {self.run.path}" if self.run is not None else "nowhere (no run directory)"
            raise TrainingInterrupted(
                f"{name} received: stopped after step {step} of {cfg.total_steps}, checkpoint committed {where}",
                self.stop_signal,
                step,
            )
        self.run_hooks(step)

    def run_hooks(self, step: int, missing_only: bool = False) -> None:
        """The evaluation hooks of ``step``, each row to metrics.jsonl; ``missing_only``: those whose row
        the resumed run's kept metrics lack (a hook killed after the checkpoint of its step)."""
        for hook in self.pieces.hooks:
            if step not in hook.steps or (missing_only and (hook.kind, step) in self.kept_rows):
                continue
            if self.main or self.sharded:  # a sharded forward needs every process; process 0 logs
                entries = hook.run(self.model, step)
                if self.main:
                    self.log.log({"kind": hook.kind, "step": step, **entries})
            dist_utils.barrier(self.info)

    def milestone_evaluation(self, step: int) -> None:
        """The final evaluation (the whole rescoring) at a milestone, as a ``milestone`` metrics row."""
        if self.main or self.sharded:
            t0 = time.perf_counter()
            result = self.evaluate(self.model, self.device, False)
            if self.main:
                self.log.log(
                    {
                        "kind": "milestone",
                        "step": step,
                        "tokens": step * self.cfg.tokens_per_step,
                        **{f"val_{k}": v for k, v in result.items() if k in ("ce", "bpb", "targets")},
                        "eval_seconds": time.perf_counter() - t0,
                        "elapsed": self.elapsed(),
                    }
                )
        dist_utils.barrier(self.info)

    def sampled_evaluation(self, step: int) -> None:
        if self.eval_windows is None:
            return
        if self.main or self.sharded:  # a sharded forward needs every process
            val_ce = sampled_eval(self.model, self.eval_windows, self.cfg.eval_batch_size, self.device)
        if self.main:
            row = {
                "kind": "eval",
                "step": step,
                "tokens": step * self.cfg.tokens_per_step,
                "val_ce": val_ce,
                "val_windows": int(self.eval_windows.shape[0]),
                "elapsed": self.elapsed(),
            }
            if not self.sharded and math.isfinite(val_ce):  # the model's geometry (DRM) on the first windows
                diagnostics = evaluation_diagnostics(self.model, self.eval_windows[:DIAGNOSTIC_WINDOWS], self.device)
                if diagnostics:
                    row["diagnostics"] = diagnostics
            self.log.log(row)
            if self.bar is not None:
                self.bar.set_postfix_str(f"{self.bar.postfix or ''} val {val_ce:.3f}".strip())
        if (self.main or self.sharded) and not math.isfinite(val_ce):
            raise NonFiniteLossError(
                f"non-finite sampled validation CE ({val_ce}) after {self._where(step)}; "
                f"stopped, {self._kept()}. {self.advice}"
            )
        if self.main or self.sharded:
            self._refuse_diverged(val_ce, "the sampled validation CE", step)
        dist_utils.barrier(self.info)

    def save(self, step: int) -> None:
        bad = (
            dist_utils.non_finite_parameters(self.model, self.info)
            if self.sharded
            else non_finite_parameters(self.model)
        )
        if bad:  # never commit weights that cannot be used; the previous checkpoint stays
            raise NonFiniteLossError(
                f"non-finite weights ({', '.join(bad[:3])}) after {self._where(step)}; stopped, "
                f"{self._kept()}. {self.advice}"
            )
        full_state = None
        if self.run is not None and self.sharded:  # collective: gathered on process 0
            full_state = dist_utils.gather_full_state(self.model, self.optimizer, self.info)
        if self.run is not None and self.main:
            self.run.save_checkpoint(
                self.model,
                self.optimizer,
                {
                    "step": step,
                    "tokens": step * self.cfg.tokens_per_step,
                    "elapsed": self.elapsed(),
                    "train_seconds": self.train_seconds_before + self.train_seconds,
                    "world_size": self.info.world_size,
                    **({"metrics": self.log.committed()} if self.log is not None and self.log.path else {}),
                },
                full_state=full_state,
            )
        self.last_ckpt_step = step
        dist_utils.barrier(self.info)

    def record_stop(self, reason: str, message: str) -> None:
        """A stopped (not finished) run's summary says why, so that a resume may take the advised fixes."""
        if self.run is not None and self.main:
            self.run.write_summary(
                {"finished": False, "stopped": reason, "message": message, "checkpoint_step": self.last_ckpt_step}
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- the end
    def finish(self, last_step: int, final_loss: float | None) -> dict:
        cfg, main = self.cfg, self.main
        steps_done = max(self.start_step, last_step)
        session_tokens = (last_step - self.start_step) * cfg.tokens_per_step
        summary = {
            "model": self.config["model"],
            "preset": self.config["preset"],
            "seed": cfg.seed,
            "params": self.config["params"],
            "steps": steps_done,
            "total_steps": cfg.total_steps,
            "tokens": steps_done * cfg.tokens_per_step,
            "finished": steps_done >= cfg.total_steps,
            "final_loss": final_loss,
            "tokens_per_s": (session_tokens / self.train_seconds) if self.train_seconds > 0 else None,
            "train_seconds": self.train_seconds_before + self.train_seconds,
            "world_size": self.info.world_size,
        }
        steps_now = last_step - self.start_step
        if self.utilisation is not None and steps_now > 0 and self.train_seconds > 0:  # this session's mean rate
            summary.update(self.utilisation.entries(self.train_seconds / steps_now))
            summary["gemm_peak_gflops"] = self.utilisation.peak["gflops"]
        eval_rows = [r for r in self.log.rows if r["kind"] == "eval"]
        if eval_rows:
            summary["last_sampled_val_ce"] = eval_rows[-1]["val_ce"]
        if self.evaluate is not None and summary["finished"]:
            if main or self.sharded:  # a sharded forward needs every process; process 0 reports
                t0 = time.perf_counter()
                result = self.evaluate(self.model, self.device, self.bar is not None)
                summary.update(
                    {f"val_{k}": v for k, v in result.items() if k in ("ce", "bpb", "ppl", "targets", "bytes")}
                )
                summary["eval_seconds"] = time.perf_counter() - t0
                if summary.get("val_ce") is not None and not math.isfinite(summary["val_ce"]):
                    raise NonFiniteLossError(
                        f"the final evaluation gave a non-finite CE ({summary['val_ce']}) after {self._where(last_step)}: "
                        f"the weights are finite but the model's outputs are not; stopped, {self._kept()}. {self.advice}"
                    )
                self._refuse_diverged(summary.get("val_ce"), "the final validation CE", last_step)
            dist_utils.barrier(self.info)
        if self.pieces.summary_extras is not None and summary["finished"] and main:
            summary.update(self.pieces.summary_extras(summary))
        if self.run is not None and main:
            summary["out_dir"] = str(self.run.path)
            self.run.write_summary(summary)
        dist_utils.teardown(self.info)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        return dict(summary, rows=self.log.rows)


def train(
    model: torch.nn.Module,
    batches: BatchSource | np.ndarray,
    val_tokens: np.ndarray | None,
    cfg: TrainConfig,
    out_dir: str | Path | RunDir | None = None,
    *,
    resume: bool = False,
    run_info: RunInfo | None = None,
    evaluate: Evaluate | None = None,
    device: str | torch.device | None = "auto",
    quiet: bool = False,
    stop_after_step: int | None = None,
    overwrite: bool = False,
    progress_seconds: float = PROGRESS_SECONDS,
    fsdp: bool = False,
    tensorboard: bool = False,
    pieces: TrainPieces | None = None,
) -> dict:
    """Train ``model`` under ``cfg``; return the summary (also ``out_dir/summary.json``).

    ``batches`` is a :class:`BatchSource` or a token stream (then language-model windows of it).
    ``val_tokens`` feeds the sampled evaluation during training (skipped when None);
    ``evaluate(model, device, progress)`` is the final evaluation of a finished run, whose
    ``ce``/``bpb``/``ppl``/``targets``/``bytes`` become the summary's ``val_*``. ``run_info`` adds
    entries to config.json (model name, preset, overrides, data provenance, tokenizer).
    ``stop_after_step`` ends the run early with a checkpoint (an interruption, for tests).
    ``overwrite`` deletes a previous run in ``out_dir`` (without it, and without ``resume``, such a
    directory is refused). Without a terminal a progress line goes to stderr every
    ``progress_seconds`` unless ``quiet``. ``fsdp`` shards the model with FSDP2 under torchrun
    (ignored in one process). ``tensorboard`` also writes every metrics row as TensorBoard scalars
    into ``out_dir/tensorboard`` (:mod:`drmlab.training.tensorboard`; needs the tensorboard package).
    ``pieces`` swaps the loss, the optimizer, evaluation hooks and summary entries
    (:class:`~drmlab.training.pieces.TrainPieces`; None: the language-model defaults).
    The returned dict also holds ``"rows"``: every metrics row written in this call.
    """
    if not isinstance(batches, BatchSource):
        if batches is None:
            raise ValueError("train needs batches: a token stream or a BatchSource")
        batches = LMWindows(batches, cfg.batch_size, cfg.seq_len)
    if resume and out_dir is None:
        raise ValueError("resume needs an output directory")
    if tensorboard:
        if out_dir is None:
            raise ValueError("tensorboard needs an output directory (the event files go to OUT/tensorboard)")
        require_tensorboard()
    run = out_dir if isinstance(out_dir, RunDir) or out_dir is None else RunDir(out_dir)
    trainer = Trainer(
        model,
        batches,
        cfg,
        run,
        val_tokens=val_tokens,
        evaluate=evaluate,
        run_info=run_info,
        device=device,
        quiet=quiet,
        progress_seconds=progress_seconds,
        fsdp=fsdp,
        tensorboard=tensorboard,
        pieces=pieces,
    )
    last_step = cfg.total_steps if stop_after_step is None else min(cfg.total_steps, stop_after_step)
    final_loss = None
    try:
        trainer.start(resume, overwrite)
        with _stop_on_signals(trainer):
            if trainer.start_step == 0 and cfg.eval_every_steps:
                trainer.sampled_evaluation(0)
            trainer.run_hooks(trainer.start_step, missing_only=trainer.start_step > 0)
            for step in range(trainer.start_step + 1, last_step + 1):
                row = trainer.train_step(step)
                final_loss = row["loss"]
                trainer.after_step(row, last_step)
        if trainer.bar is not None:
            trainer.bar.close()
        trainer.log.close()
        with _stop_on_signals(trainer, during="the final evaluation"):
            return trainer.finish(last_step, final_loss)
    except NonFiniteLossError as exc:
        trainer.record_stop("diverged" if isinstance(exc, DivergenceError) else "non-finite", str(exc))
        trainer.close()
        raise
    except BaseException:
        trainer.close()
        raise


@contextlib.contextmanager
def _stop_on_signals(trainer: Trainer, during: str | None = None):
    """While training (main thread only), SIGINT and SIGTERM ask the trainer to stop after the
    current step; a second signal of the same kind stops at once. ``during`` names a phase after the
    last checkpoint (the final evaluation) that a signal stops at once: nothing of the training is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if during is not None:
            raise TrainingInterrupted(
                f"{signal.Signals(signum).name} received during {during}: stopped it; {trainer._kept()}",
                signum,
                trainer.last_ckpt_step or 0,
            )
        if trainer.stop_signal == signum:  # asked twice: do not wait for the step
            raise StoppedAtOnce(signum, trainer._kept())
        trainer.stop_signal = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _util_text(row: dict) -> str:
    """ ", 41.2 GFLOP/s (31% of peak)" for a train row with utilisation entries, else ""."""
    if "gflops" not in row:
        return ""
    return f", {row['gflops']:,.1f} GFLOP/s ({100 * row['util']:.0f}% of peak)"
