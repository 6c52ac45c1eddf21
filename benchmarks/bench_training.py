"""Training and rescoring throughput of registered models at a preset (the trainer's own loop).

    python benchmarks/bench_training.py --models GPT2,J --preset tiny --steps 4 --threads 2

Reports tokens per wall-clock second and per CPU second of this process (on a shared machine
the second, divided by the thread count, estimates the uncontended rate).
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
        cfg = resolve_train_config(args.preset, tokens=1, eval_every=0)
        cfg = resolve_train_config(args.preset, tokens=cfg.tokens_per_step * (args.steps + 1), eval_every=0)
        model = build_model(name, args.preset)
        wall, cpu = time.perf_counter(), time.process_time()
        summary = train(model, stream, None, cfg, quiet=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows = [r for r in summary["rows"] if r["kind"] == "train"][1:]  # first step warms up
        step_rate = np.median([r["tok_s"] for r in rows])
        total = cfg.tokens_per_step * (args.steps + 1)
        print(f"{name:12s} {args.preset} params {summary['params']:>10,}  train: median {step_rate:8,.0f} tok/s wall, "
              f"{total / cpu * args.threads:8,.0f} tok/s per {args.threads} CPU-s")
        wall, cpu = time.perf_counter(), time.process_time()
        rescore(model, stream, cfg.seq_len, batch_size=cfg.eval_batch_size, max_targets=args.eval_tokens)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{'':12s} rescoring: {args.eval_tokens / wall:8,.0f} tok/s wall, {args.eval_tokens / cpu * args.threads:8,.0f} tok/s per {args.threads} CPU-s")


if __name__ == "__main__":
    main()
