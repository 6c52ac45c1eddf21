"""Training throughput with ``torch.compile`` against eager, in the trainer's own loop
(``TrainConfig.compile``: ``torch.compile(fullgraph=True)``, inductor; the scans are the custom
operators of ``drmlab/ops/*/op.py``, one opaque node each), and what compiling costs, from a cold and
from a warm cache: the figures ``--compile auto`` decides from (``drmlab.training.compile_choice``).

    python benchmarks/bench_compile.py --models MAMBA,SSM_CONTROL --preset tiny --steps 8 --rounds 2 --threads 1
    python benchmarks/bench_compile.py --bf16 ...      # under bf16 autocast (the memory's products in bf16 too)

For each model, ``--rounds`` pairs of runs of ``--steps`` + 1 optimizer steps on one fixed random
byte stream, the same seed, alternating eager and compiled (on a shared machine a burst of other
work hits one run, not one kind). Inductor's cache is a fresh folder for the whole run (unless
``TORCHINDUCTOR_CACHE_DIR`` is set), so the first compiled run's first step is the cold compile and the
second round's is the warm one (the compiled kernels found in the cache). Printed: the best over rounds
of each kind's median per-step rate (every step but the first), their ratio (compiled / eager, measured in
this run), the first compiled step's seconds less a compiled step's (the compile's cost) cold and warm, and
the largest difference between an eager and a compiled run's per-step losses (inductor may reorder float
arithmetic, so the runs need only agree to rounding). ``--json F`` writes them as a study record.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from drmlab.devices import cpu_name
from drmlab.experiments.results import dumps, provenance
from drmlab.models import build_model
from drmlab.training import resolve_train_config, train


def run(name: str, preset: str, steps: int, compile_: bool, bf16: bool, stream: np.ndarray) -> list[dict]:
    step_tokens = resolve_train_config(preset).tokens_per_step
    cfg = resolve_train_config(
        preset,
        tokens=step_tokens * (steps + 1),
        eval_every=0,
        compile=compile_,
        bf16=bf16,
        bf16_memory_products=bf16,
    )
    summary = train(build_model(name, preset, seed=0), stream, None, cfg, quiet=True)
    return [r for r in summary["rows"] if r["kind"] == "train"]


def step_seconds(rows: list[dict], first: int) -> float:
    """Seconds of row ``first`` of a run (its ``elapsed`` less the row before's)."""
    return rows[first]["elapsed"] - (rows[first - 1]["elapsed"] if first else 0.0)


def measure(name: str, args, stream: np.ndarray) -> dict:
    rates: dict[bool, list[float]] = {False: [], True: []}
    rows: dict[bool, list[dict]] = {}
    first_steps: list[float] = []
    for _ in range(args.rounds):
        for compiled in (False, True):
            torch._dynamo.reset()  # each compiled run traces again, as a new process would; Inductor's cache stays
            rows[compiled] = run(name, args.preset, args.steps, compiled, args.bf16, stream)
            rates[compiled].append(float(np.median([r["tok_s"] for r in rows[compiled][1:]])))
            if compiled:
                step = np.median([step_seconds(rows[True], i) for i in range(1, len(rows[True]))])
                first_steps.append(step_seconds(rows[True], 0) - float(step))
    eager, compiled = max(rates[False]), max(rates[True])
    return {
        "eager_tok_s": eager,
        "compiled_tok_s": compiled,
        "ratio": compiled / eager,
        "compile_seconds_cold": first_steps[0],
        "compile_seconds_warm": min(first_steps[1:]) if len(first_steps) > 1 else None,
        "max_loss_diff": max(abs(a["loss"] - b["loss"]) for a, b in zip(rows[False], rows[True])),
        "rates": {"eager": rates[False], "compiled": rates[True]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="MAMBA,SSM_CONTROL")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, the memory's products in bf16 too")
    parser.add_argument("--json", type=Path, help="write the figures as a study record")
    parser.add_argument("--machine", default="not stated", help="with --json: a line describing the machine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = None
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):  # a cold cache: the first compile is the whole cost
        cache = tempfile.TemporaryDirectory(prefix="bench-compile-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    stream = np.random.default_rng(0).integers(32, 127, 2_000_000).astype(np.uint8)
    precision = "bf16" if args.bf16 else "float32"
    print(f"torch {torch.__version__}, {args.threads} threads, preset {args.preset}, {precision}, {args.steps} steps")
    results = {}
    for name in args.models.split(","):
        r = results[name] = measure(name, args, stream)
        warm = "n/a" if r["compile_seconds_warm"] is None else f"{r['compile_seconds_warm']:.1f} s"
        print(
            f"{name:26s} eager {r['eager_tok_s']:9,.0f} tok/s  compiled {r['compiled_tok_s']:9,.0f} tok/s  "
            f"ratio {r['ratio']:5.2f}  compile {r['compile_seconds_cold']:6.1f} s cold, {warm} warm  "
            f"max |loss diff| {r['max_loss_diff']:.2e}",
            flush=True,
        )
    if args.json is not None:
        settings = {k: getattr(args, k) for k in ("models", "preset", "steps", "rounds", "threads", "bf16")}
        record = {
            "title": f"torch.compile against eager in the trainer's loop, preset {args.preset}, {precision}: "
            "training tokens/s and the compile's cost from a cold and a warm Inductor cache",
            "provenance": {**provenance(settings), "machine": args.machine, "cpu": cpu_name()},
            "units": "tokens per second (median step, best round); seconds (first compiled step less a compiled step)",
            "torch": torch.__version__,
            "precision": precision,
            "models": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dumps(record) + "\n")
    if cache is not None:
        cache.cleanup()


if __name__ == "__main__":
    main()
