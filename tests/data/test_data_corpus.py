"""Corpora: sources, the document split, the contamination audit, the cache, and bad input.

Small corpora are built in tmp_path; one test loads the real standard-library corpus (about 1.5 s).
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from drmlab.data import TokenCorpus, get_tokenizer, load_corpus
from drmlab.data.audit import audit_streams, documents_touched, is_validation, split_hash
from drmlab.data.sources import read_source, stdlib_files
from shared_data import find_gpt2_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _text(rng: random.Random, n_words: int) -> str:
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS) + str(rng.randrange(1000)))
        if len(line) == 9:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines + [" ".join(line)]) + "\n"


def make_dir(root, n=60, seed=0):
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    texts = {}
    for i in range(n):
        t = f"# doc {i}\n" + _text(rng, rng.randrange(20, 120))
        (root / f"d{i:03d}.txt").write_text(t, encoding="utf-8")
        texts[f"d{i:03d}.txt"] = t
    return texts


def test_directory_corpus(tmp_path):
    texts = make_dir(tmp_path / "src")
    c = load_corpus(tmp_path / "src", cache_dir=tmp_path / "cache", val_fraction=0.2)
    assert isinstance(c, TokenCorpus) and not c.from_cache
    assert isinstance(c.train, np.memmap) and c.train.dtype == np.uint8 and c.train.ndim == 1
    assert c.vocab_size == 256 and c.tokenizer.name == "bytes"
    m = c.meta
    json.dumps(m)
    names = sorted(texts)
    val_names = [n for n in names if is_validation(texts[n], 0.2, 0)]
    train_names = [n for n in names if n not in val_names]
    assert m["val_doc_names"] == val_names and 0 < len(val_names) < len(names)
    assert (m["train_docs"], m["val_docs"], m["n_docs"]) == (len(train_names), len(val_names), len(names))
    train_text = "\n\n".join(texts[n] for n in train_names)
    val_text = "\n\n".join(texts[n] for n in val_names)
    assert bytes(c.train).decode("utf-8") == train_text and bytes(c.val).decode("utf-8") == val_text
    assert m["train_bytes"] == len(train_text.encode()) == m["train_tokens"] == len(c.train)
    assert m["val_bytes"] == len(val_text.encode()) == m["val_tokens"] == len(c.val)
    raw = b"".join((tmp_path / "src" / n).read_bytes() for n in names)
    assert m["content_sha256"] == hashlib.sha256(raw).hexdigest()
    assert (m["source_kind"], m["documents"], m["tokenizer"], m["dtype"]) == ("directory", "file", "bytes", "uint8")
    assert m["audit"]["passed"] and m["audit"]["overlaps"] == 0 and m["audit"]["overlaps_any_offset"] == 0
    assert m["audit"]["windows"]["train"] == len(range(0, len(c.train) - 511, 256))
    assert m["python_version"] == platform.python_version()
    assert m["shards"]["train"].startswith(str(tmp_path / "cache"))


def test_cache_hits_and_invalidation(tmp_path, monkeypatch):
    make_dir(tmp_path / "src", n=30)
    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "env-cache"))
    a = load_corpus(tmp_path / "src", val_fraction=0.3)
    assert a.cache_dir.parent == tmp_path / "env-cache" / "corpora"
    b = load_corpus(str(tmp_path / "src"), val_fraction=0.3)
    assert b.from_cache and b.cache_dir == a.cache_dir
    np.testing.assert_array_equal(a.train, b.train)
    assert {k: v for k, v in a.meta.items()} == {k: v for k, v in b.meta.items()}
    c = load_corpus(tmp_path / "src", val_fraction=0.3, split_seed=1)  # other split parameters: other key
    assert not c.from_cache and c.cache_dir != a.cache_dir
    (tmp_path / "src" / "d000.txt").write_text("# edited\n" + "new words here " * 20)
    d = load_corpus(tmp_path / "src", val_fraction=0.3)  # edited source: rebuilt, never stale
    assert not d.from_cache and d.meta["content_sha256"] != a.meta["content_sha256"]


def test_split_is_seeded_and_deterministic(tmp_path):
    make_dir(tmp_path / "src", n=80)
    kw = dict(cache_dir=tmp_path / "cache", val_fraction=0.25)
    s0 = load_corpus(tmp_path / "src", split_seed=0, **kw).meta["val_doc_names"]
    s0b = load_corpus(tmp_path / "src", split_seed=0, rebuild=True, **kw).meta["val_doc_names"]
    s7 = load_corpus(tmp_path / "src", split_seed=7, **kw).meta["val_doc_names"]
    assert s0 == s0b and s0 != s7
    # seed 0 is the reference rule: first 64 bits of sha256(text)
    assert split_hash("abc") == int.from_bytes(hashlib.sha256(b"abc").digest()[:8], "big")
    assert split_hash("abc", 3) == int.from_bytes(hashlib.sha256(b"drmlab-split:3:abc").digest()[:8], "big")


def _brute_force(train: bytes, val: bytes, w=512, s=256):
    th = {hashlib.sha256(train[i : i + w]).digest() for i in range(0, len(train) - w + 1, s)}
    grid = sum(hashlib.sha256(val[i : i + w]).digest() in th for i in range(0, len(val) - w + 1, s))
    anyoff = [i for i in range(len(val) - w + 1) if hashlib.sha256(val[i : i + w]).digest() in th]
    return grid, anyoff


def test_audit_agrees_with_sha256_brute_force():
    rng = random.Random(1)
    shared = bytes(rng.randrange(256) for _ in range(1500))
    train = bytes(rng.randrange(256) for _ in range(3000)) + shared + bytes(rng.randrange(256) for _ in range(2000))
    # one copy on the grid (same offset mod 256), one shifted by 37 bytes
    val = (
        bytes(rng.randrange(256) for _ in range(3000 % 256 + 512))
        + shared
        + bytes(rng.randrange(4) for _ in range(1037))
        + shared
    )
    res = audit_streams(train, val)
    grid, anyoff = _brute_force(train, val)
    assert res.overlaps == grid > 0
    assert res.overlaps_any_offset == len(anyoff) > grid
    assert res.matched_offsets.tolist() == anyoff
    assert res.train_windows == len(range(0, len(train) - 511, 256))
    clean = audit_streams(train, bytes(rng.randrange(256) for _ in range(5000)))
    assert (clean.overlaps, clean.overlaps_any_offset) == (0, 0)
    assert audit_streams(b"short", val).train_windows == 0


def test_documents_touched():
    starts, ends = np.array([0, 100, 1000]), np.array([98, 998, 1600])
    assert documents_touched(np.array([0]), starts, ends, 512) == {0, 1}
    assert documents_touched(np.array([200]), starts, ends, 512) == {1}
    assert documents_touched(np.array([998, 1100]), starts, ends, 512) == {2}
    assert documents_touched(np.array([], dtype=np.int64), starts, ends) == set()


def _doc_in_split(rng, want_val, val_fraction, body):
    while True:
        t = f"# {rng.random()}\n" + body
        if is_validation(t, val_fraction, 0) == want_val:
            return t


def test_contamination_is_moved_to_train_or_raised(tmp_path):
    rng = random.Random(5)
    src = tmp_path / "src"
    make_dir(src, n=40, seed=5)
    passage = _text(rng, 400)  # ~3 kB shared verbatim by a train and a validation document
    (src / "x_train.txt").write_text(_doc_in_split(rng, False, 0.2, _text(rng, 30) + passage))
    (src / "x_val.txt").write_text(_doc_in_split(rng, True, 0.2, passage + _text(rng, 10)))
    c = load_corpus(src, cache_dir=tmp_path / "cache", val_fraction=0.2)
    a = c.meta["audit"]
    assert a["before"]["overlaps_any_offset"] > 0
    assert a["moved_to_train"] == ["x_val.txt"] and "x_val.txt" not in c.meta["val_doc_names"]
    assert (a["overlaps"], a["overlaps_any_offset"], a["passed"]) == (0, 0, True)
    with pytest.raises(ValueError, match=r"contamination audit .* failed.*x_val\.txt"):
        load_corpus(src, cache_dir=tmp_path / "cache", val_fraction=0.2, on_overlap="raise")


def test_single_file_splits_into_paragraphs_and_glob(tmp_path):
    rng = random.Random(2)
    paras = [_text(rng, rng.randrange(5, 40)).strip("\n") for _ in range(60)]
    f = tmp_path / "book.txt"
    f.write_text("\n\n".join(paras[:30]) + "\n \n\n" + "\n\n".join(paras[30:]) + "\n")
    c = load_corpus(f, cache_dir=tmp_path / "cache", val_fraction=0.2)
    assert c.meta["documents"] == "paragraph" and c.meta["n_docs"] == 60
    assert c.meta["val_doc_names"][0].startswith("book.txt#")
    joined = sorted(bytes(c.train).decode().split("\n\n") + bytes(c.val).decode().split("\n\n"))
    assert joined == sorted(paras)
    with pytest.raises(ValueError, match="too few to split"):
        load_corpus(f, cache_dir=tmp_path / "cache", documents="file")
    make_dir(tmp_path / "g" / "sub", n=30)
    (tmp_path / "g" / "skip.md").write_text("not matched")
    c = load_corpus(str(tmp_path / "g" / "**" / "*.txt"), cache_dir=tmp_path / "cache", val_fraction=0.3)
    assert c.meta["source_kind"] == "glob" and c.meta["n_files"] == 30


def test_duplicates_blank_and_undecodable_files(tmp_path):
    texts = make_dir(tmp_path / "src", n=30)
    (tmp_path / "src" / "copy.txt").write_text(texts["d005.txt"])
    (tmp_path / "src" / "blank.txt").write_text("  \n\n")
    (tmp_path / "src" / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "src" / "image.bin").write_bytes(b"\x89PNG\x00\x00")
    (tmp_path / "src" / ".hidden").write_text("ignored")
    m = load_corpus(tmp_path / "src", cache_dir=tmp_path / "cache", val_fraction=0.3).meta
    assert m["n_skipped_undecodable"] == 2 and m["skipped_files"] == ["image.bin", "latin1.txt"]
    assert m["n_files"] == 32 and m["n_blank_dropped"] == 1 and m["n_duplicates_removed"] == 1
    assert m["n_docs"] == 31 and m["train_docs"] + m["val_docs"] == 30


def test_bad_input_errors(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="not an existing file"):
        load_corpus(tmp_path / "missing.txt", cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="matches no files"):
        load_corpus(str(tmp_path / "*.nothing"), cache_dir=cache)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(tmp_path / "empty.txt", cache_dir=cache)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("naïve café\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text \(byte 0xef at offset 2\)"):
        load_corpus(bad, cache_dir=cache)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ValueError, match="contains no files"):
        load_corpus(tmp_path / "emptydir", cache_dir=cache)
    (tmp_path / "bins").mkdir()
    (tmp_path / "bins" / "a.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="1 skipped as not UTF-8"):
        load_corpus(tmp_path / "bins", cache_dir=cache)
    make_dir(tmp_path / "src", n=10)
    for vf in (0, 1, 1.5, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="val_fraction"):
            load_corpus(tmp_path / "src", cache_dir=cache, val_fraction=vf)
    with pytest.raises(ValueError, match="split_seed"):
        load_corpus(tmp_path / "src", cache_dir=cache, split_seed=-1)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_corpus(tmp_path / "src", cache_dir=cache, tokenizer="words")
    with pytest.raises(ValueError, match="documents"):
        load_corpus(tmp_path / "src", cache_dir=cache, documents="lines")
    with pytest.raises(ValueError, match="on_overlap"):
        load_corpus(tmp_path / "src", cache_dir=cache, on_overlap="ignore")
    with pytest.raises(ValueError, match="validation split .* is empty"):
        load_corpus(tmp_path / "src", cache_dir=cache, val_fraction=1e-9)
    with pytest.raises(ValueError, match="source must be"):
        load_corpus(42, cache_dir=cache)
    assert not list(cache.glob("*/manifest.json"))  # nothing half-built was cached


class _FakeDataset:
    def __init__(self, rows):
        self._rows = rows
        self.column_names = ["id", "text"]
        self._fingerprint = "fake-fingerprint"

    def __getitem__(self, column):
        return [r[column] for r in self._rows]


def test_hf_source_without_datasets_or_network(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ImportError, match=r"drmlab\[datasets\]"):
        load_corpus("hf:some/corpus", cache_dir=tmp_path)

    rng = random.Random(3)
    fake = types.ModuleType("datasets")
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "offline/corpus":
            raise ConnectionError("Couldn't reach the Hub")
        return _FakeDataset([{"id": i, "text": _text(rng, 30)} for i in range(50)] + [{"id": 99, "text": None}])

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ValueError, match=r"'offline/corpus'.*ConnectionError.*needs the network"):
        load_corpus("hf:offline/corpus", cache_dir=tmp_path)
    c = load_corpus("hf:some/corpus:en", cache_dir=tmp_path, val_fraction=0.3)
    assert calls[-1] == ("some/corpus", "en", "train")
    m = c.meta
    assert (m["source_kind"], m["hf_name"], m["hf_config"], m["hf_column"]) == ("hf", "some/corpus", "en", "text")
    assert m["n_docs"] == 50 and m["n_skipped_undecodable"] == 1
    with pytest.raises(ValueError, match="names no dataset"):
        load_corpus("hf:", cache_dir=tmp_path)


def test_stdlib_corpus(tmp_path):
    files = [name for name, _ in stdlib_files()]
    assert files == sorted(files) and "os.py" in files
    assert not [n for n in files if {"test", "tests", "idle_test", "site-packages", "__pycache__"} & set(n.split("/"))]
    c = load_corpus(cache_dir=tmp_path)
    m = c.meta
    assert (m["source"], m["source_kind"], m["python_version"]) == ("stdlib", "stdlib", platform.python_version())
    assert m["n_files"] == len(files) > 100
    assert m["content_sha256"] == read_source("stdlib").content_sha256
    assert m["val_bytes"] > 100_000 and m["train_bytes"] > 10 * m["val_bytes"] // 2
    assert m["train_tokens"] == len(c.train) == m["train_bytes"] and c.train.dtype == np.uint8
    assert m["audit"]["passed"] and m["audit"]["overlaps_any_offset"] == 0
    warm = load_corpus(cache_dir=tmp_path)
    assert warm.from_cache and warm.meta["content_sha256"] == m["content_sha256"]
    assert bytes(warm.val[:64]) == bytes(c.val[:64])


def test_gpt2_corpus_decodes_to_the_stream(tmp_path):
    d = find_gpt2_dir()
    if d is None:
        pytest.skip("GPT-2 files not available")
    make_dir(tmp_path / "src", n=30)
    tok = get_tokenizer("gpt2", gpt2_dir=d)
    c = load_corpus(tmp_path / "src", tokenizer=tok, cache_dir=tmp_path / "cache", val_fraction=0.3)
    by = load_corpus(tmp_path / "src", cache_dir=tmp_path / "cache", val_fraction=0.3)
    assert c.train.dtype == np.uint16 and c.vocab_size == 50257 and c.meta["tokenizer"] == "gpt2"
    assert tok.decode(c.train.tolist()).encode() == bytes(by.train)
    assert c.meta["val_bytes"] == by.meta["val_bytes"] and c.meta["val_tokens"] < c.meta["val_bytes"]
    assert c.cache_dir != by.cache_dir
