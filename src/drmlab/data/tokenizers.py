"""Tokenizers: UTF-8 bytes (vocabulary 256, the default) and GPT-2 BPE through tiktoken.

``get_tokenizer("bytes")`` maps each UTF-8 byte to its own id, as the reference study does.

``get_tokenizer("gpt2")`` is the real GPT-2 encoding (50,257 ids, end-of-text 50256), built by
tiktoken from the two GPT-2 files ``encoder.json`` and ``vocab.bpe``. It never needs the network
when the files are on disk. They are looked for, in order, in:

1. ``gpt2_dir=`` when given (an error if the files are not there);
2. ``$DRMLAB_GPT2_DIR`` when set (an error if the files are not there);
3. each folder in ``search_paths=`` (for example a checkout's ``shared/data/gpt2``);
4. tiktoken's own download cache (``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR`` or
   ``<tmp>/data-gym-cache``), read directly, so nothing is fetched;
5. a download through ``tiktoken.get_encoding("gpt2")``, only when ``download=True`` or
   ``$DRMLAB_GPT2_DOWNLOAD=1`` (tiktoken's download has no timeout, so it is opt-in).

Whatever the source, both files must carry the SHA-256 hashes tiktoken expects, so a tokenizer
named "gpt2" is always the genuine one. We build the encoding ourselves from the file bytes rather
than through ``tiktoken.load``, which would copy local files into tiktoken's cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

GPT2_ENCODER_JSON = "encoder.json"
GPT2_VOCAB_BPE = "vocab.bpe"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_GPT2_URLS = {
    GPT2_VOCAB_BPE: "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    GPT2_ENCODER_JSON: "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}
# tiktoken's r50k/gpt2 pre-tokenizer pattern (used if tiktoken_ext is unavailable).
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_GPT2_EOT = "<|endoftext|>"

TOKENIZER_NAMES = ("bytes", "gpt2")


class Tokenizer:
    """What every tokenizer offers: ``name``, ``vocab_size``, ``eot_id`` (or None),
    ``encode(str) -> list[int]``, ``decode(list[int]) -> str`` (invalid UTF-8 becomes U+FFFD),
    ``decode_bytes(list[int]) -> bytes`` (exact), and ``encode_array`` (a numpy array in the
    smallest unsigned dtype that holds the vocabulary)."""

    name: str = "tokenizer"
    vocab_size: int = 0
    eot_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of ``ids`` (no U+FFFD replacement), e.g. to count bytes for bits-per-byte."""
        raise NotImplementedError

    def encode_array(self, text: str) -> np.ndarray:
        from .shards import dtype_for_vocab

        return np.asarray(self.encode(text), dtype=dtype_for_vocab(self.vocab_size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    """Each UTF-8 byte is one token: vocabulary 256, no end-of-text id.

    ``decode`` replaces incomplete or invalid UTF-8 sequences (which sampling can produce) with
    U+FFFD instead of raising."""

    name = "bytes"
    vocab_size = 256
    eot_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        try:
            return bytes(int(i) for i in ids)
        except ValueError:
            bad = next(int(i) for i in ids if not 0 <= int(i) < 256)
            raise ValueError(f"token id {bad} is outside the byte vocabulary [0, 256)") from None

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding. ``encode`` treats special-token text such as "<|endoftext|>" as plain
    text (encode_ordinary); ``decode`` replaces invalid UTF-8 with U+FFFD."""

    def __init__(self, encoding, name: str, origin: str):
        self._enc = encoding
        self.name = name
        self.origin = origin  # where the files came from (a folder, the tiktoken cache, download)
        self.vocab_size = int(encoding.n_vocab)
        self.eot_id = encoding.eot_token if _GPT2_EOT in encoding.special_tokens_set else None

    @property
    def encoding(self):
        """The underlying ``tiktoken.Encoding``."""
        return self._enc

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def _checked(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the {self.name} vocabulary [0, {self.vocab_size})")
        return ids

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self._enc.decode_bytes(self._checked(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(self._checked(ids), errors="replace")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _import_tiktoken():
    try:
        import tiktoken
    except ImportError as exc:
        raise ImportError(
            "the gpt2 tokenizer needs the 'tiktoken' package: pip install 'drmlab[hf]' (or pip install tiktoken)"
        ) from exc
    return tiktoken


def _gpt2_ranks(vocab_bpe: bytes, encoder_json: bytes) -> dict[bytes, int]:
    """GPT-2's mergeable ranks from the two files' bytes (tiktoken's data-gym conversion)."""
    rank_to_intbyte = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    data_gym_byte_to_byte = {chr(b): b for b in rank_to_intbyte}
    n = 0
    for b in range(256):
        if b not in rank_to_intbyte:
            rank_to_intbyte.append(b)
            data_gym_byte_to_byte[chr(256 + n)] = b
            n += 1

    def decode_data_gym(value: str) -> bytes:
        return bytes(data_gym_byte_to_byte[c] for c in value)

    ranks = {bytes([b]): i for i, b in enumerate(rank_to_intbyte)}
    n = len(ranks)
    for line in vocab_bpe.decode("utf-8").split("\n")[1:-1]:
        first, second = line.split()
        ranks[decode_data_gym(first) + decode_data_gym(second)] = n
        n += 1
    # encoder.json must agree with the merges (tiktoken's own sanity check); with the hashes
    # verified this holds, so only the sizes are compared here.
    encoder = json.loads(encoder_json)
    if len(encoder) - 1 != len(ranks):  # encoder.json also lists <|endoftext|>
        raise ValueError(f"encoder.json has {len(encoder)} entries, vocab.bpe gives {len(ranks)} ranks")
    return ranks


def gpt2_from_bytes(vocab_bpe: bytes, encoder_json: bytes, origin: str = "bytes") -> TiktokenTokenizer:
    """The GPT-2 tokenizer from the contents of ``vocab.bpe`` and ``encoder.json``.

    Raises ValueError when either file's SHA-256 is not the one tiktoken expects for GPT-2."""
    for fname, data, want in (
        (GPT2_VOCAB_BPE, vocab_bpe, GPT2_VOCAB_BPE_SHA256),
        (GPT2_ENCODER_JSON, encoder_json, GPT2_ENCODER_JSON_SHA256),
    ):
        got = _sha256(data)
        if got != want:
            raise ValueError(f"{fname} from {origin} is not the GPT-2 file: sha256 {got}, expected {want}")
    tiktoken = _import_tiktoken()
    try:
        from tiktoken_ext.openai_public import r50k_pat_str as pattern
    except ImportError:  # pragma: no cover - tiktoken always ships tiktoken_ext
        pattern = _GPT2_PATTERN
    enc = tiktoken.Encoding(
        name="gpt2",
        pat_str=pattern,
        mergeable_ranks=_gpt2_ranks(vocab_bpe, encoder_json),
        special_tokens={_GPT2_EOT: 50256},
        explicit_n_vocab=50257,
    )
    return TiktokenTokenizer(enc, "gpt2", origin)


def gpt2_from_dir(directory: str | os.PathLike) -> TiktokenTokenizer:
    """The GPT-2 tokenizer from a folder holding ``encoder.json`` and ``vocab.bpe``.

    Raises FileNotFoundError naming the missing file, ValueError for a wrong hash."""
    d = Path(directory).expanduser()
    paths = {f: d / f for f in (GPT2_VOCAB_BPE, GPT2_ENCODER_JSON)}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"GPT-2 tokenizer files not found: {', '.join(missing)}")
    return gpt2_from_bytes(paths[GPT2_VOCAB_BPE].read_bytes(), paths[GPT2_ENCODER_JSON].read_bytes(), origin=str(d))


def _has_gpt2_files(d: Path) -> bool:
    return (d / GPT2_VOCAB_BPE).is_file() and (d / GPT2_ENCODER_JSON).is_file()


def tiktoken_cache_dir() -> Path | None:
    """The folder tiktoken caches downloads in (None when its caching is disabled)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return Path(os.environ[var]) if os.environ[var] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _from_tiktoken_cache() -> TiktokenTokenizer | None:
    cache = tiktoken_cache_dir()
    if cache is None:
        return None
    files = {f: cache / hashlib.sha1(url.encode()).hexdigest() for f, url in _GPT2_URLS.items()}
    if not all(p.is_file() for p in files.values()):
        return None
    vocab_bpe, encoder_json = files[GPT2_VOCAB_BPE].read_bytes(), files[GPT2_ENCODER_JSON].read_bytes()
    if _sha256(vocab_bpe) != GPT2_VOCAB_BPE_SHA256 or _sha256(encoder_json) != GPT2_ENCODER_JSON_SHA256:
        return None  # a stale or partial cache entry: tiktoken itself would refetch it
    return gpt2_from_bytes(vocab_bpe, encoder_json, origin=f"tiktoken cache {cache}")


def load_gpt2(
    gpt2_dir: str | os.PathLike | None = None,
    search_paths: Iterable[str | os.PathLike] = (),
    download: bool | None = None,
) -> TiktokenTokenizer:
    """The GPT-2 tokenizer, found as the module docstring describes; FileNotFoundError listing
    every place searched when it is nowhere and downloading is off."""
    if gpt2_dir is not None:
        return gpt2_from_dir(gpt2_dir)
    env = os.environ.get("DRMLAB_GPT2_DIR")
    if env:
        try:
            return gpt2_from_dir(env)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"$DRMLAB_GPT2_DIR={env}: {exc}") from None
    searched = ["$DRMLAB_GPT2_DIR (unset)"]
    for p in search_paths:
        d = Path(p).expanduser()
        if _has_gpt2_files(d):
            return gpt2_from_dir(d)
        searched.append(str(d))
    tok = _from_tiktoken_cache()
    if tok is not None:
        return tok
    searched.append(f"tiktoken cache {tiktoken_cache_dir()}")
    if download is None:
        download = os.environ.get("DRMLAB_GPT2_DOWNLOAD", "") == "1"
    if download:
        tiktoken = _import_tiktoken()
        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as exc:  # requests/network errors of many kinds
            raise FileNotFoundError(
                f"could not download the GPT-2 tokenizer files ({type(exc).__name__}: {exc}); "
                f"searched {', '.join(searched)}"
            ) from exc
        return TiktokenTokenizer(enc, "gpt2", "tiktoken download")
    raise FileNotFoundError(
        "GPT-2 tokenizer files (encoder.json, vocab.bpe) not found; searched "
        + ", ".join(searched)
        + ". Set DRMLAB_GPT2_DIR to a folder holding them, pass gpt2_dir=..., "
        "or allow a download with download=True / DRMLAB_GPT2_DOWNLOAD=1 (needs the network)."
    )


def get_tokenizer(
    name: str | Tokenizer = "bytes",
    *,
    gpt2_dir: str | os.PathLike | None = None,
    search_paths: Iterable[str | os.PathLike] = (),
    download: bool | None = None,
) -> Tokenizer:
    """A tokenizer by name: "bytes" (the default) or "gpt2". A Tokenizer is returned unchanged.

    The keyword arguments only concern "gpt2" (see ``load_gpt2``). Unknown names raise
    ValueError listing the known ones."""
    if isinstance(name, Tokenizer):
        return name
    if not isinstance(name, str):
        raise ValueError(f"tokenizer must be a name or a Tokenizer, got {type(name).__name__}")
    key = name.strip().lower()
    if key == "bytes":
        return ByteTokenizer()
    if key == "gpt2":
        return load_gpt2(gpt2_dir=gpt2_dir, search_paths=search_paths, download=download)
    raise ValueError(f"unknown tokenizer {name!r}; known tokenizers: {', '.join(TOKENIZER_NAMES)}")
