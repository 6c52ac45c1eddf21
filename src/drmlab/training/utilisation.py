"""How much of the machine a training step uses (torchtitan's habit): tokens/s, achieved GFLOP/s and
the fraction of this machine's measured matrix-multiply peak, in every train row of metrics.jsonl.

* :func:`count_step_flops`: the FLOPs of one optimizer step, counted, not estimated: one forward and
  backward of a single sequence of the run's shape under ``torch.utils.flop_counter.FlopCounterMode``
  (every matrix product, convolution and attention kernel the model runs, the backward included),
  times the sequences a step trains on (every registered model's cost is linear in the batch). The
  counted pass is undone: gradients are reset, buffers and the RNG restored, so the run's numbers do
  not move.
* :func:`gemm_peak_gflops`: this machine's GEMM rate, measured once per (processor, threads, dtype,
  torch) with a square product and cached as JSON beside the C kernels (``drmlab.ops.ckernels``'s
  cache directory).

The rate in a row is the counted FLOPs of a step over its wall time; its ``util`` is that over the
peak: on a CPU the element-wise work, the scans and the optimizer are time without counted FLOPs,
which is what ``util`` shows. Element-wise FLOPs are not counted (as in the field's MFU).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

PEAK_SIZE = 1024  # the square GEMM timed for the peak (n x n @ n x n)
PEAK_REPEATS = 5
CACHE_NAME = "gemm-peak.json"


def count_step_flops(model: torch.nn.Module, loss_fn, batch: tuple, step: int, sequences: int) -> int:
    """Counted FLOPs of one optimizer step of ``sequences`` sequences: forward + backward of the first
    sequence of ``batch`` (inputs, targets) through ``loss_fn(model, batch, step)``, times ``sequences``.
    The model's gradients are cleared afterwards (set to None) and torch's RNG is restored."""
    inputs, targets = batch
    one = (inputs[:1], targets[:1])
    counter = FlopCounterMode(display=False)
    was_training = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[inputs.device] if inputs.device.type == "cuda" else []):
            model.train()
            with counter:
                loss, _ = loss_fn(model, one, step)
                loss.backward()
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        for p in model.parameters():
            p.grad = None
    return int(counter.get_total_flops()) * int(sequences)


def processor_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """The processor or GPU a peak belongs to."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return processor_name()


def measure_gemm_gflops(device: torch.device, dtype: torch.dtype, size: int = PEAK_SIZE) -> float:
    """The best of a few timed ``size``-square products in ``dtype`` at torch's current thread count.

    On a CPU each product is timed by the shorter of its wall time and the process's CPU time over the
    thread count: another busy process on the same cores stretches the wall time, not the CPU time a
    thread spends computing, so a peak measured beside other work is not understated (it is cached for
    good, and every later ``util`` divides by it)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    threads = max(1, torch.get_num_threads())
    best = float("inf")
    for _ in range(PEAK_REPEATS + 1):  # the first call warms the kernel up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        if device.type == "cpu":
            seconds = min(seconds, (time.process_time() - cpu_start) / threads)
        best = min(best, seconds)
    return 2 * size**3 / max(best, 1e-9) / 1e9


def _cache_path() -> Path | None:
    from drmlab.ops.ckernels import cache_dirs, private_cache_dir

    for folder in cache_dirs():
        try:
            return private_cache_dir(folder) / CACHE_NAME
        except OSError:
            continue
    return None


def gemm_peak_gflops(device: torch.device, dtype: torch.dtype) -> dict:
    """{"gflops", "device", "threads", "dtype", "cached"}: this machine's GEMM rate in ``dtype`` at the
    current thread count, measured the first time and read from the cache afterwards."""
    threads = torch.get_num_threads() if device.type == "cpu" else None
    name = device_name(device)
    # "cpu-time": peaks cached before the CPU-time rule (measure_gemm_gflops) are measured again
    key = f"{name}|{device.type}|threads={threads}|{dtype}|torch={torch.__version__}|cpu-time"
    path = _cache_path()
    cached = {}
    if path is not None and path.is_file():
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = {}
    if not isinstance(cached, dict):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, (int, float)) and entry > 0:
        return {"gflops": float(entry), "device": name, "threads": threads, "dtype": str(dtype), "cached": True}
    gflops = measure_gemm_gflops(device, dtype)
    if path is not None:
        cached[key] = gflops
        tmp = path.with_name(f"{CACHE_NAME}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
    return {"gflops": gflops, "device": name, "threads": threads, "dtype": str(dtype), "cached": False}


class Utilisation:
    """The row entries of a step from its counted FLOPs and the peak: ``gflops`` (achieved) and ``util``."""

    def __init__(self, step_flops: int, peak: dict):
        self.step_flops, self.peak = step_flops, peak

    def entries(self, seconds: float) -> dict:
        if seconds <= 0:
            return {}
        gflops = self.step_flops / seconds / 1e9
        return {"gflops": gflops, "util": gflops / self.peak["gflops"]}

    def record(self) -> dict:
        """What config.json's runtime keeps: the counted FLOPs and the peak they are measured against."""
        return {
            "step_flops": self.step_flops,
            "gemm_peak_gflops": self.peak["gflops"],
            "peak_device": self.peak["device"],
            "peak_dtype": self.peak["dtype"],
            "peak_threads": self.peak["threads"],
        }
