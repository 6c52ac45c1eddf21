"""Which device a command runs on: ``auto`` is this process's GPU when CUDA is there, else the CPU."""

from __future__ import annotations

import torch


def resolve_device(name: str | None, local_rank: int = 0) -> torch.device:
    """``auto``/None: CUDA (this process's GPU) when available, else CPU; otherwise ``name``."""
    if name in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device
