"""benchmarks/bench_reference.py without the reference: it refuses in one line, and its record names
the reference by commit and never by where its checkout lies."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from tool_scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "bench_reference.py"


def _module():
    return load_script(SCRIPT, "drmlab_bench_reference")


def test_a_missing_reference_is_one_line_and_status_two(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--reference", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_the_record_holds_settings_and_numbers_and_no_path(tmp_path):
    bench = _module()
    checkout = tmp_path / "checkout-folder"
    checkout.mkdir()
    args = argparse.Namespace(
        presets="tiny", variants="J", rounds=3, threads=1, step=1, json=tmp_path / "r.json", machine="a box"
    )
    rates = {"ours": 10.0, "ref": 5.0}
    presets = [
        {
            "preset": "tiny",
            "batch": 8,
            "seq_len": 256,
            "variants": {"J": {"params": 1, "wall_tokens_per_s": rates, "cpu_tokens_per_s": rates, "f64_gap": 1e-15}},
        }
    ]
    bench.write_record(args, checkout, presets)
    text = args.json.read_text()
    record = json.loads(text)
    assert str(tmp_path) not in text and "checkout-folder" not in text
    assert record["provenance"]["command"].startswith("python benchmarks/bench_reference.py --reference REFERENCE")
    assert record["provenance"]["settings"]["reference"].endswith("at an unknown commit")
    assert record["provenance"]["machine"] == "a box" and record["presets"] == presets
