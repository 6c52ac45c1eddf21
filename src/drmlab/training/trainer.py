"""The training loop: :func:`train`, built from small pieces (:class:`Trainer`).

One optimizer step ``k`` (1-based) runs ``grad_accum`` micro-batches; micro-batch ``m`` comes from
the run's :class:`~drmlab.training.batches.BatchSource` at (seed, k, m) -- by default
:class:`~drmlab.training.batches.LMWindows` over a token stream, where a window ``w`` of
``seq_len + 1`` tokens is scored as ``CE(model(w[:, :T], step=k).logits[:, t], w[:, t + 1])``
(the explicit next-token target; no model is ever handed labels to shift), plus
``aux["loss_aux"]`` when the model gives one (:mod:`drmlab.training.losses`). The loss is divided by
``grad_accum``, gradients are clipped to a global norm, AdamW steps at ``optim.lr_at(k)``.

A study swaps pieces of this (:class:`~drmlab.training.pieces.TrainPieces`): the loss
(``loss_fn``), the optimizer (``optimizer_builder``: parameter groups at their own base rates, each
scheduled from its own), evaluation hooks at given steps (rows of metrics.jsonl, a checkpoint
committed before each) and entries of the finished summary; the step, the guards, checkpoints,
resume and the signal handling stay here.

The pieces: :meth:`Trainer.start` (fresh or resumed), :meth:`Trainer.train_step` (micro-batches,
clipping, the non-finite guard), :meth:`Trainer.after_step` (metrics, sampled evaluation,
checkpoint) and :meth:`Trainer.finish` (summary and the final evaluation). Their jobs live beside
this module, one each: config.json (:mod:`~drmlab.training.run_config`), the resume checks
(:mod:`~drmlab.training.resume`), the stops and the divergence guard (:mod:`~drmlab.training.stops`),
the evaluations and hooks (:mod:`~drmlab.training.evaluating`), checkpoints
(:mod:`~drmlab.training.checkpointing`), the FLOP count (:mod:`~drmlab.training.measuring`), the compiled
forward (:mod:`~drmlab.training.compiled`) and the
end (:mod:`~drmlab.training.finishing`); every name they define is importable from here too.
The files of the run directory are :mod:`drmlab.runs`'s.

``resume=True`` reloads the checkpoint (weights, optimizer state, RNG) and continues; since the
batches and the learning rate are functions of the step alone, the losses and weights are
bit-identical to an uninterrupted run. Resuming refuses other data, tokenizer, model or
schedule-defining settings (:func:`~drmlab.training.resume.check_resumable`). Training into a
directory that already holds a run is refused unless ``resume`` or ``overwrite``; the writing
process holds the run's lock (:class:`drmlab.runs.RunLock`).

``cfg.compile`` runs the training forward through ``torch.compile(fullgraph=True)``
(:mod:`drmlab.training.compiling`, :mod:`drmlab.training.compiled`); evaluation and checkpoints use the uncompiled model. A model
that cannot be compiled as one graph stops the run at its first step with
:class:`~drmlab.training.compiling.CompileError`, one line naming the operation that broke the graph.

``tensorboard=True`` hands every metrics row to a TensorBoard sink as well
(:mod:`drmlab.training.tensorboard`): an output option, like ``quiet``, not a train setting, so it
is not part of the run's config and may differ on every resume. ``fsdp=True`` under torchrun shards
the model with FSDP2 instead of wrapping it in DDP (:mod:`drmlab.training.distributed`); the run
directory and its checkpoints keep the single-process format.

Each stop leaves the last committed checkpoint loadable and finite (:mod:`~drmlab.training.stops`):
:class:`NonFiniteLossError`, :class:`DivergenceError`, and :class:`TrainingInterrupted` after SIGINT or SIGTERM.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from drmlab.ops.self_check import backend_checks
from drmlab.runs import MetricsLog, RunDir
from drmlab.training import distributed as dist_utils
from drmlab.training import pauses
from drmlab.training.batches import BatchSource, LMWindows, eval_sample
from drmlab.training.checkpointing import Checkpoints
from drmlab.training.compile_choice import AUTO
from drmlab.training.compile_report import describe
from drmlab.training.compiled import Compiling
from drmlab.training.compiling import CompileError
from drmlab.training.config import TrainConfig
from drmlab.training.evaluating import Evaluate, Evaluations, sampled_eval  # noqa: F401 (re-exported)
from drmlab.training.fast import memory_products_in_bf16, restore_memory_products
from drmlab.training.finishing import Finishing
from drmlab.training.losses import IGNORE_INDEX, lm_loss, lm_loss_fn, targets_loss  # noqa: F401 (re-exported)
from drmlab.training.measuring import Measurements
from drmlab.training.optim import build_optimizer, lr_at
from drmlab.training.pauses import counting_pauses
from drmlab.training.pieces import TrainPieces
from drmlab.training.resume import (  # noqa: F401 (re-exported)
    DATA_IDENTITY,
    FIXES_AFTER_NON_FINITE,
    RESUMABLE_CHANGES,
    RUNTIME_BITS,
    Resuming,
    check_resumable,
    config_defaults,
    runtime_drift_note,
)
from drmlab.training.run_config import resolved_config
from drmlab.training.run_info import RunInfo
from drmlab.training.stops import (  # noqa: F401 (re-exported)
    DivergenceError,
    Guards,
    NonFiniteLossError,
    StoppedAtOnce,
    TrainingInterrupted,
    stop_on_signals,
)
from drmlab.training.tensorboard import open_sink, require_tensorboard
from drmlab.training.utilisation import Utilisation

PROGRESS_SECONDS = 30.0  # without a terminal, a progress line this often
# a checkpoint at least this often (seconds of wall time since the last one), beside the cadence in steps: a
# process killed without a signal (a machine or a session that ends) loses at most this much training
CHECKPOINT_SECONDS = 600.0


class Trainer(Resuming, Measurements, Compiling, Guards, Evaluations, Checkpoints, Finishing):
    """One training run in pieces; :func:`train` drives it. See the module docstring; the methods of its
    other jobs come from the mixins (resume, measuring, compiling, stops, evaluating, checkpointing, finishing)."""

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
        checkpoint_seconds: float | None = CHECKPOINT_SECONDS,
    ):
        cfg.validate()
        self.cfg, self.batches, self.run, self.evaluate = cfg, batches, run, evaluate
        self.pieces = pieces = pieces if pieces is not None else TrainPieces()
        self.loss_fn = pieces.loss_fn if pieces.loss_fn is not None else lm_loss_fn(cfg.bf16)
        self.hook_steps, self.advice, self.kept_rows = pieces.hook_steps, pieces.advice, set()
        self.saved_runtime: dict | None = None  # a resumed run's config.json runtime (_resume)
        self.info, self.device = dist_utils.setup(str(device) if isinstance(device, torch.device) else device)
        self.main = self.info.is_main
        self.model = model.to(self.device)
        # the memory's products in bf16 too (docs/drm.md A.4.7), while this trainer trains: close() restores them
        self.memory_switched = memory_products_in_bf16(self.model) if cfg.bf16 and cfg.bf16_memory_products else []
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
        self.elapsed_before = self.train_seconds_before = self.train_seconds = self.paused_seconds_before = 0.0
        self.paused_at_start = pauses.paused_seconds()
        self.quiet, self.bar, self.net, self.log, self.lock = quiet, None, None, None, None
        self.progress_seconds, self.last_progress = progress_seconds, time.perf_counter()
        self.checkpoint_seconds, self.last_save = checkpoint_seconds, time.monotonic()
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
            changed, lost_rows = self._resume()
        else:
            torch.manual_seed(self.cfg.seed)
        self.utilisation = self._measure_utilisation()
        if run is not None and main:
            self.config["runtime"]["backend_checks"] = backend_checks()  # the first-use checks run so far
            run.write_config(self.config)
        dist_utils.barrier(self.info)
        if resume and self.pieces.hooks and run.metrics_path.is_file():  # which hook rows the kept metrics hold
            self.kept_rows = {(row.get("kind"), row.get("step")) for row in run.read_metrics()}
        probe = self.batches.batch(self.cfg.seed, 1, 0)[0][:1, : min(self.cfg.seq_len, 16)]
        self.net = dist_utils.wrap_model(self.model, self.info, self.device, probe=probe)
        self._start_compiling(self.saved_runtime if resume else None)
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
        self.t_start = pauses.now()
        if main and not self.quiet and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.cfg.total_steps, initial=self.start_step, unit="step", dynamic_ncols=True)

    def elapsed(self) -> float:
        """Seconds of this run so far, its earlier sessions' included; time suspended (SIGTSTP) left out."""
        return self.elapsed_before + pauses.now() - self.t_start

    def paused_seconds(self) -> float:
        """Seconds this run has spent suspended by SIGTSTP, its earlier sessions' included."""
        return self.paused_seconds_before + pauses.paused_seconds() - self.paused_at_start

    # -- one optimizer step
    def train_step(self, step: int) -> dict:
        """Micro-batches, gradient clipping and the non-finite guard; the optimizer update. Returns the row."""
        cfg, dev, info = self.cfg, self.device, self.info
        t0 = pauses.now()
        lr = lr_at(step, cfg)
        rates = {}
        for group, base, name in zip(self.optimizer.param_groups, self.base_lrs, self.group_names):
            group["lr"] = lr_at(step, cfg, base)  # equals lr for a group at cfg.lr
            if name is not None:
                rates[f"lr_{name}"] = group["lr"]
        try:
            total, sums, entries = self._micro_batches(step)
        except CompileError as exc:
            if cfg.compile != AUTO or self.eager_net is None:
                raise
            self._compile_fell_back(exc)  # auto's compile failed: this step and the rest run eager
            total, sums, entries = self._micro_batches(step)
        if self.compile_report is not None and not self.compile_report.done:  # its first steps only
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            self.compile_report.observe(pauses.now() - t0)
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
        dt = pauses.now() - t0
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

    def _micro_batches(self, step: int) -> tuple[torch.Tensor, dict, dict]:
        """Forward and backward of step ``step``'s micro-batches: (the mean loss, the loss piece's tensor entries
        averaged, its other entries)."""
        cfg, dev, info = self.cfg, self.device, self.info
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
        return total, sums, entries

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
                self._record_compile(compile_row)
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
        # read once (the handler may set stop_signal at any moment; one arriving later stops after the next step)
        stop, checkpoint_due = self._agree_on_stop_and_checkpoint()
        if (
            stop is not None
            or step == last_step
            or step in self.hook_steps
            or (cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0)
            or checkpoint_due
        ):
            self.save(step)
        if stop is not None:
            name = signal.Signals(stop).name
            where = f"in {self.run.path}" if self.run is not None else "nowhere (no run directory)"
            raise TrainingInterrupted(
                f"{name} received: stopped after step {step} of {cfg.total_steps}, checkpoint committed {where}",
                stop,
                step,
            )
        self.run_hooks(step)

    def _agree_on_stop_and_checkpoint(self) -> tuple[int | None, bool]:
        """The stop signal received (None: none) and whether ``checkpoint_seconds`` have passed since the last
        checkpoint (or the start). In a distributed run every process takes the largest of each over all of
        them, in one all-reduce per step: a signal that reached one process, or a clock that says a checkpoint
        is due on one, counts for all, so they stop and commit after the same step."""
        due = self.checkpoint_seconds is not None and time.monotonic() - self.last_save >= self.checkpoint_seconds
        signum = self.stop_signal or 0
        if self.info.enabled:
            signum, due = dist_utils.all_reduce_max([float(signum), float(due)], self.info, self.device)
        return int(signum) or None, bool(due)

    def close(self) -> None:
        restore_memory_products(self.memory_switched)  # the model leaves as it came
        self.memory_switched = []
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None


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
    checkpoint_seconds: float | None = CHECKPOINT_SECONDS,
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
    ``checkpoint_seconds`` commits a checkpoint whenever that much wall time has passed since the last one,
    beside ``cfg``'s cadence in steps (None: the cadence only); when a checkpoint falls changes no result.
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
        checkpoint_seconds=checkpoint_seconds,
    )
    last_step = cfg.total_steps if stop_after_step is None else min(cfg.total_steps, stop_after_step)
    final_loss = None
    try:
        with counting_pauses():  # a suspension (SIGTSTP) is left out of the run's times
            trainer.start(resume, overwrite)
            with stop_on_signals(trainer):
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
            with stop_on_signals(trainer, during="the final evaluation"):
                summary = trainer.finish(last_step, final_loss)
            restore_memory_products(trainer.memory_switched)  # the model leaves as it came
            return summary
    except NonFiniteLossError as exc:
        trainer.record_stop("diverged" if isinstance(exc, DivergenceError) else "non-finite", str(exc))
        trainer.close()
        raise
    except BaseException:
        trainer.close()
        raise


def _util_text(row: dict) -> str:
    """ ", 41.2 GFLOP/s (31% of peak)" for a train row with utilisation entries, else ""."""
    if "gflops" not in row:
        return ""
    return f", {row['gflops']:,.1f} GFLOP/s ({100 * row['util']:.0f}% of peak)"
