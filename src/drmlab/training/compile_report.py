"""Whether ``torch.compile`` pays for itself in a run (``drmlab train --compile``; docs/architecture.md
section 2, "Compiled models"): the eager forward and backward of one micro-batch timed before the
model is compiled, the first compiled step (which holds the compile), the next compiled steps, and
from them the compile's cost, the time it saves per step and the step after which it has paid back,
against the run's length.

    compile cost   C = t_first - t_compiled + sum_i (t_i - t_compiled)   (seconds: the first step minus a
                   compiled one, and what the sampled steps t_i spent over t_compiled -- a recompile at the second
                   step, when Dynamo makes an argument such as the step number dynamic, counts here)
    saving         s = grad_accum * (t_eager - t_compiled)   per optimizer step
    break-even     n = C / s   steps; worth it when the run has more than n steps (never when s <= 0)

Times are the forward and backward of the micro-batches only (the optimizer update is the same in
both); ``t_compiled`` is the fastest of :data:`COMPILED_SAMPLES` compiled steps, ``t_eager`` the second
of two eager passes (the first warms the allocator). Inductor's persistent caches make a second run
of the same model shape compile faster; the record keeps the cache counters Dynamo reports
(``fxgraph_cache_hit`` / ``fxgraph_cache_miss``, ``autograd_cache_hit`` / ``autograd_cache_miss``)
so a warm start is visible. A measurement, not a promise: on a loaded machine the figures move.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["COMPILED_SAMPLES", "CompileReport", "describe", "time_eager_pass"]

COMPILED_SAMPLES = 3  # compiled steps after the first whose fastest is t_compiled


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_eager_pass(run_pass: Callable[[], None], model: torch.nn.Module, device: torch.device) -> float:
    """Seconds of the second of two eager forward-and-backward passes ``run_pass()``, leaving no trace:
    the random state is restored (a dropout draws the same masks later) and the gradients are cleared."""
    devices = [device] if device.type == "cuda" else []
    seconds = 0.0
    with torch.random.fork_rng(devices=devices):
        for _ in range(2):
            _sync(device)
            t0 = time.perf_counter()
            run_pass()
            _sync(device)
            seconds = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
    return seconds


def _cache_counters() -> dict[str, int]:
    """Dynamo's inductor and AOT-autograd cache counters of this process (hits and misses)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - an internal module: no counters, no record
        return {}
    out = {}
    for group in ("inductor", "aot_autograd"):
        for key, value in counters.get(group, {}).items():
            if "cache_hit" in key or "cache_miss" in key:
                out[key] = int(value)
    return out


@dataclass
class CompileReport:
    """The timings of one compiled run and, once enough are seen (:meth:`ready`), its verdict."""

    eager_seconds: float | None  # one micro-batch's forward + backward, eager (None: not measured)
    grad_accum: int = 1
    first_seconds: float | None = None  # the first compiled step's micro-batches (the compile included)
    compiled_seconds: list[float] = field(default_factory=list)
    done: bool = False

    def observe(self, seconds: float) -> None:
        """The forward and backward seconds of one compiled optimizer step (all its micro-batches)."""
        if self.first_seconds is None:
            self.first_seconds = seconds
        elif len(self.compiled_seconds) < COMPILED_SAMPLES:
            self.compiled_seconds.append(seconds / self.grad_accum)

    def ready(self) -> bool:
        return not self.done and self.first_seconds is not None and len(self.compiled_seconds) >= COMPILED_SAMPLES

    def row(self, step: int, total_steps: int) -> dict:
        """The ``compile`` metrics row at optimizer step ``step`` of ``total_steps``."""
        compiled = min(self.compiled_seconds) if self.compiled_seconds else None
        cost = None
        if self.first_seconds is not None:  # the first step, and what any later sampled step spent recompiling
            base = compiled or 0.0
            cost = self.first_seconds - self.grad_accum * base
            cost += sum(self.grad_accum * (seconds - base) for seconds in self.compiled_seconds)
        saving = break_even = None
        if compiled is not None and self.eager_seconds is not None:
            saving = self.grad_accum * (self.eager_seconds - compiled)
            break_even = cost / saving if saving > 0 else None
        return {
            "kind": "compile",
            "step": step,
            "compile_seconds": cost,
            "eager_ms": None if self.eager_seconds is None else 1e3 * self.eager_seconds,
            "compiled_ms": None if compiled is None else 1e3 * compiled,
            "saving_ms_per_step": None if saving is None else 1e3 * saving,
            "break_even_steps": break_even,
            "total_steps": total_steps,
            "worth_it": None if saving is None else (break_even is not None and break_even < total_steps),
            "cache": _cache_counters(),
        }


def describe(row: dict) -> str:
    """One line for the run's output."""
    head = "compile: " + ("" if row["compile_seconds"] is None else f"{row['compile_seconds']:.1f} s to compile")
    cache = row.get("cache") or {}
    hits = sum(v for k, v in cache.items() if "hit" in k)
    if cache:
        head += f" (cache: {hits} hits, {sum(cache.values()) - hits} misses)"
    if row["compiled_ms"] is None or row["eager_ms"] is None:
        return head + "; too few steps (or no eager timing) to say whether it pays"
    head += f"; forward+backward {row['compiled_ms']:.1f} ms compiled vs {row['eager_ms']:.1f} ms eager"
    if row["break_even_steps"] is None:
        return head + f"; it saves nothing per step: not worth it for this run's {row['total_steps']:,} steps"
    verdict = "worth it" if row["worth_it"] else "not worth it"
    return (
        head + f"; pays back after {row['break_even_steps']:,.0f} steps: {verdict} for this run's "
        f"{row['total_steps']:,} steps"
    )
