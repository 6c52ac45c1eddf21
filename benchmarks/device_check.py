"""Every check that needs a GPU, as one command sized for one short lease of a GPU machine.

    PYTHONPATH=src python3 benchmarks/device_check.py --out "$OUT"     # on the GPU machine
    python benchmarks/device_check.py --plan                            # anywhere: the steps, run nothing

Made for the workplace's device machine (one H200, no network, drmlab not installed, its own
PyTorch, Triton and transformers), where a session gets about 15 minutes in all, machine start
included: the default budget runs in about 5 minutes, so a failed try leaves room for a second one.
``PYTHONPATH=src`` stands in for the install; nothing here needs the network.

Steps, in order, each a subprocess with its own time limit (a crash or a hang loses one step):

1. ``environment``: ``nvidia-smi -L`` and the versions of torch, CUDA, Triton and transformers.
2. ``gpu_suite``: ``benchmarks/gpu_suite.py --budget B`` (its own sections and time limits;
   it writes ``gpu_suite.json`` and ``gpu_suite.md`` into OUT).
3. ``cuda_tests``: the tests that skip without CUDA (:data:`CUDA_TESTS`): the Triton kernels
   compiled for the GPU against float64, the ``"auto"`` scan backend on CUDA, the resolvent's
   flex path forward and backward.
4. ``train``: ``drmlab train`` J at preset tiny (500k tokens) on CUDA with bf16 autocast (checkpoints carry the
   CUDA RNG state), then ``drmlab eval`` and ``drmlab generate`` from its run directory.
5. ``resume``: the same run again, stopped by SIGTERM as soon as its first checkpoint is committed,
   then ``--resume``d to the end; its validation CE (the first 128k tokens) is recorded beside step 4's (not asserted equal:
   some CUDA kernels, embedding's backward among them, add in no fixed order).
6. ``fsdp``: ``torchrun --nproc_per_node 1 -m drmlab train --fsdp``: a process group of one over NCCL,
   the model wrapped by FSDP2, its checkpoint gathered (one GPU cannot hold two NCCL ranks).

OUT receives at most four files (``device_check.json``: every step's command, exit code, seconds and
last output lines; ``device_check.log``: all output; the suite's two files), within the device
tool's limit of 8 files; run directories go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tests that skip without CUDA (their skip reasons say so); run there by node id.
CUDA_TESTS = (
    "tests/ops/test_ops_triton.py::test_cases_on_cuda",
    "tests/ops/test_ops_scan.py::test_cuda_uses_torch_path",
    "tests/resolvent/test_resolvent_torch.py::test_flex_on_cuda_forward_backward_and_auto",
)

DRMLAB = [sys.executable, "-m", "drmlab"]
EVAL_TOKENS = "128k"  # validation tokens rescored by each run and by the eval step


def train_args(device: str, tokens: str, preset: str = "tiny") -> list[str]:
    """One run's settings, the same for the whole run (step 4) and the stopped one (step 5): a
    checkpoint every fifth of the budget, so the stop lands early."""
    return [
        "--model",
        "J",
        "--preset",
        preset,
        "--tokens",
        tokens,
        "--device",
        device,
        "--bf16",
        "--seed",
        "1",
        "--quiet",
        "--eval-every",
        "0",
        "--eval-tokens",
        EVAL_TOKENS,
        "--set",
        f"checkpoint_every={_tokens(tokens) // 5}",
    ]


def _tokens(text: str) -> int:
    scale = {"k": 1_000, "M": 1_000_000}.get(text[-1], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Log:
    """All output in one file, and a record per step for the JSON."""

    def __init__(self, out: Path):
        self.out = out
        self.handle = open(out / "device_check.log", "a", buffering=1)
        self.steps: list[dict] = []

    def run(self, step: str, cmd: list[str], limit: float) -> dict:
        self.handle.write(f"\n=== {step}: {' '.join(cmd)}\n")
        t0 = time.time()
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            code, text = "not run", f"{type(exc).__name__}: {exc}"
        else:
            try:
                text, _ = proc.communicate(timeout=limit)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                _end_group(proc)
                text, _ = proc.communicate()
                code = "timeout"
        self.handle.write(text)
        record = {
            "step": step,
            "cmd": cmd,
            "rc": code,
            "seconds": round(time.time() - t0, 1),
            "tail": text.splitlines()[-15:],
        }
        self.steps.append(record)
        self.save()
        return record

    def save(self, **extra) -> None:
        path = self.out / "device_check.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(extra)
        data["steps"] = self.steps
        path.write_text(json.dumps(data, indent=1))


def _end_group(proc: subprocess.Popen) -> None:
    """Stop a step and every process it started (torchrun's workers too): SIGTERM to its process
    group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _val_ce(run: Path) -> float | None:
    summary = run / "summary.json"
    return json.loads(summary.read_text()).get("val_ce") if summary.exists() else None


def _stopped_run(log: Log, run: Path, args: list[str], limits: dict) -> dict:
    """Train, SIGTERM the process once its first checkpoint is committed, then resume it."""
    cmd = DRMLAB + ["train", *args, "--out", str(run)]
    log.handle.write(f"\n=== resume (first part): {' '.join(cmd)}\n")
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=log.handle, stderr=subprocess.STDOUT, start_new_session=True
    )
    limit = limits["resume:stop"]
    stopped_at = None
    while proc.poll() is None and time.time() - t0 < limit:
        if (run / "checkpoint.json").exists():
            proc.send_signal(signal.SIGTERM)
            stopped_at = json.loads((run / "checkpoint.json").read_text()).get("step")
            break
        time.sleep(0.1)
    try:
        code = proc.wait(timeout=max(1.0, limit - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        _end_group(proc)
        code = "timeout"
    log.steps.append(
        {
            "step": "resume:stop",
            "cmd": cmd,
            "rc": code,
            "seconds": round(time.time() - t0, 1),
            "stopped_after_checkpoint_step": stopped_at,
        }
    )
    return log.run(
        "resume:continue", DRMLAB + ["train", "--resume", "--out", str(run), "--quiet"], limits["resume:continue"]
    )


def plan(suite_budget: float) -> list[tuple[str, float]]:
    """(step, time limit in seconds) in order; the sum is the most the check can take."""
    return [
        ("environment", 20),
        ("gpu_suite", suite_budget + 45),
        ("cuda_tests", 90),
        ("train", 75),
        ("eval", 25),
        ("generate", 20),
        ("resume:stop", 45),
        ("resume:continue", 45),
        ("fsdp", 45),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="device-check", help="folder for the results (on the device: $OUT)")
    parser.add_argument(
        "--suite-budget",
        type=float,
        default=150,
        help="seconds for benchmarks/gpu_suite.py (default 150; the suite's own default is 450)",
    )
    parser.add_argument("--plan", action="store_true", help="print the steps and their time limits, run nothing")
    parser.add_argument(
        "--device", default="cuda", help="device of the training steps (default cuda; cpu to try the script)"
    )
    parser.add_argument("--train-tokens", default="500k", help="budget of the training runs (default 500k)")
    parser.add_argument("--preset", default="tiny", help="preset of the training runs (default tiny)")
    args = parser.parse_args(argv)
    steps = plan(args.suite_budget)
    if args.plan:
        for step, limit in steps:
            print(f"{step:12s} at most {limit:4.0f} s")
        print(f"{'total':12s} at most {sum(limit for _, limit in steps):4.0f} s")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out)
    log.save(started=time.strftime("%Y-%m-%d %H:%M:%S"), suite_budget=args.suite_budget, plan=dict(steps))
    limits = dict(steps)
    versions = (
        "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', "
        "torch.version.cuda, 'available', torch.cuda.is_available()); "
        "print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)\n"
        "for name in ('triton', 'transformers', 'numpy', 'safetensors'):\n"
        "    try:\n        print(name, __import__(name).__version__)\n"
        "    except Exception as exc:\n        print(name, 'missing', exc)"
    )
    log.run("environment", ["nvidia-smi", "-L"], limits["environment"] / 2)
    log.run("environment", [sys.executable, "-c", versions], limits["environment"] / 2)
    log.run(
        "gpu_suite",
        [sys.executable, "benchmarks/gpu_suite.py", "--out", str(out), "--budget", str(args.suite_budget)],
        limits["gpu_suite"],
    )
    log.run(
        "cuda_tests",
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *CUDA_TESTS],
        limits["cuda_tests"],
    )
    with tempfile.TemporaryDirectory(prefix="drmlab-device-") as tmp:
        whole, stopped = Path(tmp) / "J-whole", Path(tmp) / "J-stopped"
        run_args = train_args(args.device, args.train_tokens, args.preset)
        log.run("train", DRMLAB + ["train", *run_args, "--out", str(whole)], limits["train"])
        log.run(
            "eval",
            DRMLAB + ["eval", "--ckpt", str(whole), "--device", args.device, "--eval-tokens", EVAL_TOKENS, "--quiet"],
            limits["eval"],
        )
        log.run(
            "generate",
            DRMLAB
            + [
                "generate",
                "--ckpt",
                str(whole),
                "--prompt",
                "def main(",
                "--max-tokens",
                "64",
                "--temperature",
                "0",
                "--device",
                args.device,
            ],
            limits["generate"],
        )
        _stopped_run(log, stopped, run_args, limits)
        log.save(val_ce={"whole": _val_ce(whole), "stopped_and_resumed": _val_ce(stopped)})
        fsdp = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "-m",
            "drmlab",
            "train",
            "--model",
            "J",
            "--preset",
            "micro",
            "--tokens",
            "100k",
            "--device",
            args.device,
            "--fsdp",
            "--quiet",
            "--out",
            str(Path(tmp) / "J-fsdp"),
        ]
        log.run("fsdp", fsdp, limits["fsdp"])
    failed = [s["step"] for s in log.steps if s["rc"] != 0]
    log.save(finished=time.strftime("%Y-%m-%d %H:%M:%S"), failed=failed)
    print(json.dumps({"failed": failed, "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
