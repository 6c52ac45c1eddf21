"""Checkpoints: safetensors weights and optimizer state plus a JSON trainer state, written atomically.

A checkpoint in a run directory is three files:

* ``model.safetensors`` -- the model's state dict (tied tensors stored once);
* ``optimizer.safetensors`` -- the optimizer state flattened to ``state.<param index>.<name>``
  tensors, plus the torch RNG state(s) as ``rng.*`` byte tensors;
* ``trainer_state.json`` -- the step, token count, timings, optimizer hyper-parameters and the
  non-tensor optimizer state.

All three are written into a temporary folder inside the run directory, flushed to disk, then
moved into place with ``os.replace`` (the JSON last). Every file records the step, and loading
checks that they agree, so a checkpoint is never silently mixed from two steps.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
FORMAT = "drmlab-checkpoint-1"


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def write_json_atomic(path: Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(obj, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for index, values in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(values)
    groups = []
    for group in meta["param_groups"]:
        group = dict(group)
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = state
    return out


def _restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    if "rng.torch_cpu" in tensors:
        torch.set_rng_state(tensors["rng.torch_cpu"])
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        states = [tensors[k] for k in cuda][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


def save_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict) -> None:
    """Atomically write the checkpoint of ``model`` (and ``optimizer``) with trainer ``state`` (needs ``step``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    meta = {"format": FORMAT, "step": str(step)}
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=run_dir))
    try:
        save_model(model, str(tmp / MODEL_FILE), metadata=meta, force_contiguous=True)
        names = [MODEL_FILE]
        full_state = dict(state, format=FORMAT)
        if optimizer is not None:
            tensors, opt_meta = _flatten_optimizer(optimizer)
            tensors.update(_rng_tensors())
            save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata=meta)
            full_state["optimizer"] = opt_meta
            names.append(OPTIMIZER_FILE)
        for name in names:
            _fsync(tmp / name)
        write_json_atomic(tmp / STATE_FILE, full_state)
        for name in names + [STATE_FILE]:
            os.replace(tmp / name, run_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _file_step(path: Path) -> int | None:
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
    return int(meta["step"]) if "step" in meta else None


def has_checkpoint(run_dir: str | Path) -> bool:
    run_dir = Path(run_dir)
    return (run_dir / STATE_FILE).is_file() and (run_dir / MODEL_FILE).is_file()


def read_state(run_dir: str | Path) -> dict:
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {run_dir} (missing {STATE_FILE})")
    return json.loads(path.read_text())


def load_checkpoint(
    run_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
) -> dict:
    """Load weights (and optimizer state, RNG) from ``run_dir`` into ``model``; return the trainer state."""
    run_dir = Path(run_dir)
    state = read_state(run_dir)
    step = int(state["step"])
    model_path = run_dir / MODEL_FILE
    if not model_path.is_file():
        raise FileNotFoundError(f"no {MODEL_FILE} in {run_dir}")
    file_step = _file_step(model_path)
    if file_step is not None and file_step != step:
        raise ValueError(f"{model_path} is from step {file_step} but {STATE_FILE} says step {step}: the checkpoint is inconsistent")
    device = next(iter(model.parameters())).device
    missing, unexpected = load_model(model, str(model_path), strict=True, device=str(device))
    if optimizer is not None:
        opt_path = run_dir / OPTIMIZER_FILE
        if not opt_path.is_file() or "optimizer" not in state:
            raise FileNotFoundError(f"no optimizer state in {run_dir}; cannot resume training from it")
        if _file_step(opt_path) != step:
            raise ValueError(f"{opt_path} is not from step {step}: the checkpoint is inconsistent")
        tensors = load_file(str(opt_path))
        optimizer.load_state_dict(_unflatten_optimizer(tensors, state["optimizer"]))
        if restore_rng:
            _restore_rng(tensors)
    return state
