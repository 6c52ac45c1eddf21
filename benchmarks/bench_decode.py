"""Per-token decode time after long contexts: recurrent models stay flat, attention grows.

Run: python benchmarks/bench_decode.py [--contexts 256,2048,16384] [--steps 32]

For each model at preset tiny: process a context of N tokens of real text -- the parallel
prefill of the first N - 4 where the model has one, then 4 untimed single-token ``step`` calls
(the warm-up: first-call costs such as kernel loading, allocator growth and cache set-up are paid
there, not in the timing) -- then time ``--steps`` single-token ``step`` calls and report the
median ms/token, the ratio to the same model's figure at the shortest context, and the size
of the decoding state (the bytes of every tensor it holds: the key/value cache for attention,
the recurrent state otherwise) plus the process's peak resident memory. Models with a learned
position table are built with one long enough.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import torch

from drmlab.generation import prefill
from drmlab.models import build_model

WARMUP_STEPS = 4  # untimed step calls that end every context

MODELS = {
    "J": {},
    "SSM_CONTROL": {},
    "LOOPED": dict(arm="MC", positions="none"),  # the selective-SSM looped arm
    "MAMBA": {},
    "GPT2": {},  # n_positions set to the longest context below
}


def state_bytes(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    if hasattr(state, "__dict__"):
        return sum(state_bytes(v) for v in vars(state).values())
    return 0


def corpus_tokens(n: int) -> torch.Tensor:
    text = b"".join(p.read_bytes() for p in sorted(Path(argparse.__file__).parent.glob("*.py"))[:40])
    while len(text) < n + 1:
        text += text
    return torch.frombuffer(bytearray(text[:n]), dtype=torch.uint8).long().unsqueeze(0)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="256,2048,16384")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (single-token steps are tiny)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = sorted(int(x) for x in args.contexts.split(","))
    if contexts[0] <= WARMUP_STEPS:
        parser.error(f"every context must be longer than the {WARMUP_STEPS} warm-up steps that end it")
    print(
        f"preset {args.preset}, torch threads {torch.get_num_threads()}, {args.steps} timed steps per context "
        f"after {WARMUP_STEPS} untimed ones"
    )
    print("| model | context | ms/token | x shortest | state KiB | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        overrides = dict(MODELS.get(name, {}))
        if name == "GPT2":
            overrides["n_positions"] = max(contexts) + args.steps + 1
        model = build_model(name, preset=args.preset, **overrides).eval()
        first = None
        for n in contexts:
            tokens = corpus_tokens(n + args.steps)
            logits, state = prefill(model, tokens[:, : n - WARMUP_STEPS])
            for t in range(n - WARMUP_STEPS, n):
                logits, state = model.step(tokens[:, t], state)
            times = []
            for t in range(args.steps):
                start = time.perf_counter()
                logits, state = model.step(tokens[:, n + t], state)
                times.append(time.perf_counter() - start)
            ms = 1000 * statistics.median(times)
            first = first or ms
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"| {name} | {n:,} | {ms:.3f} | {ms / first:.2f} | {state_bytes(state) / 2**10:,.1f} | {rss:,.0f} |")
            del state


if __name__ == "__main__":
    main()
