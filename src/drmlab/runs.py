"""A run directory as an object: its file names, atomic writes, the checkpoint, metrics and model.

Everything that reads or writes a run goes through :class:`RunDir`. A run directory holds

* ``config.json`` -- the resolved run (model, preset, overrides, train settings, data provenance);
* ``metrics.jsonl`` -- one JSON row per optimizer step (``kind: train``) and per sampled
  evaluation (``kind: eval``);
* the checkpoint: ``model.safetensors`` (the state dict, tied tensors once),
  ``optimizer.safetensors`` (optimizer tensors as ``state.<param index>.<name>`` plus the torch
  RNG state(s) as ``rng.*``) and ``trainer_state.json`` (step, tokens, timings, optimizer
  hyper-parameters and its non-tensor state);
* ``summary.json`` -- the finished run's numbers; ``eval.json`` -- a later ``drmlab eval``.

Writes are atomic: a temporary file in the same directory, flushed and fsynced, then
``os.replace``. The checkpoint's files are written into a temporary folder and moved into place
(the JSON last); every file records the step and loading checks that they agree, so a checkpoint
is never silently mixed from two steps. Every JSON read names the file when it fails.
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

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVAL_FILE = "eval.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
CHECKPOINT_FORMAT = "drmlab-checkpoint-1"


# ---------------------------------------------------------------- files


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def write_json_atomic(path: str | Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(obj, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | Path):
    """The JSON in ``path``; a missing or damaged file raises an error that names it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is damaged") from None


def jsonable(obj):
    """``obj`` with every value JSON can not hold turned into its string."""
    return json.loads(json.dumps(obj, default=str))


# ---------------------------------------------------------------- optimizer state as tensors


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


def _file_step(path: Path) -> int | None:
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
    return int(meta["step"]) if "step" in meta else None


# ---------------------------------------------------------------- the run directory


class RunDir:
    """One run directory: ``RunDir(path)``; nothing is created until something is written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # file locations
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def eval_path(self) -> Path:
        return self.path / EVAL_FILE

    def create(self) -> "RunDir":
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # config and summary
    def has_config(self) -> bool:
        return self.config_path.is_file()

    def read_config(self) -> dict:
        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory: {self.config_path} is missing")
        return read_json(self.config_path)

    def write_config(self, config: dict) -> None:
        write_json_atomic(self.config_path, jsonable(config))

    def read_summary(self) -> dict | None:
        """The summary, or None when the run has none yet."""
        return read_json(self.summary_path) if self.summary_path.is_file() else None

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_path, jsonable(summary))

    def finished_summary(self) -> dict | None:
        """The summary of a finished, rescored run, else None."""
        summary = self.read_summary()
        return summary if summary and summary.get("finished") and summary.get("val_ce") is not None else None

    def clear_outputs(self) -> None:
        """Forget a previous run's metrics, checkpoint state and summary before a fresh start."""
        for path in (self.metrics_path, self.path / STATE_FILE, self.summary_path):
            path.unlink(missing_ok=True)

    # metrics
    def read_metrics(self) -> list[dict]:
        """The rows of ``metrics.jsonl`` (a half-written last line is skipped)."""
        rows = []
        lines = self.metrics_path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise ValueError(f"{self.metrics_path} line {number} is not valid JSON; the file is damaged") from None
        return rows

    def truncate_metrics(self, step: int) -> None:
        """Drop rows logged after ``step`` (work lost with an interrupted run) before resuming."""
        path = self.metrics_path
        if not path.is_file():
            return
        kept = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a half-written last line
                continue
            if int(row.get("step", 0)) <= step:
                kept.append(line)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        tmp.replace(path)

    def metrics_log(self) -> "MetricsLog":
        return MetricsLog(self.metrics_path)

    # checkpoint
    def has_checkpoint(self) -> bool:
        return (self.path / STATE_FILE).is_file() and (self.path / MODEL_FILE).is_file()

    def read_state(self) -> dict:
        path = self.path / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint in {self.path} (missing {STATE_FILE})")
        return read_json(path)

    def save_checkpoint(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict) -> None:
        """Atomically write the checkpoint of ``model`` (and ``optimizer``) with trainer ``state`` (needs ``step``)."""
        self.create()
        step = int(state["step"])
        meta = {"format": CHECKPOINT_FORMAT, "step": str(step)}
        tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=self.path))
        try:
            save_model(model, str(tmp / MODEL_FILE), metadata=meta, force_contiguous=True)
            names = [MODEL_FILE]
            full_state = dict(state, format=CHECKPOINT_FORMAT)
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
                os.replace(tmp / name, self.path / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def load_checkpoint(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                        restore_rng: bool = True) -> dict:
        """Load weights (and optimizer state, RNG) into ``model``; return the trainer state."""
        state = self.read_state()
        step = int(state["step"])
        model_path = self.path / MODEL_FILE
        if not model_path.is_file():
            raise FileNotFoundError(f"no {MODEL_FILE} in {self.path}")
        file_step = _file_step(model_path)
        if file_step is not None and file_step != step:
            raise ValueError(f"{model_path} is from step {file_step} but {STATE_FILE} says step {step}: "
                             "the checkpoint is inconsistent")
        device = next(iter(model.parameters())).device
        load_model(model, str(model_path), strict=True, device=str(device))
        if optimizer is not None:
            opt_path = self.path / OPTIMIZER_FILE
            if not opt_path.is_file() or "optimizer" not in state:
                raise FileNotFoundError(f"no optimizer state in {self.path}; cannot resume training from it")
            if _file_step(opt_path) != step:
                raise ValueError(f"{opt_path} is not from step {step}: the checkpoint is inconsistent")
            tensors = load_file(str(opt_path))
            optimizer.load_state_dict(_unflatten_optimizer(tensors, state["optimizer"]))
            if restore_rng:
                _restore_rng(tensors)
        return state

    # the model
    def build_model(self, config: dict | None = None) -> torch.nn.Module:
        """The run's model, freshly built (untrained) from its config.json."""
        from drmlab.models import build_model

        config = config if config is not None else self.read_config()
        vocab = config.get("vocab_size") or (config.get("model_config") or {}).get("vocab_size") or 256
        return build_model(config["model"], config["preset"], vocab_size=int(vocab),
                           seed=int(config["train"]["seed"]), **config.get("overrides", {}))

    def load_model(self, device: str | torch.device | None = "cpu") -> tuple[torch.nn.Module, dict, dict]:
        """(the model with the checkpoint's weights in eval mode, the run's config, trainer state)."""
        from drmlab.devices import resolve_device

        config = self.read_config()
        model = self.build_model(config)
        model.to(resolve_device(str(device) if isinstance(device, torch.device) else device))
        state = self.load_checkpoint(model, optimizer=None)
        model.eval()
        return model, config, state


class MetricsLog:
    """Appends rows to ``metrics.jsonl`` (line-buffered) and keeps them; ``path=None`` keeps them only."""

    def __init__(self, path: Path | None):
        self.handle = open(path, "a", buffering=1) if path is not None else None
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if self.handle is not None:
            self.handle.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def load_run_model(run_dir: str | Path, device: str | torch.device | None = "cpu"):
    """(model with the checkpoint's weights, the run's config.json dict, trainer state)."""
    return RunDir(run_dir).load_model(device)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl``."""
    return RunDir(run_dir).read_metrics()
