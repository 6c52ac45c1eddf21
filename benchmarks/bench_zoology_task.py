"""Benchmark of the Zoology MQAR generator (drmlab.experiments.mqar.zoology.generate; docs/mqar.md
section 10.2) against the memory floor and a per-example loop, in one run.

    python benchmarks/bench_zoology_task.py [--n 100000 --repeats 3 --loop-rows 1000]

Prints, for each of the protocol's settings (64, 4), (128, 8), (256, 16), (512, 64), the median
time of ``generate(L, kv, n)`` in int64 and in int16 (the study keeps int16), and as ratios:

* to the **fill floor**: ``np.full`` of the two [n, L] output arrays in the same dtype, the least
  any generator must spend writing its output (a ratio near 1 means the draws cost little beside it);
* to a **per-example loop**: numpy's weighted ``choice`` without replacement per example for the
  keys, values and query slots (the way a straightforward generator -- Zoology's own -- draws
  them), timed on ``--loop-rows`` rows and scaled to ``n``.

The target is ``generate(512, 64, 100_000)`` under 10 s; the line for it says PASS or
FAIL. Repeats run round-robin (one of each per round) so drift in machine load affects them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from drmlab.experiments.mqar import zoology as zm

TARGET_SECONDS = 10.0


def loop_generate(seq_len: int, kv: int, n: int, seed: int) -> np.ndarray:
    """The per-example reference: the same draws, one example at a time with ``Generator.choice``."""
    rng = np.random.default_rng(seed)
    half = zm.VOCAB_SIZE // 2
    space = (seq_len - 2 * kv) // 2
    p = zm.slot_weights(space)
    out = np.zeros((n, seq_len), dtype=np.int64)
    for i in range(n):
        keys = rng.choice(np.arange(1, half), size=kv, replace=False)
        values = rng.choice(np.arange(half, zm.VOCAB_SIZE), size=kv, replace=False)
        slots = rng.choice(space, size=kv, replace=False, p=p)
        out[i, 0 : 2 * kv : 2], out[i, 1 : 2 * kv : 2] = keys, values
        out[i, 2 * kv + 2 * slots] = keys
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop-rows", type=int, default=1000)
    args = parser.parse_args()
    print(f"Zoology MQAR generator, n = {args.n:,} examples, medians of {args.repeats} (numpy {np.__version__})")
    print(
        f"{'L':>4} {'kv':>3} {'int64 s':>8} {'int16 s':>8} {'fill s':>7} {'/fill':>6} {'loop s (scaled)':>16} "
        f"{'loop/ours':>9}"
    )
    for seq_len, kv in zm.SETTINGS:
        times = {"int64": [], "int16": [], "fill": []}
        for _ in range(args.repeats):
            times["int64"].append(timed(lambda: zm.generate(seq_len, kv, args.n, 0)))
            times["int16"].append(timed(lambda: zm.generate(seq_len, kv, args.n, 0, dtype=torch.int16)))
            times["fill"].append(
                timed(
                    lambda: (
                        np.full((args.n, seq_len), 0, dtype=np.int64),
                        np.full((args.n, seq_len), -100, dtype=np.int64),
                    )
                )
            )
        ours, small, fill = (statistics.median(times[k]) for k in ("int64", "int16", "fill"))
        loop = timed(lambda: loop_generate(seq_len, kv, args.loop_rows, 0)) * args.n / args.loop_rows
        print(
            f"{seq_len:>4} {kv:>3} {ours:>8.2f} {small:>8.2f} {fill:>7.2f} {ours / fill:>6.1f} {loop:>16.1f} "
            f"{loop / ours:>9.0f}"
        )
        if (seq_len, kv) == (512, 64) and args.n == 100_000:
            verdict = "PASS" if ours < TARGET_SECONDS else "FAIL"
            print(f"target: generate(512, 64, 100,000) in {ours:.2f} s (int64) < {TARGET_SECONDS:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
