"""A Zoology MQAR training step with the head at every position against the head at the query positions
only (``logits_at``; docs/mqar.md section 10.8): forward + loss + backward, one thread, interleaved
medians in one run, reported as the ratio full / scored-only.

    PYTHONPATH=src python benchmarks/bench_scored_head.py                      # (64, 4), width 64, batch 512
    PYTHONPATH=src python benchmarks/bench_scored_head.py --models ATTENTION --batch 128 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from drmlab.experiments.mqar import zoology
from drmlab.training.trainer import targets_loss


def _step(model, inputs, targets, scored_only: bool) -> float:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss, _ = targets_loss(model, inputs, targets, step=1, scored_only=scored_only)
    loss.backward()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="ATTENTION,MAMBA,SSM_CONTROL,J_NO_DIRECTION")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64, choices=[s for s, _ in zoology.SETTINGS])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kv = dict(zoology.SETTINGS)[args.seq_len]
    x, y = zoology.generate(args.seq_len, kv, args.batch, seed=0)
    x, y = x.long(), y.long()
    rows = []
    for name in args.models.split(","):
        model, _, _ = zoology.protocol_model(name, "tiny", args.width, args.seq_len, 123)
        model.train()
        _step(model, x, y, True)  # warm-up
        full, part = [], []
        for _ in range(args.repeats):
            full.append(_step(model, x, y, False))
            part.append(_step(model, x, y, True))
        f, p = statistics.median(full), statistics.median(part)
        rows.append({"model": name, "full_s": f, "scored_only_s": p, "speedup": f / p})
    settings = {"width": args.width, "seq_len": args.seq_len, "kv": kv, "batch": args.batch, "threads": args.threads}
    if args.json:
        print(json.dumps({"settings": settings, "rows": rows}, indent=1))
        return 0
    print(f"Zoology MQAR step, {settings}: forward + loss + backward, medians of {args.repeats}")
    print(f"{'model':<16} {'full head s':>12} {'queries only s':>15} {'speed-up':>9}")
    for r in rows:
        print(f"{r['model']:<16} {r['full_s']:>12.3f} {r['scored_only_s']:>15.3f} {r['speedup']:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
