"""Kill campaign: train, SIGKILL at random moments, resume, and count bit-exact survivals.

Each trial starts a child process that trains a micro-preset registry model into a run directory
with a checkpoint every step, kills it with SIGKILL after a random delay (possibly several times,
resuming in between), then finishes the run and compares its final weights and per-step losses
with an uninterrupted run of the same seed. It also damages committed checkpoints (a flipped bit,
a truncation, a deleted file, a damaged pointer) and counts how many are refused with a one-line
error. Prints a summary table; exits 1 if any trial lost work or loaded a damaged checkpoint.

    python benchmarks/kill_campaign.py --trials 20 --model SSM_CONTROL --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

from drmlab.models import build_model
from drmlab.runs import CorruptCheckpointError, RunDir
from drmlab.training import TrainConfig, train
from drmlab.training.run_info import DataInfo, RunInfo

CHILD = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {here!r})
    from kill_campaign import run_training
    run_training({model!r}, {steps}, {run!r}, resume={resume})
""")


def _stream() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=50_000).astype(np.int64)


def _cfg(steps: int) -> TrainConfig:
    return TrainConfig(
        tokens=8 * 32 * steps, batch_size=8, seq_len=32, lr=3e-3, eval_every=0, eval_windows=0, checkpoint_every=8 * 32
    )


def run_training(model_name: str, steps: int, run: str, resume: bool = False) -> torch.nn.Module:
    model = build_model(model_name, "micro", vocab_size=256, seed=1)
    info = RunInfo(model_name, "micro", data=DataInfo(256, "bytes", None, None))
    resumable = resume and RunDir(run).has_checkpoint()
    train(
        model, _stream(), None, _cfg(steps), run, quiet=True, resume=resumable, overwrite=not resumable, run_info=info
    )
    return model


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in RunDir(run).read_metrics() if r["kind"] == "train"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kills", type=int, default=3, help="kills per trial before it may finish")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--model", default="SSM_CONTROL")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    here = str(Path(__file__).resolve().parent)
    root = Path(tempfile.mkdtemp(prefix="kill-campaign-"))

    t0 = time.perf_counter()
    reference = run_training(args.model, args.steps, str(root / "reference"))
    step_seconds = (time.perf_counter() - t0) / args.steps
    ref_weights = reference.state_dict()
    ref_losses = _losses(root / "reference")

    kills = exact = 0
    lost = []
    for trial in range(args.trials):
        run = root / f"trial{trial}"
        for attempt in range(args.kills):
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHILD.format(here=here, model=args.model, steps=args.steps, run=str(run), resume=attempt > 0),
                ]
            )
            delay = rng.uniform(0.5, 2.0) + rng.uniform(0, step_seconds * args.steps * 0.5)
            try:
                child.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                child.kill()
                kills += 1
            child.wait()
        model = run_training(args.model, args.steps, str(run), resume=True)
        same = all(torch.equal(model.state_dict()[k], v) for k, v in ref_weights.items()) and _losses(run) == ref_losses
        exact += same
        if not same:
            lost.append(trial)
        print(f"trial {trial}: {'bit-exact' if same else 'DIFFERENT'}", flush=True)

    damaged, refused = 0, 0
    for how in ("flip", "truncate", "delete", "pointer"):
        run = RunDir(root / "reference")
        target = run.checkpoint_dir() / "model.safetensors"
        backup = target.read_bytes()
        pointer = run.pointer_path.read_text()
        if how == "flip":
            data = bytearray(backup)
            data[len(data) // 2] ^= 0x01
            target.write_bytes(bytes(data))
        elif how == "truncate":
            target.write_bytes(backup[: len(backup) - 7])
        elif how == "delete":
            target.unlink()
        else:
            run.pointer_path.write_text(pointer[: len(pointer) // 2])
        damaged += 1
        try:
            run.load_checkpoint(build_model(args.model, "micro", vocab_size=256, seed=1))
        except (CorruptCheckpointError, ValueError, FileNotFoundError) as exc:
            refused += "\n" not in str(exc)
            print(f"damage {how}: refused: {exc}")
        else:
            print(f"damage {how}: LOADED")
        target.write_bytes(backup)
        run.pointer_path.write_text(pointer)

    print(
        json.dumps(
            {
                "model": args.model,
                "trials": args.trials,
                "kills": kills,
                "bit_exact_resumes": exact,
                "lost_work_trials": lost,
                "damaged": damaged,
                "refused_in_one_line": refused,
                "step_seconds": round(step_seconds, 4),
                "work_dir": str(root),
            },
            indent=1,
        )
    )
    return 0 if exact == args.trials and refused == damaged else 1


if __name__ == "__main__":
    sys.exit(main())
