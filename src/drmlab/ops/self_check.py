r"""The first-use self-check of the fast backends (``docs/architecture.md`` section 2): no kernel runs
unchecked where it has never run.

The C kernels are compiled on whatever CPU a process starts on and the Triton kernels on whatever
GPU it finds; the exactness tests (``tests/ops``) ran them on other machines, or not at all.  So
the first time a process chooses a checked backend (:class:`drmlab.ops.backends.Backend` with
``self_check=True``: the C and Triton backends) for one (operator, backend, device type, compute
dtype), :func:`verify` runs the operator on a small fixed input through that backend, forward and
gradient, and holds it to the operator's plain reference loop (in float64 / complex128 on the same
rounded inputs) with the tolerance of the exactness tests (:data:`TOLERANCES`, on the largest
error of the output and every gradient, relative to the reference's largest value and at least 1).
The run is the operator's probe in :data:`PROBES`, which :mod:`drmlab.ops.probes` fills from above the
operators it runs: this module knows no operator, so the dispatcher (:mod:`drmlab.ops.backends`) can
import it.
The verdict is kept for the process (:func:`backend_checks` lists every one; the trainer records
them in config.json's ``runtime.backend_checks``):

* passed: the backend runs, and is not checked again;
* failed (a mismatch, a non-finite value or an exception): under ``"auto"``
  :meth:`~drmlab.ops.backends.BackendTable.choose` skips it for the next backend and says so in one
  line on stderr, naming the backend, the device and the error (``drmlab: linear_scan backend 'c'
  failed its first-use check on cpu float32 (max error 1.0e-03 > 2e-05); using 'torch'``); a backend
  asked for by name raises :class:`~drmlab.ops.backends.BackendCheckFailed` in one line instead of
  running (:func:`failure_message`).

The backends made of torch operations (``"torch"``) are the fallbacks and are not checked: they are
the reference's own operations.  The fused decode step (:mod:`drmlab.ops.decode_step`, one model's
token rather than an operator's small input) is checked the same way by
:func:`drmlab.models.drm.fused_step.first_use_check` against the fast step on its first token.

The check runs outside whatever surrounds the call: grad on (also in ``no_grad``, ``inference_mode``
and a backward pass), autocast off, Python dispatch modes (a FLOP counter, a fake-tensor mode)
suspended, the dispatcher's thread-local key sets those of a new thread (a first use inside an operator's
own kernel, below autograd, runs with the conjugate and negative-view keys excluded: a complex
reference would read ``conj()`` views as if they were not conjugated), its own random generator (the global random state is untouched).  Under
``torch.compile`` the backend is chosen by a function the compiler evaluates eagerly
(``torch.compiler.assume_constant_result``), so the check runs there, outside the graph; code that
the compiler traces symbolically (``torch.compiler.is_dynamo_compiling()``) never starts a check.
Re-entry is harmless: while a key is being checked, choosing that backend again (the check's own
call) does not check it again.

``DRMLAB_NO_BACKEND_CHECK=1`` switches the check off: every backend runs unchecked, as before.
The cost is measured by ``benchmarks/bench_self_check.py`` (``docs/studies/bench-self-check``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "DISABLE_ENV",
    "TOLERANCES",
    "PROBES",
    "CheckRecord",
    "backend_checks",
    "verify",
    "announce",
    "recorded",
    "failure_message",
    "fused_kernel_passes",
    "tolerance",
    "judge",
    "disabled_by_env",
    "relative_error",
    "isolated",
]

DISABLE_ENV = "DRMLAB_NO_BACKEND_CHECK"

# the exactness tests' tolerances (tests/ops/test_ops_scan.py, test_ops_selective_scan.py,
# test_ops_triton.py, tests/models/test_fused_step.py): on max |got - ref| / max(1, max |ref|)
TOLERANCES: dict[str, dict[torch.dtype, float]] = {
    "linear_scan": {torch.float64: 1e-12, torch.complex128: 1e-12, torch.float32: 2e-5, torch.complex64: 2e-5},
    "selective_scan": {torch.float64: 1e-10, torch.float32: 1e-4},
    "decode_step": {torch.float64: 1e-12, torch.float32: 2e-5},
    # tests/ops/test_ops_state_bound.py, test_ops_conv.py (the fused kernels against their references)
    "state_bound": {torch.float64: 1e-12, torch.float32: 1e-5},
    "causal_depthwise_conv1d": {torch.float64: 1e-12, torch.float32: 1e-5},
}


@dataclass
class CheckRecord:
    """One first-use check: its key, its verdict and what it cost."""

    operator: str
    backend: str
    device: str
    dtype: str
    passed: bool
    max_error: float | None  # max |got - ref| / max(1, max |ref|) over output and gradients
    tolerance: float
    error: str | None  # why it failed: the mismatch or the exception, one line
    fallback: str | None  # the backend taken instead under "auto" (set when it is first taken)
    seconds: float

    def record(self) -> dict:
        return asdict(self)


_RECORDS: dict[tuple, CheckRecord] = {}
_RUNNING: set[tuple] = set()
_LOCK = threading.RLock()


def disabled_by_env() -> bool:
    """True when ``DRMLAB_NO_BACKEND_CHECK`` switches the check off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def backend_checks() -> list[dict]:
    """Every check this process has run, in order (what config.json's ``runtime.backend_checks``
    holds)."""
    with _LOCK:
        return [r.record() for r in _RECORDS.values()]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max(1, max |ref|), in float64 / complex128 on the CPU (inf when ``got`` has a
    non-finite value or another shape)."""
    if got.shape != ref.shape:
        return math.inf
    ref = ref.detach().cpu()
    wide = torch.complex128 if ref.is_complex() or got.is_complex() else torch.float64
    ref = ref.to(wide)
    got = got.detach().cpu().to(wide)
    if ref.numel() == 0:
        return 0.0
    err = (got - ref).abs().max().item()
    return err / max(1.0, ref.abs().max().item()) if math.isfinite(err) else math.inf


@functools.cache
def _fresh_dispatch_keys() -> tuple:
    """The dispatcher's thread-local (included, excluded) key sets of a thread that has done nothing."""
    found = {}

    def read() -> None:
        found["keys"] = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return found["keys"]


@contextlib.contextmanager
def isolated(device: torch.device):
    """The check's surroundings: no dispatch modes, the dispatch keys of a new thread, grad on (not
    inference mode), autocast off."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover -- a torch without it
        _disable_current_modes = contextlib.nullcontext
    with contextlib.ExitStack() as stack:
        if hasattr(torch._C, "_ForceDispatchKeyGuard"):
            stack.enter_context(torch._C._ForceDispatchKeyGuard(*_fresh_dispatch_keys()))
        stack.enter_context(_disable_current_modes())
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for kind in {"cpu", device.type} & {"cpu", "cuda", "xpu", "mps"}:
            stack.enter_context(torch.autocast(device_type=kind, enabled=False))
        yield


# operator -> probe(backend, device, dtype) -> the largest relative error of the output and every gradient
# against the operator's reference (drmlab.ops.probes fills it: the probes run the operators, which sit
# above this module); an operator without one is never checked
PROBES: dict[str, Callable[[str, torch.device, torch.dtype], float]] = {}


def fused_kernel_passes(operator: str, device: torch.device, dtype: torch.dtype) -> bool:
    """For a fused kernel with no backend table (the state bound, the depthwise convolution): its first-use
    verdict; a failure says in one line that the plain path runs instead, and is recorded."""
    record = verify(operator, "c", device, dtype)
    if record is None or record.passed:
        return True
    announce(record, "torch")
    return False


def tolerance(operator: str, dtype: torch.dtype) -> float:
    """The exactness tests' tolerance for ``operator`` computed in ``dtype`` (float32's where the
    tests name none)."""
    table = TOLERANCES.get(operator, {})
    return table.get(dtype, table.get(torch.float32, 2e-5))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def judge(
    operator: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    run: Callable[[], float],
    isolate: bool = True,
):
    """Run ``run`` (returning the relative error; raising on a failure of its own), under
    :func:`isolated` unless not ``isolate``, timed, and make its :class:`CheckRecord` (not kept:
    :func:`verify` keeps it)."""
    tol = tolerance(operator, dtype)
    start = time.perf_counter()
    err: float | None = None
    try:
        with isolated(device) if isolate else contextlib.nullcontext():
            err = float(run())
        if math.isfinite(err) and err <= tol:
            error = None
        elif math.isfinite(err):
            error = f"max error {err:.1e} > {tol:.0e}"
        else:
            err, error = None, "a non-finite value or a wrong shape in its output or gradient"
    except Exception as exc:  # noqa: BLE001 -- any failure of the backend is the verdict
        err, error = None, _one_line(exc)
    seconds = time.perf_counter() - start
    return CheckRecord(
        operator,
        backend,
        device.type,
        str(dtype).removeprefix("torch."),
        error is None,
        err,
        tol,
        error,
        None,
        seconds,
    )


def verify(
    operator: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    run: Callable[[], float] | None = None,
    isolate: bool = True,
) -> CheckRecord | None:
    """The verdict on ``backend`` of ``operator`` for ``device``'s type and compute ``dtype``: checked
    now on first use (by ``run``, else the operator's probe in :data:`PROBES`; under :func:`isolated`
    unless not ``isolate``), kept after.  None where nothing is checked: no probe, switched off
    (``DRMLAB_NO_BACKEND_CHECK``), inside this very check, or while the compiler traces
    symbolically."""
    key = (operator, backend, device.type, dtype)
    found = _RECORDS.get(key)
    if found is not None:
        return found
    if run is None:
        probe = PROBES.get(operator)
        if probe is None:
            return None
        run = lambda: probe(backend, device, dtype)  # noqa: E731
    if disabled_by_env() or torch.compiler.is_dynamo_compiling():
        return None
    with _LOCK:  # one check at a time; another thread waits here for the verdict
        found = _RECORDS.get(key)
        if found is not None or key in _RUNNING:  # in _RUNNING: this thread's own check re-entered
            return found
        _RUNNING.add(key)
        try:
            record = judge(operator, backend, device, dtype, run, isolate)
        finally:
            _RUNNING.discard(key)
        _RECORDS[key] = record
        return record


def recorded(operator: str, backend: str, device: torch.device, dtype: torch.dtype) -> CheckRecord | None:
    """The kept verdict for this key, or None when it has not been checked (nothing is run)."""
    return _RECORDS.get((operator, backend, device.type, dtype))


def announce(record: CheckRecord, fallback: str) -> None:
    """Say, once per failed check, which backend runs instead (one line on stderr) and record it."""
    with _LOCK:
        if record.fallback is not None:
            return
        record.fallback = fallback
    print(
        f"drmlab: {record.operator} backend {record.backend!r} failed its first-use check on {record.device} "
        f"{record.dtype} ({record.error}); using {fallback!r}",
        file=sys.stderr,
    )


def failure_message(record: CheckRecord, others: str) -> str:
    """The one line of :class:`~drmlab.ops.backends.BackendCheckFailed` for a backend asked for by name."""
    return (
        f"{record.operator}: backend {record.backend!r} failed its first-use check on {record.device} "
        f"{record.dtype} ({record.error}); ask for 'auto' (available here: {others}), or set "
        f"{DISABLE_ENV}=1 to run it unchecked"
    )
