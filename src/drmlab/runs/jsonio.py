"""Atomic JSON files and the one-line write error of every writer of a run (docs/runs.md, "What a run directory
promises").

A JSON file is written into a temporary file of the same folder, fsynced and moved over the old one with
``os.replace``, so a reader sees the old file or the new one, never half of one. Every read names its file
when it fails; a failed write (a full disk says so) is an :class:`OSError` naming the path, with nothing
half-written left behind.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# how safetensors (Rust) words the same errors: "... (os error 28)"
_OS_ERROR_IN_TEXT = {f"os error {code}": code for code in (*DISK_FULL, errno.EROFS, errno.EACCES)}


def disk_error(exc: BaseException, path: Path) -> OSError:
    """A one-line error for a failed write of ``path``: a full disk, a quota, a read-only file system say
    so, name the path and what is intact. ``exc`` may be an ``OSError`` or a library's error that words
    one (safetensors' ``SafetensorError: ... (os error 28)``)."""
    code = getattr(exc, "errno", None)
    if code is None:
        code = next((c for text, c in _OS_ERROR_IN_TEXT.items() if text in str(exc)), None)
    committed = _committed_checkpoint_near(Path(path))
    if committed is not None:
        intact, then = f"the checkpoint committed in {committed} and every file written before are intact", "resume"
    else:
        intact, then = "no checkpoint was committed yet; every file written before is intact", "start again"
    if code in DISK_FULL:
        error = OSError(f"no space left on the device while writing {path}; free some space and {then}: {intact}")
    elif code == errno.EROFS:
        error = OSError(f"the file system of {path} is read-only; nothing could be written there: {intact}")
    else:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        error = OSError(f"could not write {path}: {reason}")
    error.errno = code
    return error


def _committed_checkpoint_near(path: Path) -> Path | None:
    """The run folder holding a committed checkpoint pointer (``checkpoint.json``) among ``path``'s
    folder and its parents up to the run's root (a checkpoint file sits 3 levels below it), else None."""
    from .layout import POINTER_FILE

    for folder in list(path.parents)[:4]:
        if (folder / POINTER_FILE).is_file():
            return folder
    return None


def is_disk_error(exc: BaseException) -> bool:
    """Whether a non-OSError exception (a library's) reports a failed write to the disk."""
    return any(text in str(exc) for text in _OS_ERROR_IN_TEXT)


def make_dir(path: Path) -> None:
    """Create the folder ``path`` (and its parents); a failure is :func:`disk_error`'s one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise disk_error(exc, path) from None


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
        raise disk_error(exc, path) from None
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
