"""Which device a command runs on: ``auto`` is this process's GPU when CUDA is there, else the CPU; and the
CPU's name, for the records that state where a figure was measured."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the platform's word for it, else "unknown")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def resolve_device(name: str | None, local_rank: int = 0) -> torch.device:
    """``auto``/None: CUDA (this process's GPU) when available, else CPU; otherwise ``name``."""
    if name in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"--device {name!r} is not a device: auto, cpu, cuda, cuda:N (or another torch device)"
        ) from None
    if device.type not in ("cpu", "cuda", "mps", "meta"):
        raise ValueError(f"--device {name!r}: drmlab runs on auto, cpu, cuda or cuda:N (and mps where torch has it)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device
