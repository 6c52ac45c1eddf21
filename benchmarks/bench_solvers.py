"""DRM solver options at preset tiny: training tokens/s and distance to the sequential rollout.

Run: python benchmarks/bench_solvers.py [--preset tiny] [--rounds 3]

For J with each step mode and block solver / iteration count, in one run:
* training tokens/s (forward, backward, AdamW on random bytes), with the ratio to plain
  ``velocity`` measured in the same run (interleaved rounds, medians);
* the distance of the states before the mixer to the exact sequential rollout of the
  same step rule (bounded, as the block refiners return it), in float64 on the first
  block of a real-text batch: max |X - B(rollout)| and its mean.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from drmlab.models import build_model

SETTINGS = [
    ("velocity", None, 0),
    ("velocity", "fixed_point", 1),
    ("velocity", "fixed_point", 2),
    ("velocity", "fixed_point", 4),
    ("velocity", "anderson", 2),
    ("velocity", "anderson", 4),
    ("candidate", None, 0),
    ("candidate", "anderson", 2),
    ("geodesic", None, 0),
    ("geodesic", "fixed_point", 2),
]
# distance only (too slow to train): iterations up to the block length, where the fixed point is exact
DISTANCE_ONLY = [("velocity", "fixed_point", 16), ("velocity", "fixed_point", 64), ("velocity", "anderson", 16)]


def overrides(mode, solver, iters):
    out = dict(step_mode=mode)
    if solver:
        out.update(block_solver=solver, solver_iters=iters)
    return out


def distance_to_rollout(preset, mode, solver, iters, tokens):
    """Max and mean |states - B(rollout)| over the first block, mixer/residual/memory off."""
    model = build_model(
        "J",
        preset=preset,
        seed=0,
        mixer="none",
        token_state_residual=False,
        selective_memory=False,
        **overrides(mode, solver, iters),
    ).double()
    length = model.config.block_size
    tokens = tokens[:, :length]
    with torch.no_grad():
        states, _ = model.states(tokens)
        token_part = model._flow_token_part(model.embedding(tokens))
        target = model.bound(model.rollout(model.initial_state(tokens.shape[0]).double(), token_part, 0.5))
    gap = (states - target).abs()
    return gap.max().item(), gap.mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    text = Path(argparse.__file__).read_bytes()
    models, opts = {}, {}
    for setting in SETTINGS:
        models[setting] = build_model("J", preset=args.preset, seed=0, **overrides(*setting))
        opts[setting] = torch.optim.AdamW(models[setting].parameters(), lr=1e-4)
    length = next(iter(models.values())).config.max_seq_len
    data = torch.frombuffer(bytearray(text[: args.batch * (length + 1)]), dtype=torch.uint8).long()
    tokens = data.view(args.batch, length + 1)
    times = {s: [] for s in SETTINGS}
    for r in range(args.rounds + 1):
        for s in SETTINGS:
            start = time.perf_counter()
            out = models[s](tokens[:, :-1], step=1)
            loss = F.cross_entropy(out.logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
            opts[s].zero_grad(set_to_none=True)
            loss.backward()
            opts[s].step()
            if r:  # round 0 is warm-up
                times[s].append(time.perf_counter() - start)
    base = tokens[:, :-1].numel() / statistics.median(times[SETTINGS[0]])
    print(f"J at preset {args.preset}: batch {args.batch} x {length}, torch threads {torch.get_num_threads()}")
    print("| step mode | block solver | iters | tok/s | x velocity | max dist to rollout | mean dist |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for s in SETTINGS:
        rate = tokens[:, :-1].numel() / statistics.median(times[s])
        dmax, dmean = distance_to_rollout(args.preset, *s, tokens[:, :-1])
        mode, solver, iters = s
        print(
            f"| {mode} | {solver or '-'} | {iters or '-'} | {rate:,.0f} | {rate / base:.2f} | {dmax:.2e} | {dmean:.2e} |"
        )
    for mode, solver, iters in DISTANCE_ONLY:
        dmax, dmean = distance_to_rollout(args.preset, mode, solver, iters, tokens[:, :-1])
        print(f"| {mode} | {solver} | {iters} | - | - | {dmax:.2e} | {dmean:.2e} |")


if __name__ == "__main__":
    main()
