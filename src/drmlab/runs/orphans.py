"""What a killed writer of a run left behind, removed by the next writer (docs/runs.md, "What a run directory
promises"): temporary files and folders, superseded checkpoint folders, and a lost or damaged pointer (recovered from
the newest checkpoint whose manifest verifies)."""

from __future__ import annotations

import shutil
from pathlib import Path

from .checkpoint import CorruptCheckpointError, own_manifest, resolve_checkpoint
from .jsonio import fsync_path, read_json, write_json_atomic
from .layout import CHECKPOINTS_DIR, MANIFEST_FILE, POINTER_FILE, RUN_FILES, TEMP_CHECKPOINT_PREFIX, TEMP_METRICS_FILE


def clean_orphans(run: Path) -> list[str]:
    """Remove what a killed writer of this run left, and nothing else; call only while holding the lock.

    Removed: its temporary files and folders (names only this module and :mod:`~drmlab.runs.jsonio`
    give), and checkpoint folders this run wrote (a :func:`own_manifest`) that the committed checkpoint
    superseded. That is done only once the committed checkpoint is proven: the pointer verifies, or a
    lost or damaged pointer was recovered from the newest checkpoint whose manifest verifies (the pointer
    is then rewritten from it, and ``"recovered ..."`` is among the names returned). When no checkpoint
    verifies, no checkpoint folder is touched. Returns the names removed."""
    if not run.is_dir():
        return []
    removed = []
    for entry in run.iterdir():
        name = entry.name
        temp_json = name.startswith(".") and any(name.startswith(f".{f}.") for f in RUN_FILES + (MANIFEST_FILE,))
        if name.startswith(TEMP_CHECKPOINT_PREFIX) or temp_json or name == TEMP_METRICS_FILE:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(name)
    folder = run / CHECKPOINTS_DIR
    if not folder.is_dir():
        return removed
    owned = {entry: m for entry in folder.iterdir() if (m := own_manifest(entry)) is not None}
    if _only_the_committed_folder(run, owned):  # nothing to delete or recover: the loader verifies the files
        return removed
    try:
        keep, manifest, note = resolve_checkpoint(run)
    except (FileNotFoundError, CorruptCheckpointError):
        return removed  # nothing proven committed: every checkpoint folder stays for the user to inspect
    if note is not None:  # the pointer was lost or damaged: commit the checkpoint that verifies
        write_json_atomic(run / POINTER_FILE, manifest)
        fsync_path(run)
        removed.append(f"recovered {POINTER_FILE}: {note}; rewritten from {manifest['dir']}/{MANIFEST_FILE}")
    for entry in owned:
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(f"{CHECKPOINTS_DIR}/{entry.name}")
    return removed


def _only_the_committed_folder(run: Path, owned: dict[Path, dict]) -> bool:
    """Whether the run's own checkpoint folders are just the one its pointer names, with the pointer an exact
    copy of that folder's manifest (the state every commit leaves): then clean-up need not hash anything."""
    try:
        pointer = read_json(run / POINTER_FILE)
    except (FileNotFoundError, ValueError):
        return False
    if not isinstance(pointer, dict) or not isinstance(pointer.get("dir"), str):
        return False
    return list(owned) == [run / pointer["dir"]] and owned[run / pointer["dir"]] == pointer
