"""The one GPU suite: every recurrence and model of drmlab timed on one GPU in under 8 minutes.

    python benchmarks/gpu_suite.py --out gpu-results          # on a CUDA machine (budget 450 s)
    python benchmarks/gpu_suite.py --smoke --out /tmp/smoke   # every section at tiny sizes on the CPU

Writes ``OUT/gpu_suite.json`` (every number, every error) and ``OUT/gpu_suite.md`` (the tables).
Sections, in the order they run (each in its own Python process, so that a crashed kernel, an
out-of-memory or a hung compile loses one section, not the suite):

* ``environment`` -- torch, CUDA device, Triton, flash-linear-attention (fla), the backends each
  operator picks on this device, whether the C kernels are built.
* ``scan`` -- ``drmlab.ops.linear_scan`` (m_t = f_t m_{t-1} + u_t, ``docs/drm.md`` section 9)
  forward and forward+backward for each backend that runs here (``"triton"``, ``"torch"``, ...) in
  float32, bfloat16 inputs and complex64, as a ratio to the copy-bandwidth floor: one
  elementwise pass ``f * m + u`` over tensors of the same size (forward), and that pass with
  autograd (forward+backward), timed in the same process. The max abs error against a float64
  run of the ``"torch"`` backend (itself held to the sequential loop by the tests) is recorded
  for the forward and for the gradients. When fla is installed, its HGRN kernels
  (``chunk_hgrn``, ``fused_recurrent_hgrn``: h_t = exp(g_t) h_{t-1} + x_t) are timed on the same
  sizes with g = log f.
* ``selective_scan`` -- Mamba's selective scan (Gu & Dao 2023, Algorithm 2) for each backend
  (``"triton"``: fused, states never stored; ``"torch"``: chunks of linear_scan), forward and
  forward+backward, the ratio of each to the chunked torch path, the error against float64, and
  the peak memory of each.
* ``training_eager`` / ``training_compiled`` -- tokens/s of the training step at preset 125m
  (the preset's micro-batch, accumulation and sequence length; AdamW, clipping, bf16 autocast)
  for J, J_NO_DIRECTION, SSM_CONTROL, GPT2 (Hugging Face, SDPA attention), MAMBA and RESOLVENT,
  eager and under ``torch.compile(fullgraph=True)`` (``drmlab.training.compiling``, what
  ``drmlab train --compile`` uses). The step is the trainer's (``targets_loss``,
  ``build_optimizer``, ``LMWindows``) without the run directory; the rate is the median over the
  steps after the warm-up ones (a compiled model compiles in its first step and again in its
  second, when the step number becomes dynamic); the first steps' seconds are recorded as the
  compile cost. Peak GPU memory per model.
* ``decode`` -- ms per generated token after a context of 1k and 32k tokens (parallel prefill,
  then ``model.step``; median of the timed steps after untimed ones), with the decoding state's
  size and the peak memory.

Defensive by design: each item is tried on its own and an error is recorded in the JSON with its
message; each section runs under a time limit and within a global budget (``--budget``), and an
item that would not fit is recorded as skipped; results are written as each item finishes, so a
section killed at its limit keeps what it measured. On a machine without CUDA (and without
``--smoke``) the suite says so in both files and exits 0.

``--smoke`` runs every section at tiny sizes on the CPU (preset micro, contexts of a few tokens,
Triton through its interpreter, the compiled section with one model and the ``eager`` compile
backend), so the script itself is tested (``tests/tools/test_gpu_suite.py``); its numbers mean nothing.

Not run on a GPU when this file was written (the machines had no CUDA): the sizes were chosen for
an H200 (141 GB) by arithmetic, not by measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

JSON_FILE = "gpu_suite.json"
MARKDOWN_FILE = "gpu_suite.md"
TRAIN_MODELS = ("J", "J_NO_DIRECTION", "SSM_CONTROL", "GPT2", "MAMBA", "RESOLVENT")
COMPILE_ORDER = ("J", "MAMBA", "GPT2", "SSM_CONTROL", "J_NO_DIRECTION", "RESOLVENT")  # most wanted first
DECODE_MODELS = ("J", "SSM_CONTROL", "MAMBA", "GPT2", "RESOLVENT")

# Sizes: (full run on one GPU, --smoke on the CPU).
SIZES = {
    "scan": ({"B": 8, "T": 4096, "D": 1024, "repeats": 10}, {"B": 2, "T": 24, "D": 8, "repeats": 1}),
    "selective_scan": (
        {"B": 4, "T": 2048, "E": 1536, "N": 16, "repeats": 5},
        {"B": 1, "T": 12, "E": 4, "N": 2, "repeats": 1},
    ),
    "training": (
        {
            "preset": "125m",
            "warm_eager": 2,
            "warm_compiled": 3,
            "measured": 3,
            "compile_backend": "inductor",
            "compiled_models": COMPILE_ORDER,
            "eager_need_s": 25,
            "compiled_need_s": 100,
        },
        {
            "preset": "micro",
            "warm_eager": 0,
            "warm_compiled": 1,
            "measured": 1,
            "compile_backend": "eager",
            "compiled_models": ("SSM_CONTROL",),
            "eager_need_s": 1,
            "compiled_need_s": 1,
        },
    ),
    "decode": (
        {"preset": "125m", "contexts": (1024, 32768), "warm": 4, "steps": 32, "need_s": 8},
        {"preset": "micro", "contexts": (16, 40), "warm": 2, "steps": 3, "need_s": 0},
    ),
}
# (section, time limit in seconds on a GPU; the smoke run gives each section up to 60 s)
SECTIONS = (
    ("environment", 40),
    ("scan", 60),
    ("selective_scan", 60),
    ("training_eager", 110),
    ("decode", 80),
    ("training_compiled", 480),
)
DEFAULT_BUDGET_S = 450.0  # the whole suite, under 8 minutes with start-up and the final files


# ---------------------------------------------------------------- the orchestrator (no torch here)


def run_sections(args) -> dict:
    """Run each section in a worker process under its limit and the global budget; collect the rows."""
    started = time.time()
    deadline = started + args.budget
    report = {
        "suite": "drmlab benchmarks/gpu_suite.py",
        "smoke": args.smoke,
        "budget_s": args.budget,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "sections": {},
    }
    out = Path(args.out)
    wanted = [s for s, _ in SECTIONS if args.sections is None or s in args.sections]
    for name, limit in SECTIONS:
        if name not in wanted:
            continue
        left = deadline - time.time()
        if left < 5:
            report["sections"][name] = {
                "status": "skipped",
                "error": f"the {args.budget:.0f} s budget was spent",
                "items": [],
            }
            continue
        limit = min(60.0 if args.smoke else limit, left)
        rows_path = out / f".{name}.jsonl"
        rows_path.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            name,
            "--rows",
            str(rows_path),
            "--deadline",
            str(time.time() + limit - 3),
        ] + (["--smoke"] if args.smoke else [])
        env = dict(os.environ)
        if args.smoke and name in ("scan", "selective_scan"):
            env["TRITON_INTERPRET"] = "1"  # the Triton kernels on CPU tensors, through the interpreter
        t0 = time.time()
        section = {"status": "ok", "limit_s": round(limit, 1)}
        try:
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
            try:
                output, _ = proc.communicate(timeout=limit)
                if proc.returncode != 0:
                    section.update(status="error", error=f"worker exited {proc.returncode}: {_tail(output)}")
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                section.update(status="timeout", error=f"stopped at its {limit:.0f} s limit; rows kept: those finished")
        except Exception as exc:  # could not start the worker at all
            section.update(status="error", error=f"{type(exc).__name__}: {exc}")
        section["seconds"] = round(time.time() - t0, 1)
        section["items"] = _read_rows(rows_path)
        rows_path.unlink(missing_ok=True)
        if name == "environment":
            report["environment"] = section["items"][0] if section["items"] else {}
            # no CUDA found: stop here (a failed environment worker is recorded, and the suite goes on)
            if not args.smoke and report["environment"].get("cuda") is False:
                report["cuda"] = False
                report["message"] = (
                    "no CUDA device on this machine: nothing was measured (run with --smoke to test the script)"
                )
                report["sections"][name] = section
                break
        report["sections"][name] = section
        _write(report, out, started)  # after every section: a crash of the orchestrator keeps the rest
    report.setdefault("cuda", report.get("environment", {}).get("cuda"))
    _compiled_over_eager(report)
    _write(report, out, started)
    return report


def _compiled_over_eager(report: dict) -> None:
    """Each compiled training rate as a ratio to the same model's eager rate (two sections, one suite run)."""
    sections = report.get("sections", {})
    eager = {
        item.get("model"): item.get("tok_s")
        for item in sections.get("training_eager", {}).get("items", [])
        if item.get("status") == "ok"
    }
    for item in sections.get("training_compiled", {}).get("items", []):
        if item.get("status") == "ok" and eager.get(item.get("model")):
            item["x_eager"] = item["tok_s"] / eager[item["model"]]


def _tail(text: str | None, n: int = 1500) -> str:
    return (text or "")[-n:].strip()


def _read_rows(path: Path) -> list[dict]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                pass
    return rows


def _write(report: dict, out: Path, started: float) -> None:
    report["elapsed_s"] = round(time.time() - started, 1)
    (out / JSON_FILE).write_text(json.dumps(report, indent=2) + "\n")
    (out / MARKDOWN_FILE).write_text(markdown(report))


def markdown(report: dict) -> str:
    """The report as markdown: one table per section, errors listed under it."""
    lines = [f"# drmlab GPU suite{' (smoke run on CPU: the numbers mean nothing)' if report.get('smoke') else ''}", ""]
    env = report.get("environment", {})
    lines.append(
        f"started {report.get('started')}, {report.get('elapsed_s')} s of a {report.get('budget_s')} s budget; "
        f"device: {env.get('device_name', 'unknown')}; torch {env.get('torch')}, triton {env.get('triton')}, "
        f"fla {env.get('fla')}"
    )
    if report.get("message"):
        lines += ["", f"**{report['message']}**"]
    if env:
        lines += [
            "",
            "backends chosen on this device: " + ", ".join(f"{k} {v}" for k, v in env.get("auto_backends", {}).items()),
        ]
    for name, section in report.get("sections", {}).items():
        if name == "environment":
            continue
        lines += [
            "",
            f"## {name}",
            "",
            f"status {section.get('status')}, {section.get('seconds', 0)} s"
            + (f": {section['error']}" if section.get("error") else ""),
        ]
        items = section.get("items", [])
        if not items:
            continue
        keys = [k for k in COLUMNS.get(name, ()) if any(k in item for item in items)]
        lines += ["", "| " + " | ".join(["item", "status"] + keys) + " |", "|" + "---|" * (len(keys) + 2)]
        for item in items:
            cells = [str(item.get("name")), str(item.get("status"))] + [_fmt(item.get(k)) for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
        problems = [item for item in items if item.get("status") not in ("ok",) and item.get("error")]
        if problems:
            lines += [""] + [f"- {item.get('name')}: {item.get('status')}: {item['error']}" for item in problems]
    return "\n".join(lines) + "\n"


COLUMNS = {
    "scan": ("dtype", "fwd_ms", "fwd_x_floor", "fwd_bwd_ms", "fwd_bwd_x_floor", "fwd_err", "grad_err", "floor_GBps"),
    "selective_scan": ("fwd_ms", "fwd_bwd_ms", "fwd_bwd_x_torch", "fwd_err", "grad_err", "peak_mib"),
    "training_eager": ("params", "tok_s", "first_steps_s", "loss", "peak_mib", "scan_backend", "attention"),
    "training_compiled": ("params", "tok_s", "x_eager", "first_steps_s", "loss", "peak_mib"),
    "decode": ("context", "ms_per_token", "prefill_s", "state_mib", "peak_mib"),
}


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
        return f"{value:.2e}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# ---------------------------------------------------------------- the workers (torch from here on)


class Worker:
    """One section in its own process: items appended to ``rows`` as JSON lines as they finish."""

    def __init__(self, rows: str, deadline: float, smoke: bool):
        import torch

        self.torch = torch
        self.rows, self.deadline, self.smoke = rows, deadline, smoke
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        if not self.cuda:
            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    def left(self) -> float:
        return self.deadline - time.time()

    def record(self, row: dict) -> None:
        with open(self.rows, "a") as handle:
            handle.write(json.dumps(row, default=str) + "\n")

    def item(self, name: str, fn, *, need_s: float = 0.0, **fields) -> dict | None:
        """Run ``fn() -> dict`` as one item; an exception becomes a recorded error, a backend that
        cannot run here ``unavailable``, and an item that would not fit in the time left ``skipped``."""
        from drmlab.ops.backends import BackendUnavailable

        row = {"name": name, **fields}
        if self.left() < need_s:
            row.update(status="skipped", error=f"{self.left():.0f} s left in the section, about {need_s:.0f} s needed")
            self.record(row)
            return row
        t0 = time.time()
        try:
            self.reset_peak()
            row.update(fn())
            row.setdefault("status", "ok")
        except BackendUnavailable as exc:
            row.update(status="unavailable", error=str(exc).splitlines()[0])
        except Exception as exc:
            row.update(
                status="error",
                error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                traceback=traceback.format_exc(limit=6)[-2000:],
            )
        finally:
            if self.cuda:
                self.torch.cuda.empty_cache()
        row["seconds"] = round(time.time() - t0, 2)
        self.record(row)
        return row

    # timing and memory
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float:
        if self.cuda:
            return self.torch.cuda.max_memory_allocated() / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak RSS on the CPU

    def median_ms(self, fn, repeats: int, warmup: int = 1) -> float:
        for _ in range(0 if self.smoke else warmup):  # the smoke run proves the code, not the numbers
            fn()
        self.sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)


# -- environment


def section_environment(w: Worker) -> None:
    def describe():
        torch = w.torch
        info = {
            "torch": torch.__version__,
            "cuda": w.cuda,
            "python": sys.version.split()[0],
            "device_name": torch.cuda.get_device_name(0) if w.cuda else "cpu (no CUDA)",
            "cuda_version": torch.version.cuda,
            "cpu_count": os.cpu_count(),
        }
        if w.cuda:
            props = torch.cuda.get_device_properties(0)
            info.update(capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1))
        for module in ("triton", "fla", "transformers"):
            try:
                info[module] = __import__(module).__version__
            except Exception as exc:
                info[module] = f"not available ({type(exc).__name__})"
        from drmlab.ops import c_kernel_status
        from drmlab.ops.linear_scan import BACKENDS as scan_backends
        from drmlab.ops.selective_scan import BACKENDS as selective_backends

        auto = {}
        for label, table in (("linear_scan", scan_backends), ("selective_scan", selective_backends)):
            runnable = table.runnable(w.device, torch.float32)
            try:
                chosen = table.choose(None, w.device, torch.float32).name
            except Exception as exc:
                chosen = f"none ({type(exc).__name__})"
            auto[label] = f"{chosen} (runnable: {', '.join(runnable) or 'none'})"
        info["auto_backends"] = auto
        info["c_kernels"] = str(c_kernel_status())
        try:
            from drmlab.training import compiling

            info["compile"] = f"drmlab.training.compiling (default backend {compiling.DEFAULT_BACKEND})"
        except ImportError:
            info["compile"] = "torch.compile (drmlab.training.compiling not found)"
        return info

    w.item("environment", describe)


# -- the first-order scan


def _floor_ms(w: Worker, f, u, repeats: int) -> tuple[float, float]:
    """(forward, forward+backward) ms of one elementwise pass f * m + u over tensors of this size."""
    torch = w.torch
    m = torch.randn_like(u)
    fa, ua, ma = (t.detach().clone().requires_grad_() for t in (f, u, m))
    grad = torch.ones_like(u)

    def fwd():
        with torch.no_grad():
            return f * m + u

    def fwd_bwd():
        (fa * ma + ua).backward(grad)
        fa.grad = ua.grad = ma.grad = None

    return w.median_ms(fwd, repeats), w.median_ms(fwd_bwd, repeats)


def section_scan(w: Worker) -> None:
    torch = w.torch
    from drmlab.ops.linear_scan import BACKENDS, linear_scan

    size = SIZES["scan"][1 if w.smoke else 0]
    B, T, D, repeats = size["B"], size["T"], size["D"], size["repeats"]
    gen = torch.Generator(device=w.device).manual_seed(0)
    cases = {"float32": torch.float32, "bfloat16": torch.bfloat16, "complex64": torch.complex64}
    floors: dict = {}
    for label, dtype in cases.items():

        def make(dtype=dtype):
            f = torch.sigmoid(2 * torch.randn(B, T, D, generator=gen, device=w.device))
            u = torch.randn(B, T, D, generator=gen, device=w.device)
            if dtype == torch.complex64:
                phase = torch.rand(B, T, D, generator=gen, device=w.device) * 6.2832
                f = torch.polar(f, phase)
                u = torch.complex(u, torch.randn(B, T, D, generator=gen, device=w.device))
            return f.to(dtype), u.to(dtype)

        f, u = make()
        ref_f, ref_u = (t.to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_() for t in (f, u))
        grad_out = torch.randn(B, T, D, generator=gen, device=w.device)
        grad_out = grad_out.to(torch.complex128) if f.is_complex() else grad_out.double()
        reference = {}

        def floor(f=f, u=u, label=label):
            fwd, fwd_bwd = _floor_ms(w, f, u, repeats)
            floors[label] = (fwd, fwd_bwd)
            moved = 4 * f.numel() * f.element_size()  # read f, m, u; write the result
            return {
                "dtype": label,
                "fwd_ms": fwd,
                "fwd_bwd_ms": fwd_bwd,
                "floor_GBps": moved / (fwd / 1000) / 1e9,
                "shape": [B, T, D],
            }

        w.item(f"floor {label}", floor)

        def reference_run(ref_f=ref_f, ref_u=ref_u, grad_out=grad_out, reference=reference):
            out = linear_scan(ref_f, ref_u, backend="torch")
            out.backward(grad_out)
            reference.update(out=out.detach(), df=ref_f.grad, du=ref_u.grad)
            return {"dtype": "float64 reference (backend torch)"}

        w.item(f"reference {label}", reference_run)
        for backend in BACKENDS.names:

            def measure(backend=backend, f=f, u=u, label=label, grad_out=grad_out, reference=reference):
                fa, ua = f.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
                out = linear_scan(fa, ua, backend=backend)  # raises BackendUnavailable where it cannot run
                g = grad_out.to(out.dtype)  # bf16 inputs give a bf16 result (computed in float32)
                out.backward(g)
                row = {"dtype": label, "shape": [B, T, D]}
                if reference:
                    row["fwd_err"] = float((out.detach().to(reference["out"].dtype) - reference["out"]).abs().max())
                    row["grad_err"] = max(
                        float((fa.grad.to(reference["df"].dtype) - reference["df"]).abs().max()),
                        float((ua.grad.to(reference["du"].dtype) - reference["du"]).abs().max()),
                    )

                def fwd():
                    with torch.no_grad():
                        linear_scan(f, u, backend=backend)

                def fwd_bwd():
                    linear_scan(fa, ua, backend=backend).backward(g)
                    fa.grad = ua.grad = None

                row["fwd_ms"] = w.median_ms(fwd, repeats)
                row["fwd_bwd_ms"] = w.median_ms(fwd_bwd, repeats)
                if label in floors:
                    row["fwd_x_floor"] = row["fwd_ms"] / floors[label][0]
                    row["fwd_bwd_x_floor"] = row["fwd_bwd_ms"] / floors[label][1]
                row["peak_mib"] = w.peak_mib()
                return row

            w.item(f"linear_scan {backend} {label}", measure)
        reference.clear()
    _fla_hgrn(w, B, T, D, repeats, floors)


def _fla_hgrn(w: Worker, B: int, T: int, D: int, repeats: int, floors: dict) -> None:
    """flash-linear-attention's HGRN kernels on the scan's float32 sizes, when fla is installed."""
    torch = w.torch
    try:
        from fla.ops import hgrn as fla_hgrn
    except Exception as exc:
        w.record({"name": "fla hgrn", "status": "unavailable", "error": f"fla is not installed ({type(exc).__name__})"})
        return
    if not w.cuda:
        w.record({"name": "fla hgrn", "status": "unavailable", "error": "fla's kernels need CUDA"})
        return
    gen = torch.Generator(device=w.device).manual_seed(0)
    f = torch.sigmoid(2 * torch.randn(B, T, D, generator=gen, device=w.device))
    x = torch.randn(B, T, D, generator=gen, device=w.device)
    g = torch.log(f)
    for kernel in ("chunk_hgrn", "fused_recurrent_hgrn"):

        def measure(kernel=kernel):
            fn = getattr(fla_hgrn, kernel)
            xa, ga = x.clone().requires_grad_(), g.clone().requires_grad_()
            grad = torch.ones_like(x)

            def fwd():
                with torch.no_grad():
                    fn(x, g)

            def fwd_bwd():
                out = fn(xa, ga)
                (out[0] if isinstance(out, tuple) else out).backward(grad)
                xa.grad = ga.grad = None

            out = fn(x, g)
            out = out[0] if isinstance(out, tuple) else out
            from drmlab.ops.linear_scan import linear_scan

            ref = linear_scan(f.double(), x.double(), backend="torch")
            row = {
                "dtype": "float32",
                "shape": [B, T, D],
                "fwd_err": float((out.double() - ref).abs().max()),
                "fwd_ms": w.median_ms(fwd, repeats),
                "fwd_bwd_ms": w.median_ms(fwd_bwd, repeats),
            }
            if "float32" in floors:
                row["fwd_x_floor"] = row["fwd_ms"] / floors["float32"][0]
                row["fwd_bwd_x_floor"] = row["fwd_bwd_ms"] / floors["float32"][1]
            return row

        w.item(f"fla {kernel} float32", measure)


# -- the selective scan


def section_selective_scan(w: Worker) -> None:
    torch = w.torch
    from drmlab.ops.selective_scan import BACKENDS, selective_scan

    size = SIZES["selective_scan"][1 if w.smoke else 0]
    B, T, E, N, repeats = size["B"], size["T"], size["E"], size["N"], size["repeats"]
    gen = torch.Generator(device=w.device).manual_seed(0)
    inputs = (
        torch.randn(B, T, E, generator=gen, device=w.device),
        torch.rand(B, T, E, generator=gen, device=w.device) * 0.1,
        -torch.rand(E, N, generator=gen, device=w.device) * 4,
        torch.randn(B, T, N, generator=gen, device=w.device),
        torch.randn(B, T, N, generator=gen, device=w.device),
    )
    grad_y = torch.randn(B, T, E, generator=gen, device=w.device)
    reference: dict = {}

    def reference_run():
        leaves = [t.double().requires_grad_() for t in inputs]
        y, _ = selective_scan(*leaves, backend="torch")
        y.backward(grad_y.double())
        reference.update(y=y.detach(), grads=[t.grad for t in leaves])
        return {"dtype": "float64 reference (backend torch)", "peak_mib": w.peak_mib()}

    w.item("reference float64", reference_run)
    timings = {}
    for backend in ["torch"] + [b for b in BACKENDS.names if b != "torch"]:  # the reference point first

        def measure(backend=backend):
            leaves = [t.clone().requires_grad_() for t in inputs]
            y, _ = selective_scan(*leaves, backend=backend)
            y.backward(grad_y)
            row = {"dtype": "float32", "shape": {"B": B, "T": T, "E": E, "N": N}}
            if reference:
                row["fwd_err"] = float((y.detach().double() - reference["y"]).abs().max())
                row["grad_err"] = max(
                    float((t.grad.double() - r).abs().max()) for t, r in zip(leaves, reference["grads"])
                )

            def fwd():
                with torch.no_grad():
                    selective_scan(*inputs, backend=backend)

            def fwd_bwd():
                selective_scan(*leaves, backend=backend)[0].backward(grad_y)
                for t in leaves:
                    t.grad = None

            row["fwd_ms"] = w.median_ms(fwd, repeats)
            w.reset_peak()
            row["fwd_bwd_ms"] = w.median_ms(fwd_bwd, repeats)
            row["peak_mib"] = w.peak_mib()
            timings[backend] = row["fwd_bwd_ms"]
            if "torch" in timings:
                row["fwd_bwd_x_torch"] = row["fwd_bwd_ms"] / timings["torch"]
            return row

        w.item(f"selective_scan {backend}", measure)


# -- training throughput


def _train_rate(w: Worker, name: str, size: dict, *, compiled: bool) -> dict:
    import numpy as np

    torch = w.torch
    from drmlab.models import build_model, count_parameters
    from drmlab.ops.linear_scan import backend_for
    from drmlab.training.batches import LMWindows
    from drmlab.training.config import resolve_train_config
    from drmlab.training.optim import build_optimizer
    from drmlab.training.trainer import targets_loss

    cfg = resolve_train_config(size["preset"], bf16=True)
    model = build_model(name, size["preset"], vocab_size=256, seed=0).to(w.device)
    net = model
    if compiled:
        try:
            from drmlab.training.compiling import compile_model

            net = compile_model(model, backend=size["compile_backend"])
        except ImportError:
            net = torch.compile(model, fullgraph=True, backend=size["compile_backend"])
    optimizer = build_optimizer(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    stream = np.random.default_rng(0).integers(32, 127, 4_000_000 if not w.smoke else 50_000).astype(np.uint8)
    batches = LMWindows(stream, cfg.batch_size, cfg.seq_len)
    warm = size["warm_compiled" if compiled else "warm_eager"]
    seconds, loss_value = [], None
    for step in range(1, warm + size["measured"] + 1):
        w.sync()
        t0 = time.perf_counter()
        total = 0.0
        for micro in range(cfg.grad_accum):
            inputs, targets = batches.batch(cfg.seed, step, micro)
            loss, _ = targets_loss(net, inputs.to(w.device), targets.to(w.device), step, bf16=cfg.bf16)
            (loss / cfg.grad_accum).backward()
            total += float(loss.detach()) / cfg.grad_accum
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        w.sync()
        seconds.append(time.perf_counter() - t0)
        loss_value = total
    rates = [cfg.tokens_per_step / s for s in seconds[warm:]]
    row = {
        "params": count_parameters(model),
        "tok_s": statistics.median(rates),
        "first_steps_s": sum(seconds[:warm]),
        "loss": loss_value,
        "peak_mib": w.peak_mib(),
        "bf16": cfg.bf16,
        "tokens_per_step": cfg.tokens_per_step,
        "micro_batch": [cfg.batch_size, cfg.seq_len],
        "grad_accum": cfg.grad_accum,
        "scan_backend": backend_for(torch.empty(1, 1, 1, device=w.device)),
    }
    if name == "GPT2":
        row["attention"] = getattr(getattr(getattr(model, "hf", None), "config", None), "_attn_implementation", None)
    if loss_value is None or not np.isfinite(loss_value):
        row.update(status="error", error=f"non-finite training loss {loss_value}")
    return row


def section_training_eager(w: Worker) -> None:
    size = SIZES["training"][1 if w.smoke else 0]
    for name in TRAIN_MODELS:
        w.item(
            f"{name} eager bf16",
            lambda name=name: _train_rate(w, name, size, compiled=False),
            need_s=size["eager_need_s"],
            model=name,
        )


def section_training_compiled(w: Worker) -> None:
    size = SIZES["training"][1 if w.smoke else 0]
    for name in size["compiled_models"]:
        w.item(
            f"{name} compiled bf16",
            lambda name=name: _train_rate(w, name, size, compiled=True),
            need_s=size["compiled_need_s"],
            model=name,
            compile_backend=size["compile_backend"],
        )


# -- decoding


def _state_bytes(state) -> int:
    torch = sys.modules["torch"]
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_bytes(v) for v in state)
    if hasattr(state, "__dict__"):
        return sum(_state_bytes(v) for v in vars(state).values())
    return 0


def section_decode(w: Worker) -> None:
    torch = w.torch
    from drmlab.generation import prefill
    from drmlab.models import build_model

    size = SIZES["decode"][1 if w.smoke else 0]
    contexts, warm, steps = size["contexts"], size["warm"], size["steps"]
    for name in DECODE_MODELS:
        built: dict = {}
        for context in contexts:

            @torch.no_grad()
            def measure(name=name, context=context, built=built):
                if "model" not in built:  # one model for every context
                    overrides = {"n_positions": max(contexts) + warm + steps + 8} if name == "GPT2" else {}
                    built["model"] = (
                        build_model(name, size["preset"], vocab_size=256, seed=0, **overrides).to(w.device).eval()
                    )
                model = built["model"]
                gen = torch.Generator(device="cpu").manual_seed(0)
                tokens = torch.randint(32, 127, (1, context + steps), generator=gen).to(w.device)
                w.sync()
                t0 = time.perf_counter()
                logits, state = prefill(model, tokens[:, : context - warm])
                w.sync()
                prefill_s = time.perf_counter() - t0
                for t in range(context - warm, context):
                    logits, state = model.step(tokens[:, t], state)
                w.sync()
                times = []
                for t in range(steps):
                    t0 = time.perf_counter()
                    logits, state = model.step(tokens[:, context + t], state)
                    w.sync()
                    times.append(time.perf_counter() - t0)
                if not bool(torch.isfinite(logits).all()):
                    raise FloatingPointError("non-finite logits while decoding")
                return {
                    "context": context,
                    "ms_per_token": 1000 * statistics.median(times),
                    "prefill_s": prefill_s,
                    "state_mib": _state_bytes(state) / 2**20,
                    "peak_mib": w.peak_mib(),
                    "dtype": "float32",
                }

            w.item(f"{name} decode {context:,}", measure, need_s=size["need_s"], model=name)


WORKERS = {
    "environment": section_environment,
    "scan": section_scan,
    "selective_scan": section_selective_scan,
    "training_eager": section_training_eager,
    "decode": section_decode,
    "training_compiled": section_training_compiled,
}


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default="gpu-suite", help="folder for gpu_suite.json and gpu_suite.md (default gpu-suite)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="every section at tiny sizes on the CPU (tests the script)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for the whole suite (default {DEFAULT_BUDGET_S:.0f}; smoke 150)",
    )
    parser.add_argument("--sections", default=None, help="a comma-separated subset of: " + ", ".join(WORKERS))
    parser.add_argument("--worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        WORKERS[args.worker](Worker(args.rows, args.deadline, args.smoke))
        return 0
    if args.sections is not None:
        args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        unknown = [s for s in args.sections if s not in WORKERS]
        if unknown:
            parser.error(f"unknown sections {unknown}; known: {', '.join(WORKERS)}")
        if "environment" not in args.sections:
            args.sections.insert(0, "environment")
    if args.budget is None:
        args.budget = 150.0 if args.smoke else DEFAULT_BUDGET_S
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = run_sections(args)
    out = Path(args.out)
    if report.get("message"):
        print(report["message"])
    failed = {name: s["status"] for name, s in report["sections"].items() if s.get("status") != "ok"}
    print(
        f"gpu_suite: {len(report['sections'])} sections in {report['elapsed_s']} s"
        + (f" (not ok: {failed})" if failed else "")
        + f"; wrote {out / JSON_FILE} and {out / MARKDOWN_FILE}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
