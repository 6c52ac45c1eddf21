"""The training loop: :func:`train` and the loss it optimises, :func:`lm_loss`.

One optimizer step ``k`` (1-based) runs ``grad_accum`` micro-batches; micro-batch ``m`` is
``batches.train_batch(seed, k, m)``. For a window ``w`` of ``seq_len + 1`` tokens the loss is
``CE(model(w[:, :T], step=k).logits[:, t], w[:, t + 1]) + aux["loss_aux"]`` -- the explicit
next-token target; no model is ever handed labels to shift. The loss is divided by
``grad_accum``, gradients are clipped to a global norm, AdamW steps at ``optim.lr_at(k)``.

Files written to ``out_dir`` (process 0 only): ``config.json`` (the resolved run), ``metrics.jsonl``
(a ``train`` row per step; ``eval`` rows at every sampled evaluation), the checkpoint
(:mod:`drmlab.training.checkpoint`) every ``checkpoint_every`` tokens and at the end, and
``summary.json`` with the final deterministic rescoring of the validation stream.

``batch_fn`` replaces the stream windows with the caller's own data (a probe task such as
:mod:`drmlab.experiments.mqar`): ``batch_fn(seed, step, micro) -> (inputs [B, T], targets [B, T])``
must be a pure function of its coordinates returning the global micro-batch (each process takes
its contiguous share); the loss is :func:`targets_loss`, CE of ``logits[:, t]`` against
``targets[:, t]`` averaged over the targets that are not ``IGNORE_INDEX`` (-100). Token counts
(``tokens``, ``tok_s``) then count positions, batch x ``cfg.seq_len``, scored or not.

``resume=True`` reloads the checkpoint (weights, optimizer state, RNG) and continues; since the
batches and the learning rate are functions of the step alone, the losses and weights are
bit-identical to an uninterrupted run. A non-finite loss or gradient norm stops the run with
:class:`NonFiniteLossError` before the optimizer touches the weights; the checkpoint on disk is
the last good one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from drmlab.training import checkpoint as ckpt
from drmlab.training import distributed as dist_utils
from drmlab.training.batches import eval_sample, train_batch
from drmlab.training.config import TrainConfig
from drmlab.training.optim import build_optimizer, lr_at

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
IGNORE_INDEX = -100  # a target that is not scored (batch_fn batches)

# batch_fn(seed, step, micro) -> (inputs [B, T], targets [B, T]): a caller-supplied batch source.
BatchFn = Callable[[int, int, int], "tuple[torch.Tensor, torch.Tensor]"]

# Train settings that may differ when resuming (they change neither the batches nor the updates).
RESUMABLE_CHANGES = ("tokens", "eval_every", "eval_windows", "eval_tokens", "eval_batch_size", "checkpoint_every")


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; the message names the step."""


def lm_loss(model: torch.nn.Module, window: torch.Tensor, step: int | None = None, *, bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, next-token CE) of ``window`` [B, T + 1]: logits[:, t] are scored against window[:, t + 1]."""
    return targets_loss(model, window[:, :-1], window[:, 1:], step, bf16=bf16)


def targets_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, step: int | None = None, *,
                 bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, CE) of ``model(inputs)``: logits[:, t] scored against targets[:, t], mean over the
    targets that are not :data:`IGNORE_INDEX`; the total adds ``aux["loss_aux"]`` when the model gives one."""
    device_type = inputs.device.type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        out = model(inputs, step=step)
    logits = out.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    aux = out.aux.get("loss_aux") if out.aux else None
    loss = ce + aux.float() if aux is not None else ce
    return loss, ce


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
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum"))
            count += rows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / max(count, 1)


def count_params(model: torch.nn.Module) -> int:
    """Distinct parameters (tied tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def _model_config(model: torch.nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    if config is not None and dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return None


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def _resolved_config(model, cfg: TrainConfig, run_info: dict | None, world_size: int, device: torch.device) -> dict:
    import drmlab

    info = dict(run_info or {})
    return _jsonable(
        {
            "model": info.pop("model", getattr(model, "model_name", type(model).__name__)),
            "preset": info.pop("preset", getattr(model, "preset", None)),
            "overrides": info.pop("overrides", {}),
            "model_config": _model_config(model),
            "params": count_params(model),
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
                "drmlab": drmlab.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
        }
    )


def _check_resumable(saved: dict, fresh: dict) -> None:
    problems = []
    for key in ("model", "preset", "overrides", "model_config"):
        if saved.get(key) != fresh.get(key):
            problems.append(f"{key}: {saved.get(key)!r} in the run, {fresh.get(key)!r} now")
    for key, value in fresh["train"].items():
        if key in RESUMABLE_CHANGES:
            continue
        if saved.get("train", {}).get(key) != value:
            problems.append(f"{key}: {saved.get('train', {}).get(key)!r} in the run, {value!r} now")
    if problems:
        raise ValueError("cannot resume: the settings differ from the run's config.json: " + "; ".join(problems))


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after ``step`` (work lost with the interrupted run)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a half-written last line
            continue
        if int(row.get("step", 0)) <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    tmp.replace(path)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Logger:
    def __init__(self, path: Path | None):
        self.handle = open(path, "a", buffering=1) if path is not None else None
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if self.handle is not None:
            self.handle.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def train(
    model: torch.nn.Module,
    train_tokens: np.ndarray | None,
    val_tokens: np.ndarray | None,
    cfg: TrainConfig,
    out_dir: str | Path | None = None,
    *,
    resume: bool = False,
    run_info: dict | None = None,
    count_bytes: Callable[[int], int] | None = None,
    device: str | torch.device | None = "auto",
    quiet: bool = False,
    stop_after_step: int | None = None,
    final_eval: bool = True,
    batch_fn: BatchFn | None = None,
) -> dict:
    """Train ``model`` on ``train_tokens`` under ``cfg``; return the summary (also ``out_dir/summary.json``).

    ``run_info`` adds entries to config.json (the CLI passes model name, preset, overrides, data
    meta, tokenizer). ``count_bytes`` converts a number of scored validation targets to bytes for
    bits per byte (None: one byte per token). ``stop_after_step`` ends the run early with a
    checkpoint (an interruption, for tests); ``final_eval=False`` skips the final rescoring.
    ``batch_fn`` (see the module docstring) supplies the training batches instead of
    ``train_tokens`` (then None); the sampled evaluation and the final rescoring need
    ``val_tokens`` and are skipped when it is None.
    The returned dict also holds ``"rows"``: every metrics row written in this call.
    """
    cfg.validate()
    if (train_tokens is None) == (batch_fn is None):
        raise ValueError("train needs exactly one of train_tokens and batch_fn")
    if resume and out_dir is None:
        raise ValueError("resume needs an output directory")
    info, dev = dist_utils.setup(str(device) if isinstance(device, torch.device) else device)
    main = info.is_main
    out = Path(out_dir) if out_dir is not None else None
    core = model.to(dev)
    optimizer = build_optimizer(core, cfg)
    fresh_config = _resolved_config(core, cfg, run_info, info.world_size, dev)

    start_step, elapsed_before, train_seconds_before = 0, 0.0, 0.0
    last_ckpt_step: int | None = None
    if out is not None and main:
        out.mkdir(parents=True, exist_ok=True)
    if resume:
        if not ckpt.has_checkpoint(out):
            raise FileNotFoundError(f"nothing to resume in {out}: no checkpoint ({ckpt.STATE_FILE}, {ckpt.MODEL_FILE})")
        config_path = out / CONFIG_FILE
        if config_path.is_file():
            _check_resumable(json.loads(config_path.read_text()), fresh_config)
        state = ckpt.load_checkpoint(out, core, optimizer)
        start_step = int(state["step"])
        last_ckpt_step = start_step
        elapsed_before = float(state.get("elapsed", 0.0))
        train_seconds_before = float(state.get("train_seconds", 0.0))
        if main:
            _truncate_metrics(out / METRICS_FILE, start_step)
    else:
        torch.manual_seed(cfg.seed)
        if out is not None and main:
            (out / METRICS_FILE).unlink(missing_ok=True)
            for name in (ckpt.STATE_FILE, SUMMARY_FILE):
                (out / name).unlink(missing_ok=True)
    if out is not None and main:
        ckpt.write_json_atomic(out / CONFIG_FILE, fresh_config)
    dist_utils.barrier(info)

    if batch_fn is None:
        probe = torch.as_tensor(np.asarray(train_tokens[: min(cfg.seq_len, 16)], dtype=np.int64))[None]
    else:
        probe = _own_share(batch_fn(cfg.seed, 1, 0), 0, 1)[0][:1]
    net = dist_utils.wrap_model(core, info, dev, probe=probe)

    def next_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's (inputs, targets) of micro-batch ``micro`` of ``step``: stream windows
        scored against the next token, or the caller's ``batch_fn`` rows."""
        if batch_fn is not None:
            return _own_share(batch_fn(cfg.seed, step, micro), info.rank, info.world_size)
        window = train_batch(train_tokens, seed=cfg.seed, step=step, micro=micro, batch_size=cfg.batch_size,
                             seq_len=cfg.seq_len, rank=info.rank, world_size=info.world_size)
        return window[:, :-1], window[:, 1:]

    eval_windows = eval_sample(val_tokens, cfg.eval_windows, cfg.seq_len) if val_tokens is not None and cfg.eval_windows else None

    logger = _Logger(out / METRICS_FILE if (out is not None and main) else None)
    total_steps = cfg.total_steps
    last_step = total_steps if stop_after_step is None else min(total_steps, stop_after_step)
    params = [p for p in core.parameters() if p.requires_grad]
    t_start = time.perf_counter()
    train_seconds = 0.0
    bar = None
    if main and not quiet and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - t_start

    def run_eval(step: int) -> None:
        if eval_windows is None:
            return
        if main:
            val_ce = sampled_eval(core, eval_windows, cfg.eval_batch_size, dev)
            logger.log({"kind": "eval", "step": step, "tokens": step * cfg.tokens_per_step, "val_ce": val_ce,
                        "val_windows": int(eval_windows.shape[0]), "elapsed": elapsed()})
            if bar is not None:
                bar.set_postfix_str(f"{bar.postfix or ''} val {val_ce:.3f}".strip())
        dist_utils.barrier(info)

    def save(step: int) -> None:
        nonlocal last_ckpt_step
        if out is not None and main:
            ckpt.save_checkpoint(out, core, optimizer, {
                "step": step, "tokens": step * cfg.tokens_per_step, "elapsed": elapsed(),
                "train_seconds": train_seconds_before + train_seconds, "world_size": info.world_size,
            })
        last_ckpt_step = step
        dist_utils.barrier(info)

    try:
        if start_step == 0 and cfg.eval_every_steps:
            run_eval(0)
        loss_value = float("nan")
        for step in range(start_step + 1, last_step + 1):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            net.train()
            total = torch.zeros((), device=dev)
            total_ce = torch.zeros((), device=dev)
            for micro in range(cfg.grad_accum):
                inputs, targets = next_batch(step, micro)
                sync = info.enabled and micro < cfg.grad_accum - 1
                with net.no_sync() if sync else contextlib.nullcontext():
                    loss, ce = targets_loss(net, inputs.to(dev), targets.to(dev), step, bf16=cfg.bf16)
                    (loss / cfg.grad_accum).backward()
                total += loss.detach() / cfg.grad_accum
                total_ce += ce.detach() / cfg.grad_accum
            total = dist_utils.all_reduce_mean(total, info)
            total_ce = dist_utils.all_reduce_mean(total_ce, info)
            loss_value = float(total)
            where = f"step {step} ({(step - 1) * cfg.tokens_per_step:,} tokens trained)"
            kept = (f"the last good checkpoint (step {last_ckpt_step}) is in {out}" if (out is not None and last_ckpt_step is not None)
                    else "no checkpoint was written")
            if not math.isfinite(loss_value):
                raise NonFiniteLossError(f"non-finite training loss ({loss_value}) at {where}; stopped, {kept}. "
                                         "Try a lower --lr or a warm-up (--set warmup_fraction=0.05).")
            if cfg.grad_clip > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            else:
                grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
            if not math.isfinite(grad_norm):
                raise NonFiniteLossError(f"non-finite gradient norm ({grad_norm}) at {where} (loss {loss_value:.4f}); stopped, {kept}.")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t0
            train_seconds += dt
            tok_s = cfg.tokens_per_step / dt
            if main:
                logger.log({"kind": "train", "step": step, "tokens": step * cfg.tokens_per_step, "loss": loss_value,
                            "ce": float(total_ce), "lr": lr, "grad_norm": grad_norm, "tok_s": tok_s, "elapsed": elapsed()})
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"loss {loss_value:.3f} {tok_s:,.0f} tok/s")
            if cfg.eval_every_steps and (step % cfg.eval_every_steps == 0 or step == total_steps):
                run_eval(step)
            is_last = step == last_step
            if is_last or (cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0):
                save(step)
    finally:
        if bar is not None:
            bar.close()
        logger.close()

    steps_done = max(start_step, last_step)
    tokens_done = steps_done * cfg.tokens_per_step
    session_tokens = (last_step - start_step) * cfg.tokens_per_step
    all_train_seconds = train_seconds_before + train_seconds
    summary = {
        "model": fresh_config["model"],
        "preset": fresh_config["preset"],
        "seed": cfg.seed,
        "params": fresh_config["params"],
        "steps": steps_done,
        "total_steps": total_steps,
        "tokens": tokens_done,
        "finished": steps_done >= total_steps,
        "final_loss": loss_value if last_step > start_step else None,
        "tokens_per_s": (session_tokens / train_seconds) if train_seconds > 0 else None,
        "train_seconds": all_train_seconds,
        "world_size": info.world_size,
    }
    eval_rows = [r for r in logger.rows if r["kind"] == "eval"]
    if eval_rows:
        summary["last_sampled_val_ce"] = eval_rows[-1]["val_ce"]
    if final_eval and summary["finished"] and val_tokens is not None:
        if main:
            t0 = time.perf_counter()
            result = rescore_for_summary(core, val_tokens, cfg, count_bytes, dev, progress=bar is not None)
            summary.update({f"val_{k}": v for k, v in result.items() if k in ("ce", "bpb", "ppl", "targets", "bytes")})
            summary["eval_seconds"] = time.perf_counter() - t0
        dist_utils.barrier(info)
    if out is not None and main:
        summary["out_dir"] = str(out)
        ckpt.write_json_atomic(out / SUMMARY_FILE, summary)
    dist_utils.teardown(info)
    return dict(summary, rows=logger.rows)


def _own_share(batch: tuple, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's contiguous rows of a ``batch_fn`` micro-batch (inputs, targets) as int64."""
    inputs, targets = (torch.as_tensor(t).long() for t in batch)
    if inputs.dim() != 2 or inputs.shape != targets.shape:
        raise ValueError(f"batch_fn must return inputs and targets of one shape [B, T], got "
                         f"{tuple(inputs.shape)} and {tuple(targets.shape)}")
    rows = inputs.shape[0]
    if rows % world_size:
        raise ValueError(f"batch_fn gave {rows} rows, not divisible by the number of processes {world_size}")
    share = rows // world_size
    return inputs[rank * share : (rank + 1) * share], targets[rank * share : (rank + 1) * share]


def rescore_for_summary(model, val_tokens, cfg: TrainConfig, count_bytes, device, progress: bool = False) -> dict:
    """The final deterministic rescoring of a run (whole stream, or the first ``cfg.eval_tokens`` targets)."""
    from drmlab.evaluation.rescoring import rescore

    return rescore(model, val_tokens, cfg.seq_len, batch_size=cfg.eval_batch_size, max_targets=cfg.eval_tokens,
                   count_bytes=count_bytes, device=device, progress=progress)
