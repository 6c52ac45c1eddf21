"""Process-group plumbing for ``torchrun``: init, device choice, reductions, DDP wrapping.

Under ``torchrun --nproc_per_node N`` the environment carries ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`setup` then joins the process group (``nccl`` on CUDA, ``gloo`` on CPU). Without it the
run is a single process and every helper here is a no-op. A process group that the caller has
already initialised (e.g. a test using ``init_method="file://..."``) is used as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from drmlab.devices import resolve_device


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # whether setup() created the process group (and teardown destroys it)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0




def setup(device_name: str | None = "auto") -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group when there is one; return (info, this process's device)."""
    if dist.is_available() and dist.is_initialized():
        info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
        return info, resolve_device(device_name, info.local_rank)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), resolve_device(device_name)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=True), device


def teardown(info: DistInfo) -> None:
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The mean of ``value`` over processes (``value`` itself in a single process)."""
    if not info.enabled:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / info.world_size


def all_reduce_max(value: float, info: DistInfo, device: torch.device) -> float:
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device, probe: torch.Tensor | None = None) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` under torchrun, else ``model``.

    ``probe`` (a small token batch) is run forward and backward once to find parameters that
    receive no gradient; only then is ``find_unused_parameters`` switched on (it costs a graph
    traversal per step). Gradients are zeroed afterwards, so the probe leaves no trace.
    """
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    find_unused = False
    if probe is not None:
        out = model(probe.to(device), step=1)
        total = out.logits.float().sum()
        if "loss_aux" in out.aux:
            total = total + out.aux["loss_aux"].float()
        total.backward()
        find_unused = any(p.grad is None for p in model.parameters() if p.requires_grad)
        model.zero_grad(set_to_none=True)
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused)
