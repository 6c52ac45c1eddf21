"""One run on every core: ``drmlab train --procs N`` (N one-thread processes, data-parallel) against one process
at N threads and one process at one thread, in one run (docs/guide.md, "Every core").

    python benchmarks/bench_procs.py [--models J,SSM_CONTROL,MAMBA,GPT2] [--presets tiny,small] [--json F]

Each setting is a fresh ``drmlab train`` of ``--steps`` optimizer steps on the embedded corpus (no sampled
evaluation, the final rescoring cut to 1k tokens). The rate is the steady one, from metrics.jsonl: the tokens
trained after the first ``--skip`` steps over the time they took (start-up, the first steps' allocations and
the final evaluation left out). Printed per model and preset: the three rates and the ratios against one
thread. The target on a 2-core machine: two processes at >= 1.7x one thread. Run it on an otherwise quiet
machine (``tools/pause_studies.py stop`` first): every other busy process shows up in the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from drmlab.devices import cpu_name

DEFAULT_STEPS = {"micro": 40, "tiny": 12, "small": 5}


def steady_rate(run: Path, skip: int) -> float:
    """Tokens per second over the train rows after the first ``skip`` steps (the rows' cumulative clocks)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "train"]
    first, last = rows[skip - 1], rows[-1]
    if last["elapsed"] <= first["elapsed"]:
        raise SystemExit(f"bench_procs: {run} has too few steps after {skip} to time")
    return (last["tokens"] - first["tokens"]) / (last["elapsed"] - first["elapsed"])


def train(model: str, preset: str, steps: int, out: Path, *, procs: int, threads: int | None) -> None:
    command = [sys.executable, "-m", "drmlab", "train", "--model", model, "--preset", preset, "--steps", str(steps),
               "--eval-every", "0", "--eval-tokens", "1k", "--quiet", "--out", str(out), "--procs", str(procs)]  # fmt: skip
    if threads is not None:
        command += ["--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_procs: {' '.join(command[3:])} failed ({done.returncode}): {done.stderr[-800:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="J,SSM_CONTROL,MAMBA,GPT2")
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--procs", type=int, default=None, help="processes (default: the cores)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 12 at tiny, 5 at small)")
    parser.add_argument("--skip", type=int, default=2, help="steps left out of the rate (default 2)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = args.procs or cores
    settings = {"one thread": (1, 1), f"{n} threads": (1, n), f"{n} processes": (n, None)}
    results = []
    print(f"{cpu_name()}, {cores} cores; steady tokens/s after {args.skip} steps", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            steps = args.steps or DEFAULT_STEPS.get(preset, 5)
            for model in args.models.split(","):
                rates = {}
                for name, (procs, threads) in settings.items():
                    out = Path(tmp) / f"{model}-{preset}-{procs}-{threads}"
                    train(model, preset, steps, out, procs=procs, threads=threads)
                    rates[name] = steady_rate(out, args.skip)
                base = rates["one thread"]
                results.append({"model": model, "preset": preset, "steps": steps, "tokens_per_s": rates,
                                "vs_one_thread": {k: v / base for k, v in rates.items()}})  # fmt: skip
                print(
                    f"{model:12s} {preset:6s} "
                    + "   ".join(f"{k}: {v:8,.0f} tok/s ({v / base:.2f}x)" for k, v in rates.items()),
                    flush=True,
                )
    if args.json:
        import torch

        record = {"cpu": cpu_name(), "cores": cores, "procs": n, "skip": args.skip, "torch": torch.__version__}
        Path(args.json).write_text(json.dumps({**record, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
