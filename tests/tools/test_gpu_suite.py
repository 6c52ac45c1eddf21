"""benchmarks/gpu_suite.py runs every section at tiny sizes on the CPU (--smoke) and says so without CUDA.

The suite is run once on a GPU by hand; this test proves the script itself: every section runs in its
worker process, every item of every section is measured (or is a backend that cannot run here, such as
flash-linear-attention without CUDA), the Triton kernels go through the interpreter, the errors it
records against float64 are small, and the JSON and the markdown are written.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.py"
SECTIONS = {"environment", "scan", "selective_scan", "training_eager", "training_compiled", "decode"}
MODELS = {"J", "J_NO_DIRECTION", "SSM_CONTROL", "GPT2", "MAMBA", "RESOLVENT"}


def _run(out: Path, *flags: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--out", str(out), *flags], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "gpu_suite.md").is_file()
    return json.loads((out / "gpu_suite.json").read_text())


def test_smoke_runs_every_section(tmp_path):
    report = _run(tmp_path, "--smoke")
    assert report["smoke"] is True and set(report["sections"]) == SECTIONS
    for name, section in report["sections"].items():
        assert section["status"] == "ok", (name, section.get("error"))
        assert section["items"], name
        for item in section["items"]:
            assert item["status"] in ("ok", "unavailable"), (name, item)
    items = {name: {item["name"]: item for item in section["items"]} for name, section in report["sections"].items()}
    assert items["environment"]["environment"]["torch"] == torch.__version__
    for backend in ("torch", "triton"):  # triton through its interpreter
        for dtype in ("float32", "complex64"):
            row = items["scan"][f"linear_scan {backend} {dtype}"]
            assert row["status"] == "ok" and row["fwd_err"] < 1e-5 and row["grad_err"] < 1e-5, row
            assert row["fwd_x_floor"] > 0 and row["fwd_bwd_x_floor"] > 0
    assert items["scan"]["linear_scan triton bfloat16"]["status"] == "ok"
    for backend in ("torch", "triton"):
        row = items["selective_scan"][f"selective_scan {backend}"]
        assert (
            row["status"] == "ok" and row["fwd_err"] < 1e-5 and row["grad_err"] < 1e-4 and row["fwd_bwd_x_torch"] > 0
        ), row
    for kind in ("training_eager", "training_compiled"):
        for row in items[kind].values():
            assert math.isfinite(row["loss"]) and row["tok_s"] > 0 and row["bf16"] is True, row
    assert {row["model"] for row in items["training_eager"].values()} == MODELS
    compiled = list(items["training_compiled"].values())
    assert len(compiled) == 1 and compiled[0]["x_eager"] > 0
    decode = items["decode"].values()
    assert {(row["model"], row["context"]) for row in decode} == {
        (m, c) for m in MODELS - {"J_NO_DIRECTION"} for c in (16, 40)
    }
    assert all(row["ms_per_token"] > 0 for row in decode)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA this would run the whole suite")
def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    report = _run(tmp_path)
    assert report["cuda"] is False and "no CUDA" in report["message"]
    assert set(report["sections"]) == {"environment"}
    assert "no CUDA" in (tmp_path / "gpu_suite.md").read_text()


def _device_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_check", SUITE.parent / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_check_fits_one_device_command_and_names_real_cuda_tests():
    """benchmarks/device_check.py: its steps' limits fit the device tool's 10-minute command, and the
    CUDA-only tests it runs by node id exist and skip without CUDA."""
    import ast

    check = _device_check()
    assert sum(limit for _, limit in check.plan(150)) <= 600
    for node in check.CUDA_TESTS:
        path, name = node.split("::")
        tree = ast.parse((SUITE.parents[1] / path).read_text())
        tests = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert name in tests, node
        assert "cuda" in ast.unparse(tests[name].decorator_list).lower(), f"{node} does not skip without CUDA"
    assert check._tokens("1M") == 1_000_000 and check._tokens("64k") == 64_000 and check._tokens("5000") == 5000
    args = check.train_args("cuda", "1M")
    assert args[args.index("--device") + 1] == "cuda" and "--bf16" in args and "checkpoint_every=200000" in args
