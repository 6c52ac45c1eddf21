"""Training throughput of DRM variants: tokens/s of forward + backward + AdamW.

Run: python benchmarks/bench_models.py [--presets tiny,small] [--models J,J_NO_DIRECTION,SSM_CONTROL]
     python benchmarks/bench_models.py --presets tiny --models RESOLVENT,RESOLVENT_SOFTMAX,RESOLVENT_ROPE \
         --baseline RESOLVENT_SOFTMAX

Each model trains a few steps on random bytes at its preset's sequence length;
the median step time after one warm-up step gives tokens/s. Models are measured
in interleaved rounds so machine noise hits them alike; the table reports each
model's tokens/s and its ratio to the baseline (default SSM_CONTROL) measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from drmlab.models import build_model

BATCH = {"micro": 8, "tiny": 8, "small": 4, "125m": 1}


def step_time(model, tokens) -> float:
    opt = model._bench_opt
    start = time.perf_counter()
    out = model(tokens[:, :-1], step=1)
    loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="micro,tiny,small")
    parser.add_argument("--models", default="J,J_NO_DIRECTION,SSM_CONTROL")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default="SSM_CONTROL", help="model the ratios are taken against")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for preset in args.presets.split(","):
        names = args.models.split(",")
        models = {n: build_model(n, preset=preset) for n in names}
        for m in models.values():
            m._bench_opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        length = next(iter(models.values())).config.max_seq_len
        tokens = torch.randint(0, 256, (BATCH[preset], length + 1), generator=torch.Generator().manual_seed(0))
        times = {n: [] for n in names}
        for n in names:
            step_time(models[n], tokens)  # warm-up
        for _ in range(args.rounds if preset != "125m" else 2):
            for n in names:
                times[n].append(step_time(models[n], tokens))
        rate = {n: tokens[:, :-1].numel() / statistics.median(t) for n, t in times.items()}
        base = rate.get(args.baseline)
        print(f"\npreset {preset}: batch {BATCH[preset]} x {length} tokens")
        print(f"{'model':<22}{'params':>14}{'tok/s':>12}{'x ' + args.baseline:>20}")
        for n in names:
            params = sum(p.numel() for p in models[n].parameters())
            ratio = f"{rate[n] / base:.2f}" if base else "-"
            print(f"{n:<22}{params:>14,}{rate[n]:>12,.0f}{ratio:>20}")


if __name__ == "__main__":
    main()
