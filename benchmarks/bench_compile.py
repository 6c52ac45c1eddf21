"""Training throughput with ``torch.compile`` against eager, in the trainer's own loop
(``TrainConfig.compile``: ``torch.compile(fullgraph=True)``, inductor; the scans are the custom
operators of ``drmlab/ops/*/op.py``, one opaque node each).

    python benchmarks/bench_compile.py --models MAMBA,SSM_CONTROL --preset tiny --steps 4 --rounds 2 --threads 2

For each model, ``--rounds`` pairs of runs of ``--steps`` + 1 optimizer steps on one fixed random
byte stream, the same seed, alternating eager and compiled (on a shared machine a burst of other
work hits one run, not one kind). Printed: the best over rounds of each kind's median per-step
rate (every step but the first), their ratio (compiled / eager, measured in this run), the first
step's time of the first compiled run (it includes compiling; later rounds reuse the graphs),
and the largest difference between an eager and a compiled run's per-step losses (inductor may
reorder float arithmetic, so the runs need only agree to rounding).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from drmlab.models import build_model
from drmlab.training import resolve_train_config, train


def run(name: str, preset: str, steps: int, compile_: bool, stream: np.ndarray) -> tuple[list[dict], float]:
    step_tokens = resolve_train_config(preset).tokens_per_step
    cfg = resolve_train_config(preset, tokens=step_tokens * (steps + 1), eval_every=0, compile=compile_)
    wall = time.perf_counter()
    summary = train(build_model(name, preset, seed=0), stream, None, cfg, quiet=True)
    return [r for r in summary["rows"] if r["kind"] == "train"], time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="MAMBA,SSM_CONTROL")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    stream = np.random.default_rng(0).integers(32, 127, 2_000_000).astype(np.uint8)
    print(f"torch {torch.__version__}, {args.threads} threads, preset {args.preset}, {args.steps} timed steps")
    for name in args.models.split(","):
        torch._dynamo.reset()
        rates: dict[bool, list[float]] = {False: [], True: []}
        rows: dict[bool, list[dict]] = {}
        first_compiled = None
        for _ in range(args.rounds):
            for compiled in (False, True):
                rows[compiled], _ = run(name, args.preset, args.steps, compiled, stream)
                rates[compiled].append(float(np.median([r["tok_s"] for r in rows[compiled][1:]])))
                if compiled and first_compiled is None:
                    first_compiled = rows[compiled][0]["elapsed"]
        eager, compiled = max(rates[False]), max(rates[True])
        loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(rows[False], rows[True]))
        print(
            f"{name:12s} eager {eager:9,.0f} tok/s  compiled {compiled:9,.0f} tok/s  ratio {compiled / eager:5.2f}  "
            f"first compiled step {first_compiled:6.1f} s  max |loss diff| {loss_diff:.2e}  "
            f"(rates per round: eager {', '.join(f'{r:,.0f}' for r in rates[False])}; "
            f"compiled {', '.join(f'{r:,.0f}' for r in rates[True])})"
        )


if __name__ == "__main__":
    main()
