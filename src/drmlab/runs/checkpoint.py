"""A run's checkpoint: the atomic commit, the checks on load, and the leftovers of a killed writer (docs/runs.md,
"What a run directory promises": one atomic commit, checked on load).

**Commit protocol.** A checkpoint is written complete into a temporary folder (every file fsynced),
renamed to ``checkpoints/step-N`` in one ``rename``, and committed by atomically replacing
``checkpoint.json`` (the pointer: folder, step and every file's sha256 and size, the same as the folder's
``manifest.json``); only then are older checkpoint folders removed. A kill at any system call leaves the
pointer naming a complete checkpoint: the old one before the pointer's replace, the new one after.
Temporary files and folders a killed process left behind are removed by the next writer
(:func:`drmlab.runs.orphans.clean_orphans`). Loading checks every file's size and sha256 against the pointer, so a flipped bit
or a truncated file is refused with one line naming the file, never silently loaded.

**What is stored.** ``model.safetensors``: the state dict, tied tensors once (:func:`tied_names`);
``optimizer.safetensors``: the optimizer's tensors and the torch RNG state(s)
(:mod:`~drmlab.runs.optimizer_state`); ``trainer_state.json``: the trainer's state with the optimizer's
hyper-parameters and non-tensor state under ``optimizer``, and the length and sha256 of metrics.jsonl
as it stood at the commit (:mod:`~drmlab.runs.metrics`).

**Sharded models.** A model sharded over processes (FSDP2, :mod:`drmlab.training.distributed`) is saved
from full tensors gathered on process 0 (``save_checkpoint(..., full_state=...)``) and read back as full
tensors on every process (:func:`read_checkpoint`), so the files are the single-process ones: a run
trained sharded is evaluated, sampled or resumed in one process.

Every function takes the run directory's folder ``run``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from . import optimizer_state
from .jsonio import disk_error, fsync_path, is_disk_error, jsonable, make_dir, read_json, write_json_atomic
from .layout import (
    CHECKPOINTS_DIR,
    MANIFEST_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    POINTER_FILE,
    STATE_FILE,
    TEMP_CHECKPOINT_PREFIX,
    checkpoint_name,
)

CHECKPOINT_FORMAT = "drmlab-checkpoint-2"


class CorruptCheckpointError(ValueError):
    """A checkpoint file does not match its recorded checksum or cannot be read; the message names it."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{dropped name: kept name}`` for the state-dict entries that are one tensor under several
    names (tied weights): the entries a checkpoint stores once, under the first name in sorted
    order -- the rule of safetensors' ``save_model``, so both writers make the same file."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return {name: min(names) for names in groups.values() if len(names) > 1 for name in names if name != min(names)}


# ---------------------------------------------------------------- writing


def _write_files(
    tmp: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict,
    full_state: tuple[dict[str, torch.Tensor], dict | None] | None,
    step: int,
) -> dict[str, dict]:
    """Write the checkpoint's files into the (temporary) folder ``tmp``, each fsynced (:func:`save_checkpoint`'s
    arguments); returns the manifest's ``{name: {"sha256": ..., "bytes": ...}}``."""
    meta = {"format": CHECKPOINT_FORMAT, "step": str(step)}
    if full_state is None:
        save_model(model, str(tmp / MODEL_FILE), metadata=meta, force_contiguous=True)
        optimizer_sd = optimizer.state_dict() if optimizer is not None else None
    else:
        model_sd, optimizer_sd = full_state
        dropped = tied_names(model)
        meta.update(dropped)  # as save_model does to its metadata (the optimizer file gets it too)
        save_file(
            {k: v.contiguous() for k, v in model_sd.items() if k not in dropped},
            str(tmp / MODEL_FILE),
            metadata=meta,
        )
    names = [MODEL_FILE]
    trainer_state = dict(state, format=CHECKPOINT_FORMAT)
    if optimizer_sd is not None:
        tensors, opt_meta = optimizer_state.flatten_optimizer(optimizer_sd)
        tensors.update(optimizer_state.rng_tensors())
        save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata=meta)
        trainer_state["optimizer"] = opt_meta
        names.append(OPTIMIZER_FILE)
    write_json_atomic(tmp / STATE_FILE, jsonable(trainer_state))
    names.append(STATE_FILE)
    files = {}
    for name in names:
        fsync_path(tmp / name)
        files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
    return files


def save_checkpoint(
    run: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict,
    *,
    full_state: tuple[dict[str, torch.Tensor], dict | None] | None = None,
) -> Path:
    """Write the checkpoint of ``model`` (and ``optimizer``) with trainer ``state`` (needs ``step``)
    and commit it as one unit (module docstring); returns its folder.

    ``full_state`` = (the model's full state dict, the optimizer's full state dict in
    ``optimizer.state_dict()`` form or None), gathered from a sharded model, is written instead
    of reading ``model`` and ``optimizer`` (``model`` then only names its tied weights); the
    files are the same as a single process writes."""
    make_dir(run)
    step = int(state["step"])
    folder = run / CHECKPOINTS_DIR
    final = folder / checkpoint_name(step)
    tmp = None
    try:
        folder.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=TEMP_CHECKPOINT_PREFIX, dir=run))
        files = _write_files(tmp, model, optimizer, state, full_state, step)
        manifest = {"format": CHECKPOINT_FORMAT, "step": step, "dir": f"{CHECKPOINTS_DIR}/{final.name}", "files": files}
        write_json_atomic(tmp / MANIFEST_FILE, manifest)
        fsync_path(tmp)
        if final.exists():  # an uncommitted folder of a killed run (the pointer never names the step being written)
            shutil.rmtree(final)
        os.rename(tmp, final)
        tmp = None
        fsync_path(folder)
        write_json_atomic(run / POINTER_FILE, manifest)  # the commit
        fsync_path(run)
    except OSError as exc:
        raise disk_error(exc, final) from None
    except Exception as exc:  # safetensors' own error type for a failed write
        if not is_disk_error(exc):
            raise
        raise disk_error(exc, final) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    for entry in folder.iterdir():
        if entry != final and own_manifest(entry) is not None:  # superseded; another tool's folder is kept
            shutil.rmtree(entry, ignore_errors=True)
    return final


def own_manifest(entry: Path) -> dict | None:
    """The manifest of a checkpoint folder that drmlab wrote for this very place (``manifest.json`` of this
    format naming ``checkpoints/<entry>``), or None: a folder without one is not this run's to delete."""
    path = entry / MANIFEST_FILE
    if not entry.is_dir() or not path.is_file():
        return None
    try:
        manifest = read_json(path)
    except Exception:
        return None
    if _shape_problem(manifest) or manifest.get("dir") != f"{CHECKPOINTS_DIR}/{entry.name}":
        return None
    if manifest.get("format") != CHECKPOINT_FORMAT:
        return None
    return manifest


def _shape_problem(record) -> str | None:
    """What is wrong with the form of a pointer or manifest (``dir``, ``step``, ``files`` with a sha256 and
    a byte count each), or None."""
    if not isinstance(record, dict):
        return "is not a JSON object"
    if not isinstance(record.get("dir"), str) or not record["dir"].startswith(f"{CHECKPOINTS_DIR}/"):
        return "names no checkpoint folder"
    if "/" in record["dir"][len(CHECKPOINTS_DIR) + 1 :] or ".." in record["dir"]:
        return f"names a folder outside {CHECKPOINTS_DIR}/"
    if not isinstance(record.get("step"), int) or isinstance(record.get("step"), bool):
        return "has no integer step"
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "lists no files"
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            return f"has no sha256 for {name}"
        if not isinstance(entry.get("bytes"), int) or isinstance(entry.get("bytes"), bool):
            return f"has no byte count for {name}"
    return None


def _files_problem(folder: Path, files: dict, only: tuple[str, ...] | None = None) -> str | None:
    """The first file of ``folder`` that is missing, of another size or another sha256 than ``files`` says
    (of the names in ``only`` when given: a reader checks the files it reads)."""
    for name, expected in files.items():
        if only is not None and name not in only:
            continue
        path = folder / name
        if not path.is_file():
            return f"{path} is missing; the checkpoint in {folder.parent.parent} is incomplete"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return (
                f"{path} has {size:,} bytes, the checkpoint recorded {expected['bytes']:,} "
                "(truncated or replaced); it cannot be loaded"
            )
        if sha256_file(path) != expected["sha256"]:
            return f"{path} does not match its recorded sha256 (the file is damaged); it cannot be loaded"
    return None


def _whole(folder: Path, record: dict) -> bool:
    """Whether every file of ``record`` (a pointer or manifest) verifies in ``folder`` and its step is the trainer
    state's: of a pointer and a manifest that differ, the one that is whole is intact."""
    if _files_problem(folder, record["files"]) is not None:
        return False
    try:
        return read_json(folder / STATE_FILE).get("step") == record["step"]
    except (OSError, ValueError, AttributeError):
        return False


def _newest_verified(run: Path, only: tuple[str, ...] | None = None) -> tuple[Path, dict] | None:
    """The checkpoint folder of the highest step whose own manifest verifies, with that manifest."""
    folder = run / CHECKPOINTS_DIR
    if not folder.is_dir():
        return None
    found = [(m["step"], entry, m) for entry in folder.iterdir() if (m := own_manifest(entry)) is not None]
    for _, entry, manifest in sorted(found, key=lambda item: item[0], reverse=True):
        if _files_problem(entry, manifest["files"], only) is None:
            return entry, manifest
    return None


def resolve_checkpoint(run: Path, only: tuple[str, ...] | None = None) -> tuple[Path, dict, str | None]:
    """(folder, pointer, note) of the run's checkpoint after verifying every file's size and sha256.

    The pointer ``checkpoint.json`` names it. When the pointer is lost, unreadable or damaged (its files do
    not verify, but the folder's own manifest does, or it names a folder that does not exist), the newest
    checkpoint whose manifest verifies is returned instead, with ``note`` saying so (readers use it as it
    is; the writer commits it: :func:`drmlab.runs.orphans.clean_orphans`). Raises ``FileNotFoundError`` when the run has no
    checkpoint and :class:`CorruptCheckpointError` (one line naming the file) when none verifies. A
    reader racing a writer's commit reads again (:func:`_read_committed`). ``only``: verify just these
    files (a reader of the weights needs no optimizer state); None: every file."""
    return _read_committed(run, only, lambda folder, pointer, note: (folder, pointer, note))


READ_ATTEMPTS = 8  # reads of a checkpoint that a writer's commits keep superseding before the last error stands


def _pointer_bytes(run: Path) -> bytes | None:
    try:
        return (run / POINTER_FILE).read_bytes()
    except FileNotFoundError:
        return None


def _read_committed(run: Path, only: tuple[str, ...] | None, read):
    """``read(folder, pointer, note)`` of the checkpoint :func:`_resolve_once` verifies, done again when a writer
    committed meanwhile. A writer removes the superseded folder right after replacing the pointer (the commit
    order of :func:`save_checkpoint`), so a reader that verified that folder may find its files gone before or
    while it reads them, or, finding the folder gone, fall back to the newest folder (a false recovery, maybe
    of a folder not yet committed). Either shows as the pointer changing during the read: then it is read
    again, from the new pointer; an error or a recovery with the pointer unchanged stands."""
    for attempt in range(READ_ATTEMPTS):
        last = attempt + 1 == READ_ATTEMPTS
        before = _pointer_bytes(run)
        try:
            folder, pointer, note = _resolve_once(run, only)
            result = read(folder, pointer, note)
        except (FileNotFoundError, CorruptCheckpointError):
            if last or _pointer_bytes(run) == before:
                raise
            continue
        if note is None or last or _pointer_bytes(run) == before:
            return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _resolve_once(run: Path, only: tuple[str, ...] | None) -> tuple[Path, dict, str | None]:
    path = run / POINTER_FILE
    if not path.is_file():
        recovered = _newest_verified(run, only)
        if recovered is None:
            raise FileNotFoundError(f"no checkpoint in {run} (missing {POINTER_FILE})")
        return recovered[0], recovered[1], f"{POINTER_FILE} is missing; {recovered[1]['dir']} verifies"
    try:
        pointer = read_json(path)
    except Exception:
        pointer = None
    problem = _shape_problem(pointer) if pointer is not None else "is not valid JSON"
    if problem is None:
        folder = run / pointer["dir"]
        manifest = own_manifest(folder)
        problem = _files_problem(folder, pointer["files"], only)
        if problem is None and manifest == pointer:  # the pointer is the manifest's copy
            return folder, pointer, None
        if problem is None and manifest is None and pointer.get("format") != CHECKPOINT_FORMAT:
            return folder, pointer, None  # an older format's folder: its pointer alone vouches for it
        if problem is None and manifest is None:
            raise CorruptCheckpointError(
                f"{folder / MANIFEST_FILE} is missing or damaged although the files match {path}; the two are "
                f"the same record: copy {path} over it to use this checkpoint"
            )
        if problem is None and manifest is not None and _whole(folder, pointer) and not _whole(folder, manifest):
            raise CorruptCheckpointError(  # a reader of a few files would otherwise take the manifest's word
                f"{folder / MANIFEST_FILE} differs from {path}, which verifies (the manifest is damaged); the two "
                f"are the same record: copy {path} over it to use this checkpoint"
            )
        if manifest is not None and _files_problem(folder, manifest["files"], only) is None:
            return folder, manifest, f"{POINTER_FILE} is damaged; {manifest['dir']}'s manifest verifies"
        problem = problem or f"{path} differs from {folder / MANIFEST_FILE}, which does not verify"
        if folder.exists():
            raise CorruptCheckpointError(problem)  # the checkpoint itself is damaged: never an older one silently
    else:
        problem = f"{path} {problem}; the file is damaged"
    recovered = _newest_verified(run, only)
    if recovered is None:
        raise CorruptCheckpointError(f"{problem}; and no checkpoint folder of {run} verifies")
    return recovered[0], recovered[1], f"{POINTER_FILE} is damaged; {recovered[1]['dir']} verifies"


# ---------------------------------------------------------------- reading


def read_pointer(run: Path) -> dict:
    """``checkpoint.json`` (or, when it is lost or damaged, the manifest of the newest checkpoint that
    verifies: :func:`resolve_checkpoint`): the committed checkpoint's folder, step and file sums."""
    return resolve_checkpoint(run, only=(STATE_FILE,))[1]


def checkpoint_dir(run: Path) -> Path:
    """The committed checkpoint's folder."""
    return resolve_checkpoint(run, only=(STATE_FILE,))[0]


def read_state(run: Path) -> dict:
    """The committed checkpoint's trainer state, verified."""
    return _read_committed(run, (STATE_FILE,), lambda folder, pointer, note: read_json(folder / STATE_FILE))


def verify_checkpoint(run: Path, only: tuple[str, ...] | None = None) -> tuple[Path, dict]:
    """(folder, pointer) after checking every file's size and sha256 (of ``only``'s names when given);
    one-line errors name the file."""
    folder, pointer, _ = resolve_checkpoint(run, only)
    return folder, pointer


def _files_read(optimizer: bool) -> tuple[str, ...] | None:
    """The files a loader reads (and so verifies): all of them, or without the optimizer's, the weights and state."""
    return None if optimizer else (MODEL_FILE, STATE_FILE)


def _checked_state(run: Path, folder: Path, pointer: dict) -> dict:
    """The trainer state of a verified checkpoint folder, its step checked against the pointer's."""
    state = read_json(folder / STATE_FILE)
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or step != pointer["step"]:
        raise CorruptCheckpointError(
            f"{folder / STATE_FILE} says step {step} but {run / POINTER_FILE} says "
            f"step {pointer['step']}: the checkpoint is inconsistent"
        )
    return state


def _read_optimizer(folder: Path, pointer: dict, state: dict, restore_rng: bool) -> dict:
    """The optimizer's state dict of a verified checkpoint (and, with ``restore_rng``, its RNG state restored)."""
    opt_path = folder / OPTIMIZER_FILE
    if OPTIMIZER_FILE not in pointer["files"] or "optimizer" not in state:
        raise FileNotFoundError(f"no optimizer state in {folder}; cannot resume training from it")
    try:
        tensors = load_file(str(opt_path))
    except Exception as exc:
        raise CorruptCheckpointError(f"{opt_path} cannot be read ({type(exc).__name__}: {exc})") from None
    if restore_rng:
        optimizer_state.restore_rng(tensors)
    return optimizer_state.unflatten_optimizer(tensors, state["optimizer"])


def read_checkpoint(
    run: Path, model: torch.nn.Module, *, optimizer: bool = True, restore_rng: bool = True
) -> tuple[dict, dict[str, torch.Tensor], dict | None]:
    """(trainer state, the model's full state dict on the CPU, the optimizer's state dict in
    ``optimizer.state_dict()`` form or None) of the committed checkpoint, after verifying the
    checksums; for loading into a sharded ``model``, whose tied weights are filled in from the
    one stored copy and whose names and shapes are checked here (on every process alike)."""
    return _read_committed(
        run,
        _files_read(optimizer),
        lambda folder, pointer, _: _read_full(run, folder, pointer, model, optimizer, restore_rng),
    )


def _read_full(run: Path, folder: Path, pointer: dict, model, optimizer: bool, restore_rng: bool):
    """:func:`read_checkpoint` of the verified folder ``folder``."""
    state = _checked_state(run, folder, pointer)
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
        raise ValueError(
            f"{model_path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"other shapes {[(n, found[n], expected[n]) for n in shapes[:3]]}"
        )
    optimizer_sd = _read_optimizer(folder, pointer, state, restore_rng) if optimizer else None
    return state, tensors, optimizer_sd


def load_checkpoint(
    run: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, restore_rng: bool = True
) -> dict:
    """Load weights (and optimizer state, RNG) into ``model`` after verifying the checksums; return
    the trainer state."""
    return _read_committed(
        run,
        _files_read(optimizer is not None),
        lambda folder, pointer, _: _load_into(run, folder, pointer, model, optimizer, restore_rng),
    )


def _load_into(run: Path, folder: Path, pointer: dict, model, optimizer, restore_rng: bool) -> dict:
    """:func:`load_checkpoint` of the verified folder ``folder``."""
    state = _checked_state(run, folder, pointer)
    model_path = folder / MODEL_FILE
    device = next(iter(model.parameters())).device
    try:
        load_model(model, str(model_path), strict=True, device=str(device))
    except RuntimeError as exc:
        if str(exc).startswith("Error(s) in loading state_dict"):  # tensors of other names or shapes
            raise ValueError(f"{model_path} does not fit this model: {str(exc).splitlines()[0]}") from None
        # torch's mmap of a file removed after safetensors read its header (a writer's commit meanwhile)
        raise CorruptCheckpointError(f"{model_path} cannot be read ({str(exc).splitlines()[0]})") from None
    except Exception as exc:  # safetensors' own errors for a damaged header
        raise CorruptCheckpointError(f"{model_path} cannot be read ({type(exc).__name__}: {exc})") from None
    if optimizer is not None:
        optimizer.load_state_dict(_read_optimizer(folder, pointer, state, restore_rng))
    return state
