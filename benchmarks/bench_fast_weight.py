"""What the fast-weight memory (``docs/drm.md`` section V) costs a training step, and its operator.

    python benchmarks/bench_fast_weight.py --preset tiny --steps 8 --threads 1

1. Training step (forward, cross-entropy, backward, AdamW) at the preset's training shape (tiny:
   batch 32 x 256 tokens) of ASM_CM against its base model J_NO_DIRECTION, the two models' steps
   interleaved in one run (so both see the same machine load); prints each model's median tok/s
   and the ratio of step times (the target: ASM_CM at most 1.5x its base), by the wall clock and
   by this process's CPU time (``time.process_time``: with one thread, the time the step actually
   ran -- on a machine shared with other jobs the wall clock also counts the time it waited).  The memory's read-out
   is given random weights first (at init W_o = 0; the cost is the same either way).
2. The operator alone, forward + backward, as ASM_CM calls it for one block: the fast matrix
   (retentions) and the slow one (``decay=None``), batch rows, one block of positions,
   d_k = d_v = ``fast_weight_dim``; :func:`drmlab.ops.delta_rule` (chunked WY form) against its
   sequential reference loop (CPU time).

Ratios only mean something within one run; timings on a shared machine move by +-30%.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drmlab.models import build_model
from drmlab.models.drm import build_config
from drmlab.ops.delta_rule import delta_rule, delta_rule_reference
from drmlab.training import resolve_train_config


def training_step(model, optimizer, tokens):
    logits = model(tokens[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def median_seconds(fn, repeats, clock=time.process_time):
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per model (after one warm-up step)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0, help="batch size (0: the preset's)")
    parser.add_argument("--dim", type=int, default=0, help="the memory's d_k = d_v (0: the preset's fast_weight_dim)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve_train_config(args.preset)
    batch = args.batch or cfg.batch_size
    tokens = torch.randint(0, 256, (batch, cfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    dim = {"fast_weight_dim": args.dim} if args.dim else {}
    models = {
        "J_NO_DIRECTION": build_model("J_NO_DIRECTION", args.preset, seed=0),
        "ASM_CM": build_model("ASM_CM", args.preset, seed=0, **dim),
    }
    with torch.no_grad():
        models["ASM_CM"].fast_weight_memory.read_out.weight.normal_(0, 0.02)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=cfg.lr) for name, m in models.items()}
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times = {(name, clock): [] for name in models for clock in clocks}
    for step in range(args.steps + 1):
        for name, model in models.items():
            start = {clock: read() for clock, read in clocks.items()}
            training_step(model, optimizers[name], tokens)
            if step:  # the first step of each pays the first-call costs
                for clock, read in clocks.items():
                    times[name, clock].append(read() - start[clock])
    step_tokens = batch * cfg.seq_len
    median = {key: statistics.median(t) for key, t in times.items()}
    print(
        f"training step, preset {args.preset} (memory d_k = d_v = {models['ASM_CM'].config.fast_weight_dim}), "
        f"batch {batch} x {cfg.seq_len}, {args.threads} thread(s), median of {args.steps}:"
    )
    for name in models:
        print(
            f"  {name:15s} wall {step_tokens / median[name, 'wall']:8,.0f} tok/s ({median[name, 'wall'] * 1e3:7.1f} ms), "
            f"cpu {step_tokens / median[name, 'cpu']:8,.0f} tok/s ({median[name, 'cpu'] * 1e3:7.1f} ms)"
        )
    for clock in clocks:
        ratio = median["ASM_CM", clock] / median["J_NO_DIRECTION", clock]
        print(f"  ASM_CM / J_NO_DIRECTION step time ({clock}): {ratio:.3f}x (target <= 1.5x)")

    config = build_config("ASM_CM", args.preset, **dim)
    rows, length, d = batch, config.block_size, config.fast_weight_dim
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(rows, length, d, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(rows, length, d, generator=g), dim=-1)
    v, init = torch.randn(rows, length, d, generator=g), torch.randn(rows, d, d, generator=g)
    # retentions near the forget bias's sigmoid(4) = 0.98, hard 0/1 writes
    decay = 0.9 + 0.1 * torch.rand(rows, length, generator=g)
    write = (torch.rand(rows, length, generator=g) > 0.5).float()
    leaves = [t.requires_grad_() for t in (q, k, v, decay, write, init)]

    def forward_backward(fn):
        fast, fast_state = fn(*leaves)
        q, k, v, _, write, init = leaves
        slow, slow_state = fn(q, k, v, None, 0.25 * write, init)
        (fast.sum() + fast_state.sum() + slow.sum() + slow_state.sum()).backward()

    chunked = median_seconds(lambda: forward_backward(delta_rule), 5 * args.steps)
    loop = median_seconds(lambda: forward_backward(delta_rule_reference), args.steps)
    print(f"delta_rule forward + backward, fast and slow matrices, [{rows}, {length}] positions, d_k = d_v = {d}:")
    print(
        f"  chunked {chunked * 1e3:7.2f} ms, sequential loop {loop * 1e3:7.2f} ms ({loop / chunked:.1f}x, cpu time); "
        f"{-(-cfg.seq_len // config.block_size)} calls per training step"
    )


if __name__ == "__main__":
    main()
