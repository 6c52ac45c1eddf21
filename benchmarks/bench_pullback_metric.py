"""What the metric options (``docs/geometry.md`` sections 8 and 9) cost against J, in one run.

    python benchmarks/bench_pullback_metric.py --preset micro --steps 8 --threads 1
    python benchmarks/bench_pullback_metric.py --preset tiny --steps 4 --batch 8 --threads 1

Three models built at the preset: J (the relational metric, Woodbury naturalization), J with
``metric="pullback"`` (G_pb = J^T (diag p - p p^T) J of the emitter at every block start, closed-form
Jacobian, dense d x d solve when V >= d) and J with ``metric_diagonal="relu"`` (the degenerate floor,
naturalized through the damped pseudo-inverse). For each: a training step (forward, cross-entropy,
backward, AdamW) at the preset's sequence length, and an evaluation forward (no_grad) on the same
tokens; the models' steps are interleaved (in an order rotated every repeat), each timed by the wall clock and by this process's CPU
time, and the medians compared as ratios to J's. Ratios only mean something within one run; on a
shared machine the absolute timings move by +-30%.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drmlab.models import build_model, count_parameters
from drmlab.training import resolve_train_config

OPTIONS = {"J": {}, "J metric=pullback": {"metric": "pullback"}, "J metric_diagonal=relu": {"metric_diagonal": "relu"}}


def training_step(model, optimizer, tokens):
    logits = model(tokens[:, :-1], step=10_000).logits  # past the warm-up: full naturalization strength
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


@torch.no_grad()
def forward(model, tokens):
    model(tokens[:, :-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="micro")
    parser.add_argument("--steps", type=int, default=8, help="timed repeats per model and task (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0, help="batch size (0: the preset's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve_train_config(args.preset)
    batch = args.batch or cfg.batch_size
    tokens = torch.randint(0, 256, (batch, cfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    models = {name: build_model("J", args.preset, seed=0, **kw) for name, kw in OPTIONS.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=cfg.lr) for name, m in models.items()}
    tasks = {
        "train step": lambda name: training_step(models[name].train(), optimizers[name], tokens),
        "forward": lambda name: forward(models[name].eval(), tokens),
    }
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times = {(task, name, clock): [] for task in tasks for name in models for clock in clocks}
    names = list(models)
    for repeat in range(args.steps + 1):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]  # rotated: no model always runs first
        for task, run in tasks.items():
            for name in order:
                start = {clock: read() for clock, read in clocks.items()}
                run(name)
                if repeat:  # the first of each pays the first-call costs
                    for clock, read in clocks.items():
                        times[task, name, clock].append(read() - start[clock])
    median = {key: statistics.median(t) for key, t in times.items()}
    c = models["J"].config
    print(
        f"preset {args.preset} (d = {c.d_state}, H = {c.hidden_size}, V = {c.vocab_size}, block {c.block_size}), "
        f"batch {batch} x {cfg.seq_len}, {args.threads} thread(s), median of {args.steps}:"
    )
    for name, model in models.items():
        print(f"  {name:24s} {count_parameters(model):>11,} parameters")
    for task in tasks:
        for name in models:
            wall, cpu = median[task, name, "wall"], median[task, name, "cpu"]
            ratio_wall = wall / median[task, "J", "wall"]
            ratio_cpu = cpu / median[task, "J", "cpu"]
            print(
                f"  {task:10s} {name:24s} wall {wall * 1e3:9.1f} ms ({ratio_wall:5.2f}x J), "
                f"cpu {cpu * 1e3:9.1f} ms ({ratio_cpu:5.2f}x J)"
            )


if __name__ == "__main__":
    main()
