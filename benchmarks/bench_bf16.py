"""bf16 autocast against float32 for a training step on this CPU, measured in the same run (quoted in
docs/results-in-full.md, "bf16 on the CPU's matrix units").

    python benchmarks/bench_bf16.py [--models J,J_NO_DIRECTION,SSM_CONTROL,MAMBA] [--preset tiny] [--steps 4]

For each model: forward + loss + backward + AdamW on one batch of the preset's shape (32 x 256 at tiny),
float32 and bf16 autocast (the trainer's ``lm_loss(..., bf16=True)``; recurrences stay float32)
interleaved step by step, one thread; prints the median ms per step of each and their ratio. The quality
side (paired seeds at the protocol's 5M tokens) is docs/studies/bf16-tiny.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drmlab.models import build_model
from drmlab.presets import PRESET_DEFAULTS
from drmlab.training.trainer import lm_loss


def step_seconds(model, optimizer, window, bf16: bool) -> float:
    start = time.perf_counter()
    loss, _ = lm_loss(model, window, bf16=bf16)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="J,J_NO_DIRECTION,SSM_CONTROL,MAMBA")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    defaults = PRESET_DEFAULTS[args.preset]
    batch, seq_len = defaults["batch_size"], defaults["seq_len"]
    window = torch.randint(0, 256, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    print(f"| model ({args.preset}, {batch} x {seq_len}, 1 thread) | float32 ms/step | bf16 ms/step | speed-up |")
    print("|---|---:|---:|---:|")
    for name in args.models.split(","):
        model = build_model(name, args.preset, seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times = {False: [], True: []}
        for _ in range(args.steps + 1):  # the first of each pays the first-call costs
            for bf16 in (False, True):
                times[bf16].append(step_seconds(model, optimizer, window, bf16))
        f32, b16 = (statistics.median(times[m][1:]) for m in (False, True))
        print(f"| {name} | {f32 * 1e3:,.0f} | {b16 * 1e3:,.0f} | {f32 / b16:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
