"""What the first-use self-check of the fast backends costs (``drmlab.ops.self_check``).

    python benchmarks/bench_self_check.py [--models J,MAMBA] [--repeats 20] [--json results.json]

Each figure comes from a fresh child process (one intra-op thread), so that "cold" is what a process
pays on its first use, with the C kernels already built (their build is no part of the check):

* per check, (operator, backend, dtype) on the CPU: the check's time on its first use in the process
  (cold) and the median of ``--repeats`` further runs of it with its verdict forgotten (warm), wall
  clock and this thread's CPU time; with the largest error it found and its tolerance;
* per model (tiny preset, the trainer's default batch of 32 x 256 tokens, AdamW): the checks its first
  training step runs (their cold time together) against the median time of one training step
  (forward, backward and optimizer step; ``--steps`` timed after one untimed): the ratio is the check's
  whole cost in training steps, paid once per process;
* the fused decode step (J tiny, one sequence): its check (one extra fast step and the comparison)
  against one fused step.

CPU time is the figure to read on a machine that other jobs load (wall clock counts their time too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

CHECKS = [
    ("linear_scan", "float32"),
    ("linear_scan", "float64"),
    ("selective_scan", "float32"),
    ("selective_scan", "float64"),
]
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _clocks():
    return time.perf_counter(), time.thread_time()


def _since(start) -> dict:
    wall, cpu = _clocks()
    return {"wall": (wall - start[0]) * 1e3, "cpu": (cpu - start[1]) * 1e3}


def _median(samples: list[dict]) -> dict:
    return {key: statistics.median(s[key] for s in samples) for key in ("wall", "cpu")}


def _kernels_loaded() -> None:
    """Build / load the C kernels with the check off, so that no check pays for them."""
    from drmlab.ops import self_check
    from drmlab.ops.linear_scan import c as scan_c
    from drmlab.ops.selective_scan import c as sscan_c

    os.environ[self_check.DISABLE_ENV] = "1"
    assert scan_c.KERNEL.available() and sscan_c.KERNEL.available()
    del os.environ[self_check.DISABLE_ENV]


def _timed_judge() -> list[dict]:
    """Time every check from now on (wall clock and this thread's CPU time, ms), in order."""
    from drmlab.ops import self_check

    times, judge = [], self_check.judge

    def timed(*args, **kwargs):
        start = _clocks()
        try:
            return judge(*args, **kwargs)
        finally:
            times.append(_since(start))

    self_check.judge = timed
    return times


def child_check(operator: str, dtype: str, repeats: int) -> dict:
    from drmlab.ops import self_check

    _kernels_loaded()
    times = _timed_judge()
    device, key = torch.device("cpu"), (operator, "c", "cpu", DTYPES[dtype])
    for _ in range(repeats + 1):
        self_check._RECORDS.pop(key, None)
        record = self_check.verify(operator, "c", device, DTYPES[dtype])
        assert record is not None and record.passed, record
    return {
        "cold_ms": times[0],
        "warm_ms": _median(times[1:]),
        "max_error": record.max_error,
        "tolerance": record.tolerance,
    }


def child_model(model_name: str, steps: int, batch: int, length: int) -> dict:
    from drmlab.models import build_model
    from drmlab.ops import self_check

    _kernels_loaded()
    times = _timed_judge()
    torch.manual_seed(0)
    model = build_model(model_name, preset="tiny")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, length + 1), generator=torch.Generator().manual_seed(0))

    def step():
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the first step: its first use of each backend runs the check
    checks = self_check.backend_checks()
    samples = []
    for _ in range(steps):
        start = _clocks()
        step()
        samples.append(_since(start))
    return {
        "checks": [f"{c['operator']}/{c['backend']}/{c['dtype']}" for c in checks],
        "passed": all(c["passed"] for c in checks),
        "check_ms": {key: sum(t[key] for t in times) for key in ("wall", "cpu")},
        "step_ms": _median(samples),
        "tokens_per_step": batch * length,
    }


def child_decode(repeats: int) -> dict:
    from drmlab.generation import prefill
    from drmlab.models import build_model
    from drmlab.ops import self_check

    _kernels_loaded()
    model = build_model("J", preset="tiny", seed=0).eval()
    tokens = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
    key = ("decode_step", "c", "cpu", torch.float32)
    with torch.no_grad():
        state = prefill(model, tokens[:, :3])[1]  # inside a block: the fused step takes the next token
        times = _timed_judge()  # after the prefill (its own scan's check is not the decode step's)
        plain = []
        for _ in range(repeats + 1):
            self_check._RECORDS.pop(key, None)
            model.step_fused(tokens[:, 3], state)  # checked: the fast step beside it, compared
            start = _clocks()
            model.step_fused(tokens[:, 3], state)  # verdict kept: the fused step alone
            plain.append(_since(start))
    record = self_check.recorded(*key[:2], torch.device("cpu"), torch.float32)
    assert record is not None and record.passed and len(times) == repeats + 1
    return {
        "check_ms_cold": times[0],
        "check_ms_warm": _median(times[1:]),
        "fused_step_ms": _median(plain[1:]),
        "max_error": record.max_error,
        "tolerance": record.tolerance,
    }


def _child(args: list[str], settings: argparse.Namespace) -> dict:
    flags = ["--repeats", str(settings.repeats), "--steps", str(settings.steps)]
    flags += ["--batch-size", str(settings.batch_size), "--seq-len", str(settings.seq_len)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DRMLAB_NO_BACKEND_CHECK", None)
    out = subprocess.run(
        [sys.executable, __file__, *flags, "--child", *args], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_self_check: child {args} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt(ms: dict) -> str:
    return f"{ms['cpu']:7.2f} cpu {ms['wall']:7.2f} wall"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="J,MAMBA")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        kind, *rest = args.child
        if kind == "check":
            print(json.dumps(child_check(rest[0], rest[1], args.repeats)))
        elif kind == "model":
            print(json.dumps(child_model(rest[0], args.steps, args.batch_size, args.seq_len)))
        else:
            print(json.dumps(child_decode(args.repeats)))
        return
    checks = {}
    for operator, dtype in CHECKS:
        r = checks[f"{operator}/c/{dtype}"] = _child(["check", operator, dtype], args)
        print(
            f"{operator:15s} c {dtype}: cold {_fmt(r['cold_ms'])} ms, warm {_fmt(r['warm_ms'])} ms "
            f"(error {r['max_error']:.1e}, tolerance {r['tolerance']:.0e})"
        )
    training = {}
    for name in args.models.split(","):
        r = training[name] = _child(["model", name], args)
        r["check_over_step"] = {key: r["check_ms"][key] / r["step_ms"][key] for key in ("wall", "cpu")}
        print(
            f"{name} tiny training ({r['tokens_per_step']} tokens a step): checks {', '.join(r['checks'])}: "
            f"{_fmt(r['check_ms'])} ms; one step {_fmt(r['step_ms'])} ms; check / step "
            f"{r['check_over_step']['cpu']:.4f} (cpu), {r['check_over_step']['wall']:.4f} (wall)"
        )
    decode = _child(["decode"], args)
    print(
        f"decode_step c float32 (J tiny, batch 1): check cold {_fmt(decode['check_ms_cold'])} ms, warm "
        f"{_fmt(decode['check_ms_warm'])} ms; one fused step {_fmt(decode['fused_step_ms'])} ms"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"checks": checks, "training": training, "decode": decode}, handle, indent=1)


if __name__ == "__main__":
    main()
