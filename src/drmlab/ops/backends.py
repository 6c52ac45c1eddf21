"""Choosing an operator's backend: a table from backend name to implementation.

Every operator with several implementations of one map (a C kernel, a pure-torch loop, later
log-depth and Triton forms) lists them in a :class:`BackendTable`, in the order ``"auto"`` tries
them.  Each :class:`Backend` says, for a device and a compute dtype, why it cannot run there (or
None when it can); asking for a backend that cannot run raises an error that names the backends
that can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Backend", "BackendTable", "BackendUnavailable"]


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
    """

    name: str
    impl: Any
    unavailable: Callable[[torch.device, torch.dtype], str | None]
    auto_devices: tuple[str, ...] | None = None


class BackendTable:
    """The backends of one operator, in ``"auto"`` preference order."""

    def __init__(self, operator: str, backends: Sequence[Backend]):
        self.operator = operator
        self.backends = {backend.name: backend for backend in backends}
        if len(self.backends) != len(backends):
            raise ValueError(f"{operator}: duplicate backend names")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.backends)

    def runnable(self, device: torch.device, dtype: torch.dtype) -> list[str]:
        """The backends that can run on ``device`` with compute dtype ``dtype``, in order."""
        return [name for name, b in self.backends.items() if b.unavailable(device, dtype) is None]

    def choose(self, name: str | None, device: torch.device, dtype: torch.dtype) -> Backend:
        """The backend ``name`` (None or ``"auto"``: the first one that can run here).

        Raises ValueError for an unknown name and :class:`BackendUnavailable` when the named
        backend cannot run on this device and dtype.
        """
        if name in (None, "auto"):
            for backend in self.backends.values():
                if backend.auto_devices is not None and device.type not in backend.auto_devices:
                    continue
                if backend.unavailable(device, dtype) is None:
                    return backend
            raise BackendUnavailable(f"{self.operator}: no backend runs on {device.type} {dtype}")
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
        return backend
