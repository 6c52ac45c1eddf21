"""``load_corpus``: a source split into train/validation token streams, audited and cached.

Steps (all deterministic):

1. Read the source (``sources.read_source``): the standard library by default.
2. Documents: one per file or dataset row (``documents="file"``), or the blank-line-separated
   paragraphs of each file (``"paragraph"``). ``"auto"`` picks paragraphs when the source is a single
   file (one document could not be split) and files otherwise. Whitespace-only documents are
   dropped; exact duplicates (same SHA-256) keep their first occurrence. Text is not normalised
   (the reference collapses whitespace for Wikipedia, which would destroy code).
3. Split: a document is validation iff its seeded hash is below ``val_fraction`` (``audit.py``).
   The default 0.1 gives about 1 MB of validation text from the standard library.
4. Audit: each split is one stream, documents joined by a blank line ("\\n\\n"). Validation
   windows of 512 bytes are compared with the training windows (stride 256), both on the
   reference's grid and at every validation offset (``audit.py``). With ``on_overlap="move"`` (the
   default) each validation document that shares a window with training is moved to training, and
   the audit repeats until both counts are zero; ``"raise"`` raises ValueError instead. The result
   and the moved documents are recorded in ``meta["audit"]``; a corpus is never returned with a
   non-zero count.
5. Tokenize each stream whole (so the token stream decodes to exactly the stream whose UTF-8 size
   is ``meta["train_bytes"]`` / ``meta["val_bytes"]``, as bits-per-byte needs) and write the two
   shards plus a manifest under ``<cache root>/<name>-<key>``. The cache root is ``cache_dir``, else
   ``$DRMLAB_CACHE/corpora``, else ``~/.cache/drmlab/corpora``; the key hashes the content and listing
   hashes, the tokenizer and every split parameter. The source is re-read and re-hashed on every
   call, so an edited source never loads a stale cache.

A cached corpus loads after its shards are verified (size and SHA-256); a damaged one raises
``CorruptShardError`` naming the file; ``rebuild=True`` rebuilds it.

6. Document starts: the token offset of each document of each split, with its leading separator
   (``documents.py``), written as two more shards (``train.docs.bin``, ``val.docs.bin``) under the
   manifest's ``documents`` entry and given as ``TokenCorpus.doc_starts`` (the entry is null, and
   ``doc_starts`` None, for a tokenizer whose tokens' bytes do not add up to the stream's). A cache
   written before they were recorded has no such entry: it loads as before with ``doc_starts = None``,
   and ``need_doc_starts=True`` rebuilds it in place (the same key and folder, the same token shards;
   the manifest gains the entry).
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .audit import STRIDE, WINDOW, audit_streams, documents_touched, is_validation
from .documents import RULE as DOC_STARTS_RULE
from .documents import document_starts, token_byte_lengths
from .shards import CorruptShardError, dtype_for_vocab, open_shard, read_manifest, write_manifest, write_shard
from .sources import RawSource, read_source
from .tokenizers import Tokenizer, get_tokenizer

FORMAT = "drmlab-corpus/1"
SEPARATOR = "\n\n"
DEFAULT_VAL_FRACTION = 0.1
DOCUMENT_MODES = ("auto", "file", "paragraph")
OVERLAP_POLICIES = ("move", "raise")
_PARAGRAPH_BREAK = re.compile(r"\n(?:[^\S\n]*\n)+")  # one or more blank (whitespace-only) lines
_MAX_NAMES = 200


@dataclass
class TokenCorpus:
    """``train`` and ``val``: read-only 1-D memmaps of token ids (uint8 for vocabularies up to
    256, uint16 up to 65,536). ``meta``: json-serialisable description (see ``load_corpus``)."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    meta: dict[str, Any]
    cache_dir: Path
    from_cache: bool = field(default=False)
    doc_starts: dict[str, np.ndarray] | None = field(default=None)  # split -> token offsets (documents.py)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def __repr__(self) -> str:
        return (
            f"TokenCorpus(source={self.meta.get('source')!r}, tokenizer={self.tokenizer.name!r}, "
            f"train={len(self.train):,} tokens, val={len(self.val):,} tokens)"
        )


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder that holds one sub-folder per cached corpus."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("DRMLAB_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "drmlab"
    return base / "corpora"


def _documents(raw: RawSource, mode: str) -> tuple[list[tuple[str, str]], int]:
    """(name, text) documents before deduplication, and how many blank ones were dropped."""
    docs, n_blank = [], 0
    for name, text in raw.files:
        pieces = (
            [(name, text)]
            if mode == "file"
            else [(f"{name}#{i}", p.strip("\n")) for i, p in enumerate(_PARAGRAPH_BREAK.split(text))]
        )
        for piece_name, piece in pieces:
            if piece.strip():
                docs.append((piece_name, piece))
            else:
                n_blank += 1
    return docs, n_blank


def _slug(raw: RawSource, tok: Tokenizer) -> str:
    if raw.kind == "stdlib":
        base = "stdlib-py" + ".".join(str(raw.info.get("python_version", "")).split(".")[:2])
    elif raw.kind == "hf":
        base = "hf-" + raw.info["hf_name"] + ("-" + raw.info["hf_config"] if raw.info.get("hf_config") else "")
    elif raw.kind == "glob":
        base = "glob"
    else:
        base = Path(raw.spec).expanduser().name or raw.kind
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._")[:40] or raw.kind
    tname = re.sub(r"[^A-Za-z0-9._-]+", "_", tok.name)[:20]
    return f"{base}-{tname}"


def _check_params(val_fraction, split_seed, documents, on_overlap) -> None:
    if (
        isinstance(val_fraction, bool)
        or not isinstance(val_fraction, numbers.Real)
        or not 0.0 < float(val_fraction) < 1.0
    ):
        raise ValueError(f"val_fraction must be a number strictly between 0 and 1, got {val_fraction!r}")
    if isinstance(split_seed, bool) or not isinstance(split_seed, numbers.Integral) or split_seed < 0:
        raise ValueError(f"split_seed must be a non-negative integer, got {split_seed!r}")
    if documents not in DOCUMENT_MODES:
        raise ValueError(f"documents must be one of {DOCUMENT_MODES}, got {documents!r}")
    if on_overlap not in OVERLAP_POLICIES:
        raise ValueError(f"on_overlap must be one of {OVERLAP_POLICIES}, got {on_overlap!r}")


def _split_and_audit(docs, val_fraction, split_seed, on_overlap, source):
    """Assign documents to splits, then move contaminated validation documents until the audit is
    clean. Returns (train_docs, val_docs, audit_meta)."""
    is_val = [is_validation(text, val_fraction, split_seed) for _, text in docs]
    encoded = [text.encode("utf-8") for _, text in docs]
    n_val = sum(is_val)
    if n_val == 0 or n_val == len(docs):
        which = "validation" if n_val == 0 else "training"
        raise ValueError(
            f"the {which} split of {source!r} is empty: {n_val} of {len(docs)} documents hashed into "
            f"validation with val_fraction={val_fraction}, split_seed={split_seed}. Use a source with more "
            "documents, documents='paragraph', another val_fraction or another split_seed"
        )
    sep = SEPARATOR.encode("utf-8")
    moved: list[str] = []
    before = None
    while True:
        val_idx = [i for i, v in enumerate(is_val) if v]
        train_b = sep.join(encoded[i] for i, v in enumerate(is_val) if not v)
        val_b = sep.join(encoded[i] for i in val_idx)
        res = audit_streams(train_b, val_b, WINDOW, STRIDE)
        if before is None:
            before = res
        if res.overlaps_any_offset == 0:
            break
        lengths = np.array([len(encoded[i]) for i in val_idx], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths + len(sep))[:-1]])
        touched = sorted(documents_touched(res.matched_offsets, starts, starts + lengths, WINDOW))
        names = [docs[val_idx[j]][0] for j in touched]
        if on_overlap == "raise":
            raise ValueError(
                f"contamination audit of {source!r} failed: {res.overlaps} validation windows on the "
                f"{STRIDE}-byte grid and {res.overlaps_any_offset} at any offset (of {WINDOW} bytes) also occur "
                f"in training; validation documents involved: {', '.join(names[:10])}"
                + (" ..." if len(names) > 10 else "")
            )
        for j in touched:
            is_val[val_idx[j]] = False
        moved.extend(names)
        if not any(is_val):
            raise ValueError(
                f"the contamination audit of {source!r} moved every validation document into training "
                f"({len(moved)} documents share 512-byte passages with training); the corpus is too repetitive "
                "to split at this granularity"
            )
    audit = res.as_meta()
    audit.update(
        {
            "policy": on_overlap,
            "passed": res.overlaps == 0 and res.overlaps_any_offset == 0,
            "before": {"overlaps": before.overlaps, "overlaps_any_offset": before.overlaps_any_offset},
            "moved_to_train": moved,
        }
    )
    train_docs = [d for d, v in zip(docs, is_val) if not v]
    val_docs = [d for d, v in zip(docs, is_val) if v]
    return train_docs, val_docs, audit


def _tokenize(tok: Tokenizer, text: str) -> np.ndarray:
    dtype = dtype_for_vocab(tok.vocab_size)
    ids = tok.encode_array(text)
    if ids.dtype != dtype:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= tok.vocab_size):
            raise ValueError(f"tokenizer {tok.name!r} produced ids outside [0, {tok.vocab_size})")
        ids = ids.astype(dtype)
    return ids


def _paths_meta(folder: Path, manifest: dict) -> dict:
    return {
        "cache_dir": str(folder),
        "manifest": str(folder / "manifest.json"),
        "shards": {split: str(folder / entry["file"]) for split, entry in manifest["shards"].items()},
    }


def load_corpus(
    source: str | os.PathLike | None = None,
    tokenizer: str | Tokenizer = "bytes",
    cache_dir: str | os.PathLike | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    split_seed: int = 0,
    *,
    documents: str = "auto",
    on_overlap: str = "move",
    rebuild: bool = False,
    verify: bool = True,
    need_doc_starts: bool = False,
) -> TokenCorpus:
    """Load (building and caching on first use) a corpus as train/validation token streams.

    ``source``: None or "stdlib" (default), a file, directory or glob, or "hf:NAME[:CONFIG]".
    ``tokenizer``: "bytes" (default), "gpt2", or a Tokenizer. ``cache_dir``: the cache root (see the
    module docstring). ``val_fraction``/``split_seed``: the document split. ``documents``: "auto",
    "file" or "paragraph". ``on_overlap``: "move" or "raise". ``rebuild``: ignore and replace an
    existing cache. ``verify``: check shard checksums when loading from the cache. ``need_doc_starts``:
    rebuild a cache that predates the document starts (module docstring, step 6).

    ``meta`` holds: source (as named), source_kind, python_version, content_sha256, n_files,
    n_skipped_undecodable, documents, n_docs (non-blank, before deduplication), n_blank_dropped,
    n_duplicates_removed, val_fraction, split_seed, separator, train_docs/val_docs,
    train_bytes/val_bytes (UTF-8 bytes of each stream), train_tokens/val_tokens, audit, tokenizer,
    vocab_size, dtype, cache_dir, manifest and shards (paths).
    """
    _check_params(val_fraction, split_seed, documents, on_overlap)
    val_fraction, split_seed = float(val_fraction), int(split_seed)
    tok = get_tokenizer(tokenizer)
    raw = read_source(source)
    mode = documents if documents != "auto" else ("paragraph" if len(raw.files) == 1 else "file")
    key_fields = {
        "format": FORMAT,
        "kind": raw.kind,
        "content_sha256": raw.content_sha256,
        "listing_sha256": raw.listing_sha256,
        "documents": mode,
        "separator": SEPARATOR,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "val_fraction": repr(val_fraction),
        "split_seed": split_seed,
        "on_overlap": on_overlap,
        "window": WINDOW,
        "stride": STRIDE,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode("utf-8")).hexdigest()
    folder = cache_root(cache_dir) / f"{_slug(raw, tok)}-{key[:16]}"
    hint = f"delete {folder} (the next run rebuilds it) or call load_corpus(..., rebuild=True)"
    current = {**raw.meta(), "python_version": raw.info.get("python_version") or platform.python_version()}

    manifest = None if rebuild else read_manifest(folder)
    if manifest is not None and need_doc_starts and "documents" not in manifest:
        manifest = None  # an older cache: rebuilt in place, the same tokens, with the document starts
    if manifest is not None:
        if manifest.get("key") != key or manifest.get("format") != FORMAT:
            raise CorruptShardError(f"cache manifest {folder / 'manifest.json'} does not belong to this corpus; {hint}")
        shards = {
            split: open_shard(folder, manifest["shards"][split], verify=verify, hint=hint) for split in ("train", "val")
        }
        want = dtype_for_vocab(tok.vocab_size)
        for split, arr in shards.items():
            if arr.dtype != want:
                raise CorruptShardError(
                    f"cache shard {folder / manifest['shards'][split]['file']} holds {arr.dtype}, expected {want}; {hint}"
                )
        meta = {**manifest["meta"], **current, **_paths_meta(folder, manifest)}
        starts = _open_doc_starts(folder, manifest.get("documents"), verify, hint)
        return TokenCorpus(shards["train"], shards["val"], tok, meta, folder, from_cache=True, doc_starts=starts)

    t0 = time.perf_counter()
    if rebuild and (folder / "manifest.json").exists():
        (folder / "manifest.json").unlink()
    docs, n_blank = _documents(raw, mode)
    if not docs:
        skipped = f", {len(raw.skipped)} skipped as not UTF-8 text" if raw.skipped else ""
        raise ValueError(f"corpus {raw.spec!r} is empty: {len(raw.files)} files read{skipped}, no non-blank text")
    seen, unique = set(), []
    for name, text in docs:
        h = hashlib.sha256(text.encode("utf-8")).digest()
        if h not in seen:
            seen.add(h)
            unique.append((name, text))
    n_dups = len(docs) - len(unique)
    if len(unique) < 2:
        raise ValueError(
            f"corpus {raw.spec!r} has {len(unique)} distinct document, too few to split into train and validation"
            + ("; try documents='paragraph'" if mode == "file" else "")
        )
    train_docs, val_docs, audit = _split_and_audit(unique, val_fraction, split_seed, on_overlap, raw.spec)
    streams = {"train": SEPARATOR.join(t for _, t in train_docs), "val": SEPARATOR.join(t for _, t in val_docs)}
    tokens = {split: _tokenize(tok, text) for split, text in streams.items()}
    for split, ids in tokens.items():
        if ids.size == 0:
            raise ValueError(f"the {split} stream of {raw.spec!r} tokenizes to no tokens")
    entries = {split: write_shard(folder, f"{split}.bin", ids) for split, ids in tokens.items()}
    split_docs = {"train": train_docs, "val": val_docs}
    starts = {
        split: document_starts(
            [len(t.encode("utf-8")) for _, t in split_docs[split]],
            len(SEPARATOR.encode("utf-8")),
            token_byte_lengths(tok, ids),
        )
        for split, ids in tokens.items()
    }
    documents = None
    if all(v is not None for v in starts.values()):
        documents = {
            "rule": DOC_STARTS_RULE,
            "shards": {split: write_shard(folder, f"{split}.docs.bin", v) for split, v in starts.items()},
        }
    meta = {
        **current,
        "documents": mode,
        "n_docs": len(docs),
        "n_blank_dropped": n_blank,
        "n_duplicates_removed": n_dups,
        "val_fraction": val_fraction,
        "split_seed": split_seed,
        "split_rule": "validation iff first 64 bits of sha256(text) (seed 0) or sha256(b'drmlab-split:<seed>:' + text) < val_fraction * 2**64",
        "separator": SEPARATOR,
        "train_docs": len(train_docs),
        "val_docs": len(val_docs),
        "train_bytes": len(streams["train"].encode("utf-8")),
        "val_bytes": len(streams["val"].encode("utf-8")),
        "train_tokens": int(tokens["train"].size),
        "val_tokens": int(tokens["val"].size),
        "val_doc_names": [n for n, _ in val_docs] if len(val_docs) <= _MAX_NAMES else None,
        "audit": audit,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "dtype": entries["train"]["dtype"],
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    manifest = {"format": FORMAT, "key": key, "key_fields": key_fields, "shards": entries, "meta": meta}
    manifest["documents"] = documents  # null: a tokenizer whose bytes do not add up (recorded: not rebuilt again)
    write_manifest(folder, manifest)
    meta = {**meta, **_paths_meta(folder, manifest)}
    train, val = (open_shard(folder, entries[s], verify=False, hint=hint) for s in ("train", "val"))
    starts = _open_doc_starts(folder, documents, False, hint)
    return TokenCorpus(train, val, tok, meta, folder, from_cache=False, doc_starts=starts)


def _open_doc_starts(folder: Path, documents: dict | None, verify: bool, hint: str) -> dict[str, np.ndarray] | None:
    """The manifest's document starts per split (verified memmaps), or None for a cache without them."""
    if not isinstance(documents, dict) or not isinstance(documents.get("shards"), dict):
        return None
    return {split: open_shard(folder, entry, verify=verify, hint=hint) for split, entry in documents["shards"].items()}
