"""Training-step and decode-step cost against the variable rank, masked and sliced, as ratios to full rank
measured in the same run (``docs/variable-rank.md`` section 5).

    python benchmarks/bench_rank.py [--models ASM_VR_S,ASM_VR_R,ASM_CM_VR] [--preset tiny] [--ranks 16,32,64,128]
                                    [--batch 8] [--seq-len 256] [--decode-batch 16] [--decode-tokens 32]
                                    [--repeats 7] [--device cpu]

For each model, the arms are full rank (the baseline: ``rank_policy="full"``, masked) and a fixed rank k
for each of ``--ranks`` in both forms (``rank_compute="masked"``, the reference, and ``"sliced"``). A
training step is forward + CE + backward + AdamW on one ``batch x seq_len`` window; a decode step is one
``model.step`` at ``--decode-batch`` streams after a prefill of half a block (its time per token over ``--decode-tokens``).
The arms are interleaved repeat by repeat, each repeat starting one arm later (the first repeat, which
pays the first-call costs, is dropped), one thread on the CPU, timed as the process's CPU time (on a shared machine
the other processes' load does not count; wall time on a GPU); each figure is the median over the
repeats, divided by the baseline's. Fixed rank d_state masked is the baseline's computation again: its
ratio shows the run's noise.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drmlab.models import build_model
from drmlab.training.trainer import lm_loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(device: torch.device) -> float:
    """The process's CPU time on the CPU (the load of other processes on a shared machine does not
    count), wall time on a GPU."""
    return time.process_time() if device.type == "cpu" else time.perf_counter()


def train_seconds(model, optimizer, window, device) -> float:
    _sync(device)
    start = _clock(device)
    loss, _ = lm_loss(model, window, step=1_000)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return _clock(device) - start


@torch.no_grad()
def decode_seconds(model, prompt, tokens, device) -> float:
    """Seconds per decode step (one token of every stream) after a parallel prefill of ``prompt``."""
    state = model(prompt, return_state=True).state
    _sync(device)
    start = _clock(device)
    for t in range(tokens.shape[1]):
        _, state = model.step(tokens[:, t], state)
    _sync(device)
    return (_clock(device) - start) / tokens.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ASM_VR_S,ASM_VR_R,ASM_CM_VR")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--ranks", default="16,32,64,128")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    window = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g).to(device)
    ranks = [int(r) for r in args.ranks.split(",")]
    print(
        f"| model ({args.preset}, train {args.batch} x {args.seq_len}, decode batch {args.decode_batch}, {args.device}) | rank | "
        "train masked | train sliced | decode masked | decode sliced |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        arms = {("full", "masked"): dict()}
        for k in ranks:
            for compute in ("masked", "sliced"):
                arms[(k, compute)] = dict(rank_policy="fixed", rank_fixed=k, rank_min=1, rank_compute=compute)
        models = {
            key: build_model(name, args.preset, seed=0, **overrides).to(device) for key, overrides in arms.items()
        }
        block = next(iter(models.values())).config.block_size
        streams = torch.randint(0, 256, (args.decode_batch, block // 2 + args.decode_tokens), generator=g).to(device)
        prompt, tokens = streams[:, : block // 2], streams[:, block // 2 :]
        optimizers = {key: torch.optim.AdamW(m.parameters(), lr=1e-4) for key, m in models.items()}
        train = {key: [] for key in models}
        decode = {key: [] for key in models}
        keys = list(models)
        for repeat in range(args.repeats + 1):
            turn = repeat % len(keys)  # each repeat starts at the next arm: no arm always runs first
            for key in keys[turn:] + keys[:turn]:
                model = models[key]
                train[key].append(train_seconds(model.train(), optimizers[key], window, device))
                decode[key].append(decode_seconds(model.eval(), prompt, tokens, device))
        t_base = statistics.median(train[("full", "masked")][1:])
        d_base = statistics.median(decode[("full", "masked")][1:])

        def ratio(times, base):
            return f"{statistics.median(times[1:]) / base:.2f}"

        print(f"| {name} (full: {t_base * 1e3:,.0f} ms/step, {d_base * 1e3:,.2f} ms/token) | full | 1.00 | | 1.00 | |")
        for k in ranks:
            cells = [ratio(train[(k, c)], t_base) for c in ("masked", "sliced")]
            cells += [ratio(decode[(k, c)], d_base) for c in ("masked", "sliced")]
            print(f"| {name} | {k} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
