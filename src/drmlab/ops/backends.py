"""Choosing an operator's backend: a table from backend name to implementation.

Every operator with several implementations of one map (a C kernel, a pure-torch loop, later
log-depth and Triton forms) lists them in a :class:`BackendTable`, in the order ``"auto"`` tries
them.  Each :class:`Backend` says, for a device and a compute dtype, why it cannot run there (or
None when it can); asking for a backend that cannot run raises an error that names the backends
that can.  Each table is kept under its operator's name (:func:`table_of`): an operator's custom
operator (its ``op.py``), which the package's dispatcher imports, finds the table there when it runs.

The C and Triton backends (``self_check=True``) are checked against the operator's reference on
their first use in a process (:mod:`drmlab.ops.self_check`): under ``"auto"`` one
that fails is skipped for the next backend, said in one line; asked for by name, it raises
:class:`BackendCheckFailed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import self_check

__all__ = ["Backend", "BackendTable", "BackendUnavailable", "BackendCheckFailed", "table_of"]


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on these inputs' device and dtype."""


@dataclass(frozen=True)
class Backend:
    """One implementation of an operator.

    ``impl`` is whatever the operator's dispatcher calls (a module or an object with the
    operator's forward / backward); ``unavailable(device, dtype)`` returns None when the backend
    runs on tensors of that device and compute dtype, else the reason it does not.
    ``auto_devices``: the device types on which ``"auto"`` may choose it (None: every device);
    elsewhere it runs only when asked for by name (Triton on the CPU, under its interpreter).
    ``self_check``: checked against the operator's reference on first use
    (:mod:`drmlab.ops.self_check`); the torch backends, made of the reference's own operations and
    the last fallback, are not.
    """

    name: str
    impl: Any
    unavailable: Callable[[torch.device, torch.dtype], str | None]
    auto_devices: tuple[str, ...] | None = None
    self_check: bool = False


class BackendTable:
    """The backends of one operator, in ``"auto"`` preference order (kept for :func:`table_of`)."""

    def __init__(self, operator: str, backends: Sequence[Backend]):
        self.operator = operator
        self.backends = {backend.name: backend for backend in backends}
        if len(self.backends) != len(backends):
            raise ValueError(f"{operator}: duplicate backend names")
        _TABLES[operator] = self

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.backends)

    def runnable(self, device: torch.device, dtype: torch.dtype) -> list[str]:
        """The backends that can run on ``device`` with compute dtype ``dtype``, in order."""
        return [name for name, b in self.backends.items() if b.unavailable(device, dtype) is None]

    def _verdict(self, backend: Backend, device: torch.device, dtype: torch.dtype):
        """The backend's first-use check (run now when it has not run), or None when unchecked."""
        if not backend.self_check:
            return None
        return self_check.verify(self.operator, backend.name, device, dtype)

    def choose(self, name: str | None, device: torch.device, dtype: torch.dtype) -> Backend:
        """The backend ``name`` (None or ``"auto"``: the first one that can run here and passes its
        first-use check).

        Raises ValueError for an unknown name, :class:`BackendUnavailable` when the named backend
        cannot run on this device and dtype, and its subclass :class:`BackendCheckFailed` when it
        failed its first-use check.
        """
        if name in (None, "auto"):
            failed = []
            for backend in self.backends.values():
                if backend.auto_devices is not None and device.type not in backend.auto_devices:
                    continue
                if backend.unavailable(device, dtype) is not None:
                    continue
                verdict = self._verdict(backend, device, dtype)
                if verdict is not None and not verdict.passed:
                    failed.append(verdict)
                    continue
                if failed:
                    for verdict in failed:
                        self_check.announce(verdict, backend.name)
                return backend
            checks = "".join(f"; {v.backend!r} failed its first-use check ({v.error})" for v in failed)
            raise BackendUnavailable(f"{self.operator}: no backend runs on {device.type} {dtype}{checks}")
        if name not in self.backends:
            raise ValueError(
                f"{self.operator}: unknown backend {name!r}; use 'auto' or one of {', '.join(map(repr, self.names))}"
            )
        backend = self.backends[name]
        reason = backend.unavailable(device, dtype)
        if reason is not None:
            others = ", ".join(map(repr, self.runnable(device, dtype))) or "none"
            raise BackendUnavailable(
                f"{self.operator}: backend {name!r} is not available on {device.type} {dtype} "
                f"({reason}); available here: {others}"
            )
        verdict = self._verdict(backend, device, dtype)
        if verdict is not None and not verdict.passed:
            others = ", ".join(repr(n) for n in self.runnable(device, dtype) if n != name) or "none"
            raise BackendCheckFailed(self_check.failure_message(verdict, others))
        return backend


class BackendCheckFailed(BackendUnavailable):
    """A backend asked for by name failed its first-use check (:mod:`drmlab.ops.self_check`) on
    this device and dtype."""


_TABLES: dict[str, BackendTable] = {}  # operator -> its table (the one made last)


def table_of(operator: str) -> BackendTable:
    """The backend table of ``operator``, as the operator's package made it (``drmlab.ops.linear_scan.BACKENDS``
    for ``"linear_scan"``)."""
    return _TABLES[operator]
