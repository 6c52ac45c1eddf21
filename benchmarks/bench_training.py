"""Training and rescoring throughput of registered models at a preset (the trainer's own loop).

    python benchmarks/bench_training.py --models GPT2,J --preset tiny --steps 4 --threads 2

Each model trains ``--steps`` + 1 optimizer steps on a fixed random byte stream, then rescores
``--eval-tokens`` targets of it. Two rates are printed for each:

* tok/s wall: training, the median of the trainer's per-step rates over every step but the first
  (which pays the first-call costs); rescoring, targets scored over the wall time of the call.
* tok/s per thread: tokens over the CPU time of this process (``time.process_time``, which adds
  up the time of all its threads) across the whole call -- tokens per thread-second. With the
  threads busy, times ``--threads`` it estimates the rate on an idle machine; other jobs on a
  shared machine disturb it less than the wall rate (though a thread spinning while it waits for
  a descheduled peer still adds CPU time). For training it covers the whole ``train()`` call,
  setup and first step included.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from drmlab.evaluation import rescore
from drmlab.models import build_model
from drmlab.training import resolve_train_config, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="GPT2,J")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-tokens", type=int, default=32_768)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    stream = rng.integers(32, 127, 2_000_000).astype(np.uint8)
    for name in args.models.split(","):
        step_tokens = resolve_train_config(args.preset).tokens_per_step
        cfg = resolve_train_config(args.preset, tokens=step_tokens * (args.steps + 1), eval_every=0)
        model = build_model(name, args.preset)
        wall, cpu = time.perf_counter(), time.process_time()
        summary = train(model, stream, None, cfg, quiet=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows = [r for r in summary["rows"] if r["kind"] == "train"][1:]  # first step warms up
        step_rate = np.median([r["tok_s"] for r in rows])
        total = cfg.tokens_per_step * (args.steps + 1)
        print(
            f"{name:12s} {args.preset} params {summary['params']:>10,}  train: median {step_rate:8,.0f} tok/s wall, "
            f"{total / cpu:8,.0f} tok/s per thread ({args.threads} threads)"
        )
        wall, cpu = time.perf_counter(), time.process_time()
        scored = rescore(model, stream, cfg.seq_len, batch_size=cfg.eval_batch_size, max_targets=args.eval_tokens)[
            "targets"
        ]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{'':12s} rescoring: {scored / wall:8,.0f} tok/s wall, {scored / cpu:8,.0f} tok/s per thread")


if __name__ == "__main__":
    main()
