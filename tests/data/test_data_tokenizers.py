"""Tokenizers: bytes, GPT-2 from local files / the tiktoken cache, and the errors when neither exists.

The GPT-2 checks need the two GPT-2 files; they look in $DRMLAB_GPT2_DIR, then <repo>/shared/data/gpt2
and the sibling shared/data/gpt2 of the checkout, and skip when none has them. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from drmlab.data import ByteTokenizer, Tokenizer, get_tokenizer
from drmlab.data.tokenizers import _GPT2_URLS, GPT2_ENCODER_JSON, GPT2_VOCAB_BPE
from shared_data import find_gpt2_dir, find_tinyshakespeare  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_gpt2_anywhere(monkeypatch, tmp_path):
    monkeypatch.delenv("DRMLAB_GPT2_DIR", raising=False)
    monkeypatch.delenv("DRMLAB_GPT2_DOWNLOAD", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-tiktoken-cache"))


@pytest.fixture(scope="module")
def gpt2():
    d = find_gpt2_dir()
    if d is None:
        pytest.skip("GPT-2 files (encoder.json, vocab.bpe) not available")
    return get_tokenizer("gpt2", gpt2_dir=d)


def test_bytes_tokenizer_roundtrip():
    tok = get_tokenizer("bytes")
    assert isinstance(tok, Tokenizer) and isinstance(tok, ByteTokenizer)
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("bytes", 256, None)
    text = "héllo wörld ✓ 🙂\n\tend"
    ids = tok.encode(text)
    assert isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < 256 for i in ids)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    arr = tok.encode_array(text)
    assert arr.dtype == np.uint8 and arr.tolist() == ids
    assert tok.decode(np.array(ids, dtype=np.uint8)) == text


def test_bytes_decode_partial_utf8_and_bad_ids():
    tok = get_tokenizer("bytes")
    assert tok.decode([0x61, 0xE2, 0x9C]) == "a\ufffd"  # cut-off multi-byte sequence
    assert tok.decode_bytes([0x61, 0xE2, 0x9C]) == b"a\xe2\x9c"
    with pytest.raises(ValueError, match="300"):
        tok.decode([65, 300])


def test_unknown_tokenizer_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown tokenizer 'bpe'.*bytes, gpt2"):
        get_tokenizer("bpe")
    with pytest.raises(ValueError, match="tokenizer must be"):
        get_tokenizer(3)
    tok = ByteTokenizer()
    assert get_tokenizer(tok) is tok


def test_gpt2_missing_everywhere_is_a_clear_error(no_gpt2_anywhere, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        get_tokenizer("gpt2", search_paths=[tmp_path / "nope"], download=False)
    msg = str(info.value)
    assert "nope" in msg and "DRMLAB_GPT2_DIR" in msg and "tiktoken cache" in msg and "download=True" in msg


def test_gpt2_explicit_dir_or_env_without_files(no_gpt2_anywhere, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="encoder.json"):
        get_tokenizer("gpt2", gpt2_dir=tmp_path)
    monkeypatch.setenv("DRMLAB_GPT2_DIR", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="DRMLAB_GPT2_DIR"):
        get_tokenizer("gpt2", download=False)


def test_gpt2_files_with_wrong_hash_are_refused(tmp_path):
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\na b\n")
    (tmp_path / "encoder.json").write_text("{}")
    with pytest.raises(ValueError, match=r"vocab.bpe .* is not the GPT-2 file"):
        get_tokenizer("gpt2", gpt2_dir=tmp_path)


def test_gpt2_from_local_files(gpt2):
    assert (gpt2.name, gpt2.vocab_size, gpt2.eot_id) == ("gpt2", 50257, 50256)
    text = "Hello world! Ünïcödé, code: x = f(1)\n\n\tdone <|endoftext|>"
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    assert 50256 not in ids  # special-token text is ordinary text
    assert gpt2.decode_bytes(ids) == text.encode("utf-8")
    part = gpt2.encode("✓")  # a multi-byte character split over byte-level tokens
    assert b"".join(gpt2.decode_bytes([i]) for i in part) == "✓".encode()
    assert gpt2.encode("Hello world") == [15496, 995]
    arr = gpt2.encode_array(text)
    assert arr.dtype == np.uint16 and arr.tolist() == ids
    with pytest.raises(ValueError, match="50257"):
        gpt2.decode([50257])


def test_gpt2_tinyshakespeare_count_and_hf_agreement(gpt2):
    path = find_tinyshakespeare()
    if path is None:
        pytest.skip("tinyshakespeare.txt not available")
    text = path.read_text(encoding="utf-8")
    ids = gpt2.encode(text)
    assert len(ids) == 338_025
    import tokenizers as hf

    d = Path(gpt2.origin)
    ref = hf.Tokenizer(hf.models.BPE.from_file(str(d / GPT2_ENCODER_JSON), str(d / GPT2_VOCAB_BPE)))
    ref.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = hf.decoders.ByteLevel()
    sample = text[:20_000] + "\n\n  tabs\tand   spaces 123,456 — unicode ✓\n"
    assert ref.encode(sample).ids == gpt2.encode(sample)


def test_gpt2_from_tiktoken_cache_and_search_paths(gpt2, tmp_path, monkeypatch):
    src = Path(gpt2.origin)
    monkeypatch.delenv("DRMLAB_GPT2_DIR", raising=False)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    for fname, url in _GPT2_URLS.items():
        shutil.copy(src / fname, cache / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    tok = get_tokenizer("gpt2", download=False)
    assert tok.origin.startswith("tiktoken cache") and tok.encode("Hello world") == [15496, 995]
    tok = get_tokenizer("gpt2", search_paths=[tmp_path / "nope", src], download=False)
    assert tok.origin == str(src)
    monkeypatch.setenv("DRMLAB_GPT2_DIR", str(src))
    assert get_tokenizer("gpt2").origin == str(src)
