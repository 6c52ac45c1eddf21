"""Document starts in the tokenized corpus (drmlab.data.documents, load_corpus): each offset begins a
document with its leading separator, although the separator also occurs inside documents; a straddling
token stays with the document before; a cache written before the starts were recorded loads without them
and is rebuilt in place, with the same tokens, when they are needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drmlab.data import load_corpus
from drmlab.data.corpus import SEPARATOR
from drmlab.data.documents import document_starts


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """40 files, each with blank lines inside (the separator occurs within documents)."""
    root = tmp_path_factory.mktemp("docs")
    for i in range(40):
        body = "\n\n".join(f"file {i} part {k}: {'word ' * (i % 7 + k)}" for k in range(3))
        (root / f"doc{i:02d}.txt").write_text(f"# title {i}\n\n{body}\n")
    return root


def _pieces(stream: np.ndarray, starts: np.ndarray) -> list[str]:
    cuts = [int(s) for s in starts] + [len(stream)]
    return [bytes(np.asarray(stream[a:b])).decode("utf-8") for a, b in zip(cuts, cuts[1:])]


def test_each_start_begins_a_document_with_its_separator(folder, tmp_path):
    corpus = load_corpus(str(folder), cache_dir=tmp_path, val_fraction=0.3)
    texts = {p.read_text() for p in folder.iterdir()}
    for split in ("train", "val"):
        stream, starts = getattr(corpus, split), corpus.doc_starts[split]
        assert starts[0] == 0 and (np.diff(starts.astype(np.int64)) > 0).all()
        pieces = _pieces(stream, starts)
        assert len(pieces) == corpus.meta[f"{split}_docs"]
        assert pieces[0] in texts and not pieces[0].startswith(SEPARATOR)
        assert all(p.startswith(SEPARATOR) and p[len(SEPARATOR) :] in texts for p in pieces[1:])
        assert sum(SEPARATOR in p[len(SEPARATOR) :] for p in pieces) == len(pieces)  # "\n\n" inside each one


def test_a_straddling_token_stays_with_the_document_before():
    # documents of 3 and 2 bytes, separator 2 bytes: the second starts (with its separator) at byte 3
    assert document_starts([3, 2], 2, np.array([1] * 7)).tolist() == [0, 3]  # bytes: one token per byte
    assert document_starts([3, 2], 2, np.array([2, 2, 3])).tolist() == [0, 2]  # token 1 spans bytes 2-3
    assert document_starts([3, 2], 2, np.array([3, 4])).tolist() == [0, 1]
    assert document_starts([3, 2], 2, np.array([2, 2])) is None  # the tokens' bytes do not add up


def test_an_older_cache_loads_without_starts_and_is_rebuilt_when_they_are_needed(folder, tmp_path):
    fresh = load_corpus(str(folder), cache_dir=tmp_path, val_fraction=0.3)
    manifest_path = fresh.cache_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    shards = manifest["shards"]
    del manifest["documents"]  # as written before the starts were recorded
    manifest_path.write_text(json.dumps(manifest))
    old = load_corpus(str(folder), cache_dir=tmp_path, val_fraction=0.3)
    assert old.from_cache and old.doc_starts is None
    rebuilt = load_corpus(str(folder), cache_dir=tmp_path, val_fraction=0.3, need_doc_starts=True)
    assert not rebuilt.from_cache and rebuilt.cache_dir == fresh.cache_dir
    assert json.loads(manifest_path.read_text())["shards"] == shards  # the same token shards
    for split in ("train", "val"):
        assert np.array_equal(rebuilt.doc_starts[split], fresh.doc_starts[split])
    again = load_corpus(str(folder), cache_dir=tmp_path, val_fraction=0.3, need_doc_starts=True)
    assert again.from_cache and again.doc_starts is not None
