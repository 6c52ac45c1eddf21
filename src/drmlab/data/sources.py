"""Where corpus text comes from: the embedded standard-library default, local paths, HF datasets.

``read_source(spec)`` returns a ``RawSource``: the texts of the source's files (or dataset rows) in
a fixed order, with a content hash. ``spec`` is one of

* ``None`` or ``"stdlib"``: the running interpreter's standard library, i.e. every ``.py`` file
  under ``sysconfig.get_paths()["stdlib"]``, sorted by relative path, excluding the test suites
  (directories named ``test``, ``tests``, ``idle_test``), installed packages (``site-packages``,
  ``dist-packages``), ``__pycache__``, ``lib-dynload``, the build's ``config-*`` folder and the
  build-generated ``_sysconfigdata*.py`` (which differs between machines with the same Python).
  It is on every machine with Python, and nobody in this project wrote it.
* a file: read as UTF-8; a file that is not valid UTF-8 is an error naming the file.
* a directory: every regular file below it, sorted by relative path, skipping hidden entries and
  ``__pycache__``. Files that are not valid UTF-8, or contain NUL bytes (binaries), are skipped and
  counted (``n_skipped_undecodable``, ``skipped_files``).
* a glob (``*``, ``?``, ``[``; ``**`` recurses): the matching files, sorted, treated like a directory.
* ``"hf:NAME[:CONFIG]"``: the ``train`` split of a Hugging Face dataset, one document per row of
  its ``text`` column (or its first string column). Needs the ``datasets`` extra and, on first use,
  the network.

``content_sha256`` is the SHA-256 of the files' raw bytes concatenated in that order (for a dataset,
of its rows' UTF-8 text), so ``cat`` of the listed files through ``sha256sum`` reproduces it.
``listing_sha256`` hashes the relative names and sizes.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib-dynload"}
)
_MAX_SKIPPED_LISTED = 20


@dataclass
class RawSource:
    kind: str  # "stdlib" | "file" | "directory" | "glob" | "hf"
    spec: str  # the source as the user named it
    files: list[tuple[str, str]]  # (name, text), one per file or dataset row, in a fixed order
    content_sha256: str
    listing_sha256: str
    source_bytes: int  # bytes read (before any document splitting)
    skipped: list[str] = field(default_factory=list)  # files skipped as undecodable / binary
    info: dict[str, Any] = field(default_factory=dict)  # kind-specific, json-serialisable

    def meta(self) -> dict[str, Any]:
        return {
            "source": self.spec,
            "source_kind": self.kind,
            **self.info,
            "n_files": len(self.files),
            "source_bytes": self.source_bytes,
            "content_sha256": self.content_sha256,
            "listing_sha256": self.listing_sha256,
            "n_skipped_undecodable": len(self.skipped),
            "skipped_files": self.skipped[:_MAX_SKIPPED_LISTED],
        }


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """(relative POSIX name, path) of the standard-library files the default corpus reads."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDED_DIRS and not d.startswith(("config-", "."))]
        for f in filenames:
            if f.endswith(".py") and not f.startswith("_sysconfigdata"):
                p = Path(dirpath) / f
                out.append((p.relative_to(root).as_posix(), p))
    out.sort(key=lambda item: item[0])
    return out


def _decode(raw: bytes) -> str | None:
    """UTF-8 text, or None for undecodable or binary (NUL-containing) bytes."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_many(kind: str, spec: str, entries: list[tuple[str, Path]], info: dict) -> RawSource:
    h_content, h_listing = hashlib.sha256(), hashlib.sha256()
    files, skipped, total = [], [], 0
    for name, path in entries:
        raw = path.read_bytes()
        text = _decode(raw)
        if text is None:
            skipped.append(name)
            continue
        h_content.update(raw)
        h_listing.update(f"{name}\t{len(raw)}\n".encode())
        files.append((name, text))
        total += len(raw)
    return RawSource(kind, spec, files, h_content.hexdigest(), h_listing.hexdigest(), total, skipped, info)


def _read_stdlib(spec: str) -> RawSource:
    root = stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library folder {root} (sysconfig 'stdlib') does not exist")
    info = {
        "python_version": platform.python_version(),
        "python_implementation": sys.implementation.name,
        "stdlib_path": str(root),
    }
    return _read_many("stdlib", spec, stdlib_files(root), info)


def _read_file(spec: str, path: Path) -> RawSource:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); convert it to UTF-8 first"
        ) from None
    listing = hashlib.sha256(f"{path.name}\t{len(raw)}\n".encode()).hexdigest()
    info = {"path": str(path.resolve())}
    return RawSource("file", spec, [(path.name, text)], hashlib.sha256(raw).hexdigest(), listing, len(raw), [], info)


def _walk_dir(root: Path) -> list[tuple[str, Path]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        for f in filenames:
            p = Path(dirpath) / f
            if not f.startswith(".") and p.is_file():
                out.append((p.relative_to(root).as_posix(), p))
    out.sort(key=lambda item: item[0])
    return out


def _glob_base(pattern: str) -> Path:
    """The longest leading folder of ``pattern`` without glob characters."""
    parts = Path(pattern).parts
    base = []
    for part in parts[:-1]:
        if _glob.has_magic(part):
            break
        base.append(part)
    return Path(*base) if base else Path(".")


def _read_hf(spec: str) -> RawSource:
    rest = spec[3:]
    name, _, config = rest.partition(":")
    if not name:
        raise ValueError(f"Hugging Face source {spec!r} names no dataset; use 'hf:NAME' or 'hf:NAME:CONFIG'")
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"source {spec!r} needs the Hugging Face 'datasets' package: pip install 'drmlab[datasets]' "
            "(or pass a local file, folder or glob instead)"
        ) from None
    where = f"{name!r}" + (f" (config {config!r})" if config else "")
    try:
        ds = datasets.load_dataset(name, config or None, split="train")
    except Exception as exc:  # network, unknown name, missing config, offline mode ...
        raise ValueError(
            f"could not load the Hugging Face dataset {where}, split 'train': {type(exc).__name__}: {exc}. "
            "Loading a dataset by name needs the network the first time (afterwards the datasets cache); "
            "check the name and config, or pass a local file, folder or glob"
        ) from exc
    columns = list(getattr(ds, "column_names", []) or [])
    column = "text" if "text" in columns else None
    if column is None:
        for c in columns:
            first = next((v for v in ds[c] if v is not None), None)
            if isinstance(first, str):
                column = c
                break
    if column is None:
        raise ValueError(f"the Hugging Face dataset {where} has no text column (columns: {columns})")
    h_content, files, skipped, total = hashlib.sha256(), [], [], 0
    for i, text in enumerate(ds[column]):
        if not isinstance(text, str):
            skipped.append(f"row {i}")
            continue
        raw = text.encode("utf-8")
        h_content.update(raw)
        total += len(raw)
        files.append((f"{name}#{i}", text))
    info = {
        "hf_name": name,
        "hf_config": config or None,
        "hf_split": "train",
        "hf_column": column,
        "hf_fingerprint": getattr(ds, "_fingerprint", None),
    }
    listing = hashlib.sha256(f"{name}\t{config}\t{column}\t{len(files)}\n".encode()).hexdigest()
    return RawSource("hf", spec, files, h_content.hexdigest(), listing, total, skipped, info)


def read_source(source: str | os.PathLike | None = None) -> RawSource:
    """Read a corpus source (see the module docstring). FileNotFoundError for a path or glob that
    names nothing; ValueError for a non-UTF-8 single file."""
    if source is None or (isinstance(source, str) and source == "stdlib"):
        return _read_stdlib("stdlib")
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(
            f"source must be None, 'stdlib', a path, a glob or 'hf:NAME[:CONFIG]', got {type(source).__name__}"
        )
    spec = os.fspath(source)
    if not spec:
        raise ValueError("source is an empty string; use None or 'stdlib' for the default corpus")
    if spec.startswith("hf:"):
        return _read_hf(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        return _read_file(spec, path)
    if path.is_dir():
        entries = _walk_dir(path)
        if not entries:
            raise ValueError(f"directory {path} contains no files")
        return _read_many("directory", spec, entries, {"path": str(path.resolve())})
    if _glob.has_magic(spec):
        pattern = os.path.expanduser(spec)
        base = _glob_base(pattern)
        matches = sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise FileNotFoundError(f"the glob {spec!r} matches no files")
        entries = [(Path(os.path.relpath(m, base)).as_posix(), Path(m)) for m in matches]
        entries.sort(key=lambda item: item[0])
        return _read_many("glob", spec, entries, {"pattern": spec, "base": str(base.resolve())})
    raise FileNotFoundError(
        f"corpus source {spec!r} is not an existing file or directory "
        "(sources: None or 'stdlib', a file, a directory, a glob, or 'hf:NAME[:CONFIG]')"
    )
