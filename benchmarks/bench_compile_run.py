"""Whole ``drmlab train`` runs eager against compiled, the compile included (docs/architecture.md, "Compiled
models"): what ``--compile auto`` predicts a run saves, checked against what the run's wall clock says.

    python benchmarks/bench_compile_run.py --model J --preset tiny --tokens 5005312 [--bf16] [--json F]

Three runs of the same command, one after another, one process of one thread each (``--procs 1 --threads 1``),
the final rescoring cut to ``--eval-tokens``: ``--compile off``; ``--compile on`` with a fresh Inductor cache
(the cold compile); ``--compile on`` again with that cache (the warm compile, as a second run on a machine
gets it). Printed per run: the wall seconds of the whole command (start-up and rescoring included), its training
seconds, its ``compile`` row (compile seconds, eager and compiled step times) and, from those, what
``--compile auto`` would have predicted the compiled run saves over the eager one
(:func:`drmlab.training.compile_choice.choose`'s arithmetic); then the saving each compiled run really made.
Run it on an otherwise quiet machine (``tools/pause_studies.py stop`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drmlab.devices import cpu_name
from drmlab.experiments.results import dumps, provenance


def train(out: Path, args, compile_: str, cache: str) -> dict:
    """One whole run: its wall seconds, summary and compile row."""
    argv = [sys.executable, "-m", "drmlab", "train", "--model", args.model, "--preset", args.preset]
    argv += ["--tokens", str(args.tokens), "--procs", "1", "--threads", "1", "--quiet", "--out", str(out)]
    argv += ["--eval-tokens", str(args.eval_tokens), "--compile", compile_, "--overwrite"]
    argv += ["--bf16"] if args.bf16 else []
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench_compile_run: {' '.join(argv[3:])} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    compile_row = next((r for r in rows if r["kind"] == "compile"), None)
    return {
        "steps": json.loads((out / "config.json").read_text())["derived"]["total_steps"],
        "wall_seconds": wall,
        "train_seconds": summary.get("train_seconds"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "val_bpb": summary.get("val_bpb"),
        "compile": None
        if compile_row is None
        else {k: compile_row[k] for k in ("compile_seconds", "eager_ms", "compiled_ms", "cache")},
    }


def step_seconds(out: Path) -> dict:
    """The first three steps' seconds and the median of the rest (metrics.jsonl's cumulative elapsed)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed"] for r in rows if r["kind"] == "train"]
    steps = [b - a for a, b in zip([0.0] + elapsed, elapsed)]
    rest = sorted(steps[3:])
    return {"first": steps[:3], "median_after": rest[len(rest) // 2] if rest else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="J")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--tokens", type=int, default=5_005_312)
    parser.add_argument("--eval-tokens", type=int, default=100_000)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--machine", default="not stated")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-compile-run-") as tmp:
        cache = str(Path(tmp) / "inductor")
        for name, compile_ in (("eager", "off"), ("compiled_cold", "on"), ("compiled_warm", "on")):
            results[name] = r = train(Path(tmp) / name, args, compile_, cache)
            r["step_seconds"] = step_seconds(Path(tmp) / name)
            print(
                f"{name:14s} {r['wall_seconds']:7.1f} s whole run, {r['train_seconds']:7.1f} s training, "
                f"{r['tokens_per_s']:9,.0f} tok/s"
                + ("" if r["compile"] is None else f", compile row {json.dumps(r['compile'])}"),
                flush=True,
            )
    eager = results["eager"]
    for name in ("compiled_cold", "compiled_warm"):
        r = results[name]
        row = r["compile"]
        predicted = None
        if row and row["eager_ms"] and row["compiled_ms"]:
            ratio = row["eager_ms"] / row["compiled_ms"]
            predicted = r["steps"] * row["eager_ms"] / 1e3 * (1 - 1 / ratio) - row["compile_seconds"]
        r["saved_seconds"] = eager["wall_seconds"] - r["wall_seconds"]
        r["predicted_net_saving_seconds"] = predicted
        shown = "n/a" if predicted is None else f"{predicted:+.1f} s"
        print(f"{name}: saved {r['saved_seconds']:+.1f} s of the eager run's whole time; auto's arithmetic: {shown}")
    if args.json is not None:
        settings = {k: getattr(args, k) for k in ("model", "preset", "tokens", "eval_tokens", "bf16")}
        record = {
            "title": f"Whole drmlab train runs of {args.model} at {args.preset}, {args.tokens:,} tokens, eager against "
            "compiled from a cold and a warm Inductor cache, the compile included",
            "provenance": {**provenance(settings), "machine": args.machine, "cpu": cpu_name()},
            "units": "seconds (wall, whole command; training), tokens per second, bits/byte",
            "runs": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dumps(record) + "\n")


if __name__ == "__main__":
    main()
