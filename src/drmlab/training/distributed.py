"""Process-group plumbing for ``torchrun``: init, device choice, reductions, DDP and FSDP2 wrapping.

Under ``torchrun --nproc_per_node N`` the environment carries ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`setup` then joins the process group (``nccl`` on CUDA, ``gloo`` on CPU). Without it the
run is a single process and every helper here is a no-op. A process group that the caller has
already initialised (e.g. a test using ``init_method="file://..."``) is used as it is.

Two ways to split one global batch over the processes (both give the single-process updates up
to float rounding, since each process's mean loss over an equal share of rows is averaged):

* :func:`wrap_model` -- ``DistributedDataParallel``: every process holds the whole model and
  optimizer; gradients are all-reduced.
* :func:`shard_model` -- FSDP2 (``torch.distributed.fsdp.fully_shard``; Zhao et al. 2023,
  "PyTorch FSDP", and the torch "FSDP2" docs): each process holds 1/N of every parameter, gradient
  and optimizer moment. ``fully_shard`` wraps every block (each member of an ``nn.ModuleList``
  named in :data:`BLOCK_LISTS`), then the root; a block's parameters are all-gathered just before
  its forward and backward and freed after, gradients are reduce-scattered. Checkpoints gather the
  full state dict on process 0 (:func:`gather_full_state`) so the run directory has the
  single-process format, and every process reads the full tensors back and keeps its shard
  (:func:`load_sharded_checkpoint`). A sharded model's forward is collective: sampled and final
  evaluations run on every process (each on the whole set; process 0 reports).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from drmlab.devices import resolve_device
from drmlab.runs import RunDir
from drmlab.runs import non_finite_parameters as local_non_finite_parameters

# The last name of the nn.ModuleLists whose members are the model's repeated blocks, each sharded
# on its own: GPT-2's ``transformer.h``, MAMBA's ``layers``, LOOPED's and RESOLVENT's ``blocks``.
# A model without one (the DRM family: one state-space layer) is sharded as one unit at the root.
BLOCK_LISTS = ("blocks", "layers", "h")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # whether setup() created the process group (and teardown destroys it)

    @property
    def enabled(self) -> bool:
        """Whether the run is data-parallel: several processes, or one that torchrun launched (so that
        ``torchrun --nproc_per_node 1 ... --fsdp`` shards over one rank, as on a one-GPU machine)."""
        return self.world_size > 1 or self.owns_group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device_name: str | None = "auto") -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group when there is one; return (info, this process's device)."""
    if dist.is_available() and dist.is_initialized():
        info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
        return info, resolve_device(device_name, info.local_rank)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun of one process still joins a group
        return DistInfo(), resolve_device(device_name)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=True), device


def teardown(info: DistInfo) -> None:
    """Destroy the process group that :func:`setup` created. The ``DistributedDataParallel`` wrapper must be
    gone first: its C++ reducer holds the group, and were it the last holder, the group's destructor would run
    where the reducer is freed, with the GIL held, and wait for gloo's worker threads, one of which may need
    the GIL to free a finished collective's tensors: a deadlock at exit (seen in about one run in four with a
    checkpoint after every step). Destroyed here, the group's destructor releases the GIL."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The mean of ``value`` over processes (``value`` itself in a single process)."""
    if not info.enabled:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / info.world_size


def all_reduce_max(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """The largest of each of ``values`` over processes, in one all-reduce (``values`` in a single process)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap_model(
    model: torch.nn.Module, info: DistInfo, device: torch.device, probe: torch.Tensor | None = None
) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` under torchrun, else ``model`` (also a model already
    sharded by :func:`shard_model`).

    ``probe`` (a small token batch) is run forward and backward once to find parameters that
    receive no gradient; only then is ``find_unused_parameters`` switched on (it costs a graph
    traversal per step). Gradients are zeroed afterwards, so the probe leaves no trace.
    """
    if not info.enabled or is_sharded(model):
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


# ---------------------------------------------------------------- FSDP2


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 module (its parameters are DTensor shards)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks :func:`shard_model` shards one by one: the members of every ``nn.ModuleList``
    whose name ends in one of :data:`BLOCK_LISTS` (outermost lists only) that hold parameters."""
    blocks: list[torch.nn.Module] = []
    taken: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or name.rsplit(".", 1)[-1] not in BLOCK_LISTS:
            continue
        if any(name.startswith(prefix + ".") for prefix in taken):
            continue
        taken.append(name)
        blocks.extend(block for block in module if any(True for _ in block.parameters()))
    return blocks


def shard_model(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """FSDP2 over all processes: ``fully_shard`` on every block (:func:`block_modules`), then the
    root; returns ``model`` itself (now an FSDP module), or ``model`` untouched in one process.
    Build the optimizer afterwards: sharding replaces the parameters with DTensor shards."""
    if not info.enabled:
        return model
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:
        raise RuntimeError(f"FSDP2 needs torch.distributed.fsdp.fully_shard (torch >= 2.6): {exc}") from None
    mesh = init_device_mesh(device.type, (info.world_size,))
    for block in block_modules(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def sharded_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """The global 2-norm of the (sharded) gradients of ``params``, after scaling them to at most
    ``max_norm`` when ``max_norm > 0`` -- ``clip_grad_norm_``'s two steps, with the norm
    all-reduced across the shards (``full_tensor``) before it scales anything."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def non_finite_parameters(model: torch.nn.Module, info: DistInfo) -> list[str]:
    """Names of the parameters and buffers holding a NaN or an infinity, the same list on every
    process: a sharded model checks each process's shards and gathers the names."""
    if not is_sharded(model):
        return local_non_finite_parameters(model)
    bad = []
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        local = _local(tensor)
        if (local.is_floating_point() or local.is_complex()) and not bool(torch.isfinite(local).all()):
            bad.append(name)
    if info.enabled:
        everyone: list = [None] * info.world_size
        dist.all_gather_object(everyone, bad)
        bad = sorted({name for names in everyone for name in names})
    return bad


def _full_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter names in the optimizer's numbering (0, 1, ... over its groups)."""
    names = {}
    for name, param in model.named_parameters():
        names.setdefault(id(param), name)
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def gather_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, info: DistInfo
) -> tuple[dict[str, torch.Tensor], dict | None] | None:
    """(the model's full state dict, the optimizer's in ``optimizer.state_dict()`` form) on the CPU
    of process 0, None on the others; collective: every process calls it. What
    :meth:`drmlab.runs.RunDir.save_checkpoint` writes as ``full_state``."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = _full_options(cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)
    optimizer_sd = get_optimizer_state_dict(model, optimizer, options=options) if optimizer is not None else None
    if not info.is_main:
        return None
    if optimizer_sd is not None:  # parameter names -> the optimizer's own numbering
        index = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
        optimizer_sd = {
            "state": {index[name]: value for name, value in optimizer_sd["state"].items()},
            "param_groups": [
                dict(group, params=[index[name] for name in group["params"]]) for group in optimizer_sd["param_groups"]
            ],
        }
    return model_sd, optimizer_sd


def load_sharded_checkpoint(run: RunDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Load the committed checkpoint of ``run`` into a sharded ``model`` (and ``optimizer``, RNG);
    return the trainer state. Every process verifies and reads the full tensors (so a damaged or
    unfitting file fails on all of them alike, never leaving one waiting in a collective), then
    keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state, model_sd, optimizer_sd = run.read_checkpoint(model, optimizer=optimizer is not None)
    set_model_state_dict(model, model_sd, options=_full_options())
    if optimizer is not None:
        names = _optimizer_names(model, optimizer)
        named = {
            "state": {names[int(i)]: value for i, value in optimizer_sd["state"].items()},
            "param_groups": [
                dict(group, params=[names[int(i)] for i in group["params"]]) for group in optimizer_sd["param_groups"]
            ],
        }
        # strict=False: a parameter that never received a gradient has no AdamW state to load.
        set_optimizer_state_dict(model, optimizer, named, options=_full_options(strict=False))
        # Loading materialises state for every parameter (a zero-lr step); drop what the checkpoint
        # did not hold, as a single process has none, so that a later first gradient of such a
        # parameter sees AdamW's first step, not its second.
        saved = {int(i) for i in optimizer_sd["state"]}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, param in enumerate(params):
            if i not in saved:
                optimizer.state.pop(param, None)
    return state
