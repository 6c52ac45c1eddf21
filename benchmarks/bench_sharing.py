"""Two ``drmlab train`` runs sharing one machine against one run alone (docs/guide.md section 3).

    python benchmarks/bench_sharing.py [--model J] [--preset tiny] [--tokens 196608]

Three settings, each once alone and then twice started together, every run a fresh ``drmlab train``
process: ``before`` (OpenMP threads spin while they wait, ``OMP_WAIT_POLICY=ACTIVE``, and ``--threads``
at the core count: torch's default, as the CLI ran before it made waiting threads sleep and trained on the
cores left), ``passive`` (waiting threads sleep, ``--threads`` at the core count) and ``default`` (the CLI
as it is now: sleeping waits and no ``--threads``, so a run that finds the cores busy takes the cores left).
Printed: the training rate of each (``tokens_per_s`` of summary.json: training time only, the final rescoring cut to
``--eval-tokens``), the threads each used (its config.json), and each concurrent run's rate as a
fraction of the solo rate of the same setting measured in this run.
The target: each of two concurrent default runs keeps at least 40% of its solo speed.
Run it on an otherwise quiet machine (every other busy process shows up in the fractions).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def train_command(model: str, preset: str, tokens: int, eval_tokens: str, out: Path, threads) -> list[str]:
    return [
        sys.executable,
        "-m",
        "drmlab",
        "train",
        "--model",
        model,
        "--preset",
        preset,
        "--tokens",
        str(tokens),
        "--eval-tokens",
        eval_tokens,
        "--quiet",
        "--out",
        str(out),
        "--procs",  # one process per run: this measures threads sharing cores (bench_procs.py measures --procs)
        "1",
    ] + ([] if threads is None else ["--threads", str(threads)])


def run_together(commands: list[list[str]], policy: str) -> list[tuple[float, int]]:
    """Start every command at once with ``OMP_WAIT_POLICY=policy``; their (training tokens/s, threads)."""
    env = dict(os.environ, OMP_WAIT_POLICY=policy)
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for cmd in commands]
    rates = []
    for cmd, proc in zip(commands, procs):
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"bench_sharing: a run failed ({proc.returncode}): {err.decode()[-500:]}")
        out = Path(cmd[cmd.index("--out") + 1])
        threads = json.loads((out / "config.json").read_text())["runtime"]["threads"]
        rates.append((json.loads((out / "summary.json").read_text())["tokens_per_s"], threads))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="J")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--tokens", type=int, default=196_608)
    parser.add_argument("--eval-tokens", default="4k")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    settings = {"before": ("ACTIVE", cores), "passive": ("PASSIVE", cores), "default": ("PASSIVE", None)}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (policy, threads) in settings.items():
            folder = Path(tmp) / name

            def command(tag, folder=folder, threads=threads):
                return train_command(args.model, args.preset, args.tokens, args.eval_tokens, folder / tag, threads)

            ((solo, solo_threads),) = run_together([command("solo")], policy)
            pair = run_together([command("pair0"), command("pair1")], policy)
            results[name] = {
                "omp_wait_policy": policy,
                "threads_flag": threads,
                "solo": {"tokens_per_s": solo, "threads": solo_threads},
                "pair": [{"tokens_per_s": r, "threads": t, "fraction_of_solo": r / solo} for r, t in pair],
            }
            print(
                f"{name:8s} solo {solo:8,.0f} tok/s ({solo_threads} thr)   two together "
                + " and ".join(f"{r:8,.0f} tok/s ({t} thr, {r / solo:.2f} of solo)" for r, t in pair),
                flush=True,
            )
    if args.json:
        record = {
            "settings": {k: getattr(args, k) for k in ("model", "preset", "tokens", "eval_tokens")},
            "cores": cores,
        }
        Path(args.json).write_text(json.dumps({**record, "results": results}, indent=1))


if __name__ == "__main__":
    main()
