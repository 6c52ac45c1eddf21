"""The fast setting (``drmlab.training.fast``, ``drmlab train --fast``): what it stands for on a device with and
without bf16 matrix units, the persistent compile cache, the first-lines hint, and the flag on every verb
that trains."""

import argparse

import pytest
import torch

from drmlab.cli import build_parser, common
from drmlab.training import fast


@pytest.fixture
def cpu_flags(monkeypatch):
    def set_flags(flags):
        monkeypatch.setattr(fast, "_cpu_flags", lambda: set(flags))

    return set_flags


def test_bf16_on_a_cpu_with_bf16_matrix_units(cpu_flags):
    cpu_flags({"avx512f", "amx_bf16"})
    assert fast.bf16_unavailable(torch.device("cpu")) is None
    assert fast.fast_settings(torch.device("cpu")) == (
        {"bf16": True, "bf16_memory_products": True, "compile": True},
        None,
    )


def test_float32_on_a_cpu_without_them_said_in_one_line(cpu_flags):
    cpu_flags({"avx2", "fma"})
    settings, note = fast.fast_settings(torch.device("cpu"))
    assert settings == {"bf16": False, "compile": True}
    assert "no bf16 matrix units" in note and "\n" not in note


def test_apply_fast_keeps_what_the_user_gave(cpu_flags, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path / "cache"))
    cpu_flags({"avx512_bf16"})
    args = argparse.Namespace(fast=True, bf16=None, compile=None, device="cpu")
    common.apply_fast(args)
    assert (args.bf16, args.bf16_memory_products, args.compile) == (True, True, True)
    assert capsys.readouterr().err == ""
    args = argparse.Namespace(fast=True, bf16=False, compile=None, device="cpu")  # a value already given stays
    common.apply_fast(args)
    assert (args.bf16, args.bf16_memory_products, args.compile) == (False, False, True)
    # a resumed run keeps the memory setting it was trained with (its config.json's, absent: off)
    resumed = argparse.Namespace(fast=True, bf16=None, compile=None, device="cpu", resume=True)
    common.apply_fast(resumed)
    assert (resumed.bf16, getattr(resumed, "bf16_memory_products", None)) == (True, None)
    cpu_flags({"avx2"})
    args = argparse.Namespace(fast=True, bf16=None, compile=None, device="cpu")
    common.apply_fast(args)
    assert (args.bf16, args.bf16_memory_products, args.compile) == (False, False, True)
    assert capsys.readouterr().err.count("\n") == 1
    untouched = argparse.Namespace(fast=None, bf16=None, compile=None, device="cpu")
    common.apply_fast(untouched)
    assert (untouched.bf16, untouched.compile) == (None, None)


def test_the_compile_cache_moves_to_drmlab_s_cache_unless_chosen(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path / "cache"))
    folder = fast.use_persistent_compile_cache()
    assert folder == tmp_path / "cache" / "inductor" and folder.is_dir()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert fast.use_persistent_compile_cache() == tmp_path / "mine"


def test_the_hint_only_for_long_runs_of_models_it_helped(cpu_flags, monkeypatch):
    cpu_flags({"amx_bf16"})
    monkeypatch.setattr(fast, "FAST_FACTORS", {"J": 1.8, "GPT2": 1.1})
    cpu = torch.device("cpu")
    line = fast.suggestion("J", cpu, steps=5000)
    assert "1.8x" in line and "--fast" in line and "\n" not in line
    assert fast.suggestion("J", cpu, steps=10) is None  # too short to repay the compile
    assert fast.suggestion("GPT2", cpu, steps=5000) is None  # not much faster
    assert fast.suggestion("NOT_MEASURED", cpu, steps=5000) is None
    cpu_flags({"avx2"})
    assert fast.suggestion("J", cpu, steps=5000) is None  # no bf16 here: not the measured setting


@pytest.mark.parametrize("verb", ["train", "ablate", "loop-study"])
def test_every_training_verb_takes_fast(verb):
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "--fast" in subparsers.choices[verb].format_help()
