"""Fixtures shared by the study tests: a corpus cache per module and the `drmlab specialise` command line."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def specialise_argv(corpus_file, cache_dir):
    """``argv(base, out, *flags, eval_sequences=4, eval_tokens=1000)``: `drmlab specialise` of the run ``base``
    into ``out`` on the test corpus, seed 0, on the CPU, without periodic checkpoints, then ``flags``."""

    def argv(base, out, *flags, eval_sequences: int = 4, eval_tokens: int = 1000) -> list[str]:
        return [
            "specialise",
            *("--base", str(base), "--out", str(out), "--seed", "0"),
            *("--eval-sequences", str(eval_sequences), "--eval-tokens", str(eval_tokens)),
            *("--checkpoint-every", "0", "--device", "cpu"),
            *("--cache-dir", str(cache_dir), "--data", str(corpus_file)),
            *flags,
        ]

    return argv
