"""A run directory as an object: its file names, lock, atomic writes, checkpoints, metrics and model.

Everything that reads or writes a run goes through :class:`RunDir`. A run directory holds

* ``config.json`` -- the resolved run (model, preset, overrides, train settings, data provenance);
* ``metrics.jsonl`` -- one JSON row per optimizer step (``kind: train``), per sampled evaluation
  (``kind: eval``) and per resume (``kind: resume``, with any settings changed on resuming);
* ``checkpoint.json`` -- the pointer to the committed checkpoint: its folder, step and the sha256
  and size of each of its files;
* ``checkpoints/step-NNNNNNNN/`` -- the checkpoint: ``model.safetensors`` (the state dict, tied
  tensors once), ``optimizer.safetensors`` (optimizer tensors as ``state.<param index>.<name>`` and
  the torch RNG state(s) as ``rng.*``), ``trainer_state.json`` (step, tokens, timings, optimizer
  hyper-parameters and its non-tensor state) and ``manifest.json`` (the same sums as the pointer);
* ``summary.json`` -- the finished run's numbers; ``eval.json`` -- a later ``drmlab eval``;
* ``tensorboard/`` -- with ``--tensorboard``, metrics.jsonl's rows as TensorBoard event files;
* ``.lock`` -- held (``flock``) by the one process writing the run; it names that process.

**Commit protocol.** A checkpoint is written complete into a temporary folder (every file fsynced),
renamed to ``checkpoints/step-N`` in one ``rename``, and committed by atomically replacing
``checkpoint.json``; only then are older checkpoint folders removed. A kill at any system call
leaves the pointer naming a complete checkpoint: the old one before the pointer's replace, the new
one after. Temporary files and folders a killed process left behind are removed by the next
writer (:meth:`RunDir.clean_orphans`). Loading checks every file's size and sha256 against the
pointer, so a flipped bit or a truncated file is refused with one line naming the file, never
silently loaded. Every JSON read names its file when it fails; a full disk is an :class:`OSError`
naming the path, with nothing half-written left behind.

**Sharded models.** A model sharded over processes (FSDP2, :mod:`drmlab.training.distributed`)
is saved from full tensors gathered on process 0 (``save_checkpoint(..., full_state=...)``) and
read back as full tensors on every process (:meth:`RunDir.read_checkpoint`), so the files are the
single-process ones: a run trained sharded is evaluated, sampled or resumed in one process.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVAL_FILE = "eval.json"
POINTER_FILE = "checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"  # event files written with --tensorboard (drmlab.training.tensorboard)
LOCK_FILE = ".lock"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
CHECKPOINT_FORMAT = "drmlab-checkpoint-2"
# Files a run writes at its top level (what --overwrite removes; nothing else is touched).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, EVAL_FILE, POINTER_FILE)
_TEMP_CHECKPOINT_PREFIX = ".checkpoint-"


class RunLockedError(OSError):
    """Another live process holds the run directory's lock; the message names it."""


class CorruptCheckpointError(ValueError):
    """A checkpoint file does not match its recorded checksum or cannot be read; the message names it."""


# ---------------------------------------------------------------- files


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _disk_error(exc: OSError, path: Path) -> OSError:
    """A one-line error for a failed write (a full disk says so and names the path)."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        error = OSError(f"no space left on the device while writing {path}; free some space, "
                        "the last committed checkpoint is intact")
    else:
        error = OSError(f"could not write {path}: {exc.strerror or exc}")
    error.errno = exc.errno
    return error


def write_json_atomic(path: str | Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(obj, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise _disk_error(exc, path) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def read_json(path: str | Path):
    """The JSON in ``path``; a missing or damaged file raises an error that names it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not valid JSON (not UTF-8 text); the file is damaged") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is damaged") from None


def jsonable(obj):
    """``obj`` with every value JSON can not hold turned into its string."""
    return json.loads(json.dumps(obj, default=str))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- optimizer state as tensors


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer state dict (``optimizer.state_dict()`` form: parameters numbered 0, 1, ... over the
    groups) as (tensors named ``state.<index>.<name>``, JSON-able groups and non-tensor state)."""
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


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{dropped name: kept name}`` for the state-dict entries that are one tensor under several
    names (tied weights): the entries a checkpoint stores once, under the first name in sorted
    order -- the rule of safetensors' ``save_model``, so both writers make the same file."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return {name: min(names) for names in groups.values() if len(names) > 1 for name in names if name != min(names)}


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers holding a NaN or an infinity."""
    bad = []
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_floating_point() or tensor.is_complex():
            if not bool(torch.isfinite(tensor).all()):
                bad.append(name)
    return bad


# ---------------------------------------------------------------- the lock


class RunLock:
    """An exclusive ``flock`` on ``DIR/.lock`` naming its holder (pid, host, start time).

    The kernel drops the lock when its process dies, so the lock of a killed run is stale by
    construction and the next writer takes it over; the file itself is never removed (removing a
    locked file would let two processes lock two different files)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            try:
                who = json.loads(holder)
                desc = (f"process {who.get('pid')} on {who.get('host')} since {who.get('started')}"
                        if isinstance(who, dict) else holder)
            except json.JSONDecodeError:
                desc = holder or "another process"
            raise RunLockedError(f"{self.path.parent} is in use by {desc}; wait for it to finish or stop it "
                                 "(a second writer would corrupt the run)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}) + "\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


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

    @property
    def pointer_path(self) -> Path:
        return self.path / POINTER_FILE

    def create(self) -> "RunDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _disk_error(exc, self.path) from None
        return self

    def lock(self) -> RunLock:
        """Take the writer's lock (raises :class:`RunLockedError` naming the holder)."""
        return RunLock(self.path / LOCK_FILE).acquire()

    def holds_run(self) -> bool:
        """Whether a run was started here (a config, metrics, checkpoint or summary exists)."""
        return any((self.path / name).exists() for name in RUN_FILES) or (self.path / CHECKPOINTS_DIR).exists()

    def describe(self) -> str:
        """``finished at step 611`` / ``interrupted at step 98`` / ``started, no checkpoint``."""
        summary = self.read_summary() if self.summary_path.is_file() else None
        if summary and summary.get("finished"):
            return f"a finished run (step {summary.get('steps')})"
        if self.has_checkpoint():
            return f"an interrupted run (checkpoint at step {self.read_pointer().get('step')})"
        return "a run that wrote no checkpoint"

    def remove_run(self) -> None:
        """Delete this run's own files (config, metrics, summary, eval.json, checkpoints, TensorBoard
        event files); nothing else."""
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / CHECKPOINTS_DIR, ignore_errors=True)
        shutil.rmtree(self.path / TENSORBOARD_DIR, ignore_errors=True)
        self.clean_orphans()

    def clean_orphans(self) -> list[str]:
        """Remove what a killed writer left: temporary files and folders, uncommitted checkpoint
        folders. Call only while holding the lock. Returns the names removed."""
        if not self.path.is_dir():
            return []
        removed = []
        for entry in self.path.iterdir():
            name = entry.name
            temp_json = name.startswith(".") and any(name.startswith(f".{f}.") for f in RUN_FILES + (MANIFEST_FILE,))
            if name.startswith(_TEMP_CHECKPOINT_PREFIX) or temp_json or name == METRICS_FILE + ".tmp":
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                removed.append(name)
        folder = self.path / CHECKPOINTS_DIR
        if folder.is_dir():
            keep = self.read_pointer().get("dir") if self.pointer_path.is_file() else None
            for entry in folder.iterdir():
                if f"{CHECKPOINTS_DIR}/{entry.name}" != keep:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(f"{CHECKPOINTS_DIR}/{entry.name}")
        return removed

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
        """Forget a previous run's metrics, checkpoint and summary before a fresh start."""
        for name in (METRICS_FILE, SUMMARY_FILE, EVAL_FILE, POINTER_FILE):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / CHECKPOINTS_DIR, ignore_errors=True)

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
        try:
            with open(tmp, "w") as handle:
                handle.write("".join(k + "\n" for k in kept))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _disk_error(exc, path) from None

    def metrics_log(self) -> "MetricsLog":
        return MetricsLog(self.metrics_path)

    # checkpoint
    def has_checkpoint(self) -> bool:
        return self.pointer_path.is_file()

    def read_pointer(self) -> dict:
        if not self.pointer_path.is_file():
            raise FileNotFoundError(f"no checkpoint in {self.path} (missing {POINTER_FILE})")
        pointer = read_json(self.pointer_path)
        if not isinstance(pointer, dict) or "dir" not in pointer or "files" not in pointer:
            raise CorruptCheckpointError(f"{self.pointer_path} is not a checkpoint pointer; the file is damaged")
        return pointer

    def checkpoint_dir(self) -> Path:
        return self.path / self.read_pointer()["dir"]

    def read_state(self) -> dict:
        return read_json(self.checkpoint_dir() / STATE_FILE)

    def save_checkpoint(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict, *,
                        full_state: tuple[dict[str, torch.Tensor], dict | None] | None = None) -> Path:
        """Write the checkpoint of ``model`` (and ``optimizer``) with trainer ``state`` (needs ``step``)
        and commit it as one unit (module docstring); returns its folder.

        ``full_state`` = (the model's full state dict, the optimizer's full state dict in
        ``optimizer.state_dict()`` form or None), gathered from a sharded model, is written instead
        of reading ``model`` and ``optimizer`` (``model`` then only names its tied weights); the
        files are the same as a single process writes."""
        self.create()
        step = int(state["step"])
        meta = {"format": CHECKPOINT_FORMAT, "step": str(step)}
        folder = self.path / CHECKPOINTS_DIR
        final = folder / f"step-{step:08d}"
        tmp = None
        try:
            folder.mkdir(exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_TEMP_CHECKPOINT_PREFIX, dir=self.path))
            if full_state is None:
                save_model(model, str(tmp / MODEL_FILE), metadata=meta, force_contiguous=True)
                optimizer_sd = optimizer.state_dict() if optimizer is not None else None
            else:
                model_sd, optimizer_sd = full_state
                dropped = tied_names(model)
                meta.update(dropped)  # as save_model does to its metadata (the optimizer file gets it too)
                save_file({k: v.contiguous() for k, v in model_sd.items() if k not in dropped}, str(tmp / MODEL_FILE),
                          metadata=meta)
            names = [MODEL_FILE]
            trainer_state = dict(state, format=CHECKPOINT_FORMAT)
            if optimizer_sd is not None:
                tensors, opt_meta = _flatten_optimizer(optimizer_sd)
                tensors.update(_rng_tensors())
                save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata=meta)
                trainer_state["optimizer"] = opt_meta
                names.append(OPTIMIZER_FILE)
            write_json_atomic(tmp / STATE_FILE, jsonable(trainer_state))
            names.append(STATE_FILE)
            files = {}
            for name in names:
                _fsync_path(tmp / name)
                files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
            manifest = {"format": CHECKPOINT_FORMAT, "step": step, "dir": f"{CHECKPOINTS_DIR}/{final.name}", "files": files}
            write_json_atomic(tmp / MANIFEST_FILE, manifest)
            _fsync_path(tmp)
            if final.exists():  # an uncommitted folder of a killed run (the pointer never names the step being written)
                shutil.rmtree(final)
            os.rename(tmp, final)
            tmp = None
            _fsync_path(folder)
            write_json_atomic(self.pointer_path, manifest)  # the commit
            _fsync_path(self.path)
        except OSError as exc:
            raise _disk_error(exc, final) from None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        for entry in folder.iterdir():
            if entry != final:
                shutil.rmtree(entry, ignore_errors=True)
        return final

    def verify_checkpoint(self) -> tuple[Path, dict]:
        """(folder, pointer) after checking every file's size and sha256; one-line errors name the file."""
        pointer = self.read_pointer()
        folder = self.path / pointer["dir"]
        for name, expected in pointer["files"].items():
            path = folder / name
            if not path.is_file():
                raise CorruptCheckpointError(f"{path} is missing; the checkpoint in {self.path} is incomplete")
            size = path.stat().st_size
            if size != expected.get("bytes"):
                raise CorruptCheckpointError(f"{path} has {size:,} bytes, the checkpoint recorded {expected.get('bytes'):,} "
                                             "(truncated or replaced); it cannot be loaded")
            if sha256_file(path) != expected.get("sha256"):
                raise CorruptCheckpointError(f"{path} does not match its recorded sha256 (the file is damaged); "
                                             "it cannot be loaded")
        return folder, pointer

    def _verified_state(self) -> tuple[Path, dict, dict]:
        """(folder, pointer, trainer state) of the committed checkpoint after checking every file."""
        folder, pointer = self.verify_checkpoint()
        state = read_json(folder / STATE_FILE)
        step = int(state["step"])
        if step != int(pointer["step"]):
            raise CorruptCheckpointError(f"{folder / STATE_FILE} says step {step} but {self.pointer_path} says "
                                         f"step {pointer['step']}: the checkpoint is inconsistent")
        return folder, pointer, state

    def _read_optimizer(self, folder: Path, pointer: dict, state: dict, restore_rng: bool) -> dict:
        opt_path = folder / OPTIMIZER_FILE
        if OPTIMIZER_FILE not in pointer["files"] or "optimizer" not in state:
            raise FileNotFoundError(f"no optimizer state in {folder}; cannot resume training from it")
        try:
            tensors = load_file(str(opt_path))
        except Exception as exc:
            raise CorruptCheckpointError(f"{opt_path} cannot be read ({type(exc).__name__}: {exc})") from None
        if restore_rng:
            _restore_rng(tensors)
        return _unflatten_optimizer(tensors, state["optimizer"])

    def read_checkpoint(self, model: torch.nn.Module, *, optimizer: bool = True, restore_rng: bool = True
                        ) -> tuple[dict, dict[str, torch.Tensor], dict | None]:
        """(trainer state, the model's full state dict on the CPU, the optimizer's state dict in
        ``optimizer.state_dict()`` form or None) of the committed checkpoint, after verifying the
        checksums; for loading into a sharded ``model``, whose tied weights are filled in from the
        one stored copy and whose names and shapes are checked here (on every process alike)."""
        folder, pointer, state = self._verified_state()
        model_path = folder / MODEL_FILE
        try:
            tensors = load_file(str(model_path))
        except Exception as exc:
            raise CorruptCheckpointError(f"{model_path} cannot be read ({type(exc).__name__}: {exc})") from None
        for dropped, kept in tied_names(model).items():
            if dropped not in tensors and kept in tensors:
                tensors[dropped] = tensors[kept]
        expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
        found = {name: tuple(t.shape) for name, t in tensors.items()}
        if found != expected:
            missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
            shapes = sorted(n for n in set(found) & set(expected) if found[n] != expected[n])
            raise ValueError(f"{model_path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                             f"other shapes {[(n, found[n], expected[n]) for n in shapes[:3]]}")
        optimizer_sd = self._read_optimizer(folder, pointer, state, restore_rng) if optimizer else None
        return state, tensors, optimizer_sd

    def load_checkpoint(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                        restore_rng: bool = True) -> dict:
        """Load weights (and optimizer state, RNG) into ``model`` after verifying the checksums; return
        the trainer state."""
        folder, pointer, state = self._verified_state()
        model_path = folder / MODEL_FILE
        device = next(iter(model.parameters())).device
        try:
            load_model(model, str(model_path), strict=True, device=str(device))
        except RuntimeError as exc:  # tensors of other names or shapes
            raise ValueError(f"{model_path} does not fit this model: {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # safetensors' own errors for a damaged header
            raise CorruptCheckpointError(f"{model_path} cannot be read ({type(exc).__name__}: {exc})") from None
        if optimizer is not None:
            optimizer.load_state_dict(self._read_optimizer(folder, pointer, state, restore_rng))
        return state

    # the model
    def build_model(self, config: dict | None = None) -> torch.nn.Module:
        """The run's model, freshly built (untrained) from its config.json."""
        from drmlab.models import build_model

        config = config if config is not None else self.read_config()
        try:
            name, preset, seed = config["model"], config["preset"], int(config["train"]["seed"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{self.config_path} lacks the model, preset or seed; it is not a drmlab run config") from None
        vocab = config.get("vocab_size") or (config.get("model_config") or {}).get("vocab_size") or 256
        return build_model(name, preset, vocab_size=int(vocab), seed=seed, **config.get("overrides", {}))

    def load_model(self, device: str | torch.device | None = "cpu", *, allow_non_finite: bool = False
                   ) -> tuple[torch.nn.Module, dict, dict]:
        """(the model with the checkpoint's weights in eval mode, the run's config, trainer state).
        Weights holding NaN or infinity are refused unless ``allow_non_finite``."""
        from drmlab.devices import resolve_device

        config = self.read_config()
        model = self.build_model(config)
        model.to(resolve_device(str(device) if isinstance(device, torch.device) else device))
        state = self.load_checkpoint(model, optimizer=None)
        bad = [] if allow_non_finite else non_finite_parameters(model)
        if bad:
            raise ValueError(f"the checkpoint in {self.checkpoint_dir()} holds non-finite weights ({', '.join(bad[:3])}"
                             f"{', ...' if len(bad) > 3 else ''}); it cannot be evaluated or sampled")
        model.eval()
        return model, config, state


class MetricsLog:
    """Appends rows to ``metrics.jsonl`` (line-buffered) and keeps them; ``path=None`` keeps them only.

    ``sinks``: objects with ``write(row)`` and ``close()`` that receive every row after it is in the
    file (metrics.jsonl stays the one source of truth), e.g. TensorBoard's
    (:class:`drmlab.training.tensorboard.TensorBoardSink`)."""

    def __init__(self, path: Path | None, sinks=()):
        self.handle = open(path, "a", buffering=1) if path is not None else None
        self.rows: list[dict] = []
        self.sinks = list(sinks)

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if self.handle is not None:
            self.handle.write(json.dumps(row) + "\n")
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def load_run_model(run_dir: str | Path, device: str | torch.device | None = "cpu"):
    """(model with the checkpoint's weights, the run's config.json dict, trainer state)."""
    return RunDir(run_dir).load_model(device)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl``."""
    return RunDir(run_dir).read_metrics()
