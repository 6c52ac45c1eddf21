"""A finished micro run made once per session by ``drmlab train`` (SSM_CONTROL, 2k tokens, 8 steps, a checkpoint
every 2 steps) and copied for each test that damages it or writes into it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runs import CORPUS, train_argv


@pytest.fixture(scope="session")
def finished_run_source(tmp_path_factory) -> tuple[Path, Path]:
    """(a finished run, its corpus), made once; copy it before changing it (:func:`finished_run`)."""
    from drmlab.cli import main

    root = tmp_path_factory.mktemp("finished")
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS)
    run = root / "run"
    assert main(train_argv(run, corpus, "--set", "checkpoint_every=512")) == 0
    return run, corpus


@pytest.fixture
def finished_run(finished_run_source, tmp_path) -> tuple[Path, Path]:
    """(a copy of the finished run in this test's folder, the corpus)."""
    source, corpus = finished_run_source
    run = tmp_path / "run"
    shutil.copytree(source, run)
    return run, corpus
