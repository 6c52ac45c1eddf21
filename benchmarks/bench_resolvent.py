"""Forward+backward time and peak memory of the torch resolvent operator's paths
(drmlab.resolvent.attention, ``docs/resolvent.md`` section 6), beside the dense evaluation and torch's
scaled_dot_product_attention.

    python benchmarks/bench_resolvent.py [--B 8 --H 6 --S 1024 --d 64] [--reps 5] [--threads N]

Each case runs in its own subprocess (so memory figures do not leak between cases):

* time: forward + backward of ``(out * w).sum()`` (w a fixed random tensor), best and median of
  ``--reps`` runs after one warm-up, as wall time and as process CPU time (all threads; with
  ``--threads 1`` the CPU time is the figure least disturbed by other load on the machine). In the same process, interleaved rep by rep, the same
  measurement of plain ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``; the ratio
  column is best(case) / best(sdpa) from those interleaved runs, which keeps it meaningful on a
  loaded machine. The machine's load average is printed with the table.
* peak RSS: growth of the process's peak resident set (``resource.getrusage`` ru_maxrss) over
  the first forward+backward, measured before anything else ran at full size. It counts every
  allocation of the pass (saved activations, gradients, temporaries), not only the operator's.
* largest tensor: the largest single tensor any op created during one forward+backward,
  recorded with a ``TorchDispatchMode`` -- the direct check of "never materialises [S, S]".

Cases (float32, q, k, v [B, H, S, d], gate magnitude sigmoid-like in [0.8, 1) and phase
[B, 1, S]):

* ``sdpa (torch)``: F.scaled_dot_product_attention, causal.
* ``auto: softmax corner``: resolvent_attention at (beta, qk, g) = (1, 1, 0) -> the sdpa path.
* ``auto: phase-free``: gated, theta = 0, (1, 1, 1) -> flash without phase lanes.
* ``auto: phase-free beta=0.5``: same with beta = 0.5 (the Z^(1-beta) factor).
* ``auto: phased``: gated with phases, (1, 1, 1) -> flash with cos/sin value lanes.
* ``auto: path product``: (0, 0, 1) with phases -> the complex chain through linear_scan.
* ``dense``: the general dense path (materialises [B, H, S, S]) at (1, 1, 1) with phases.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CASES = {
    "sdpa (torch)": None,
    "auto: softmax corner": dict(sw=(1.0, 1.0, 0.0), phase=False, path="auto"),
    "auto: phase-free": dict(sw=(1.0, 1.0, 1.0), phase=False, path="auto"),
    "auto: phase-free beta=0.5": dict(sw=(0.5, 1.0, 1.0), phase=False, path="auto"),
    "auto: phased": dict(sw=(1.0, 1.0, 1.0), phase=True, path="auto"),
    "auto: path product": dict(sw=(0.0, 0.0, 1.0), phase=True, path="auto"),
    "dense": dict(sw=(1.0, 1.0, 1.0), phase=True, path="dense"),
}


def _child(name: str, args) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from drmlab.resolvent.attention import resolvent_attention, select_path

    if args.threads:
        torch.set_num_threads(args.threads)
    B, H, S, d = args.B, args.H, args.S, args.d
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, d, generator=gen).requires_grad_() for _ in range(3))
    w = torch.randn(B, H, S, d, generator=gen)
    u = (0.8 + 0.2 * torch.rand(B, 1, S, generator=gen)).requires_grad_()
    theta = (0.3 * torch.randn(B, 1, S, generator=gen)).requires_grad_()
    spec = CASES[name]

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    if spec is None:
        fn, chosen = sdpa, "sdpa (torch)"
    else:
        ph = theta if spec["phase"] else None
        sw = spec["sw"]

        def fn():
            return resolvent_attention(q, k, v, u, ph, *sw, path=spec["path"], block_bh=args.block_bh)

        chosen = select_path(ph, *sw) if spec["path"] == "auto" else spec["path"]

    def step(f):
        for t in (q, k, v, u, theta):
            t.grad = None
        t0, c0 = time.perf_counter(), time.process_time()
        out = f()
        (out * w).sum().backward()
        return time.perf_counter() - t0, time.process_time() - c0

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step(fn)  # first pass at full size: peak memory
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel() * t.element_size())
            return out

    with Largest():
        out = fn()
        (out * w).sum().backward()

    step(sdpa)
    times, ref = [], []
    for _ in range(args.reps):
        times.append(step(fn))
        ref.append(step(sdpa))
    wall, cpu = [t[0] for t in times], [t[1] for t in times]
    rwall, rcpu = [t[0] for t in ref], [t[1] for t in ref]
    return dict(
        name=name,
        path=chosen,
        best_ms=1e3 * min(wall),
        median_ms=1e3 * statistics.median(wall),
        sdpa_best_ms=1e3 * min(rwall),
        ratio=min(wall) / min(rwall),
        cpu_ms=1e3 * min(cpu),
        sdpa_cpu_ms=1e3 * min(rcpu),
        cpu_ratio=min(cpu) / min(rcpu),
        peak_rss_mb=(rss1 - rss0) / 1024.0,  # ru_maxrss is in KiB on Linux
        largest_tensor_mb=Largest.largest / 2**20,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--H", type=int, default=6)
    p.add_argument("--S", type=int, default=1024)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--block-bh", type=int, default=None, help="flash tile rows of B*H (default: the operator's own choice)"
    )
    p.add_argument("--cases", nargs="*", default=list(CASES), help="subset of case names")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child, args)))
        return

    import torch

    print(
        f"B={args.B} H={args.H} S={args.S} d={args.d} float32, fwd+bwd, reps={args.reps}, "
        f"threads={args.threads or torch.get_num_threads()}, block_bh={args.block_bh or 'auto'}, "
        f"torch {torch.__version__}"
    )
    print(f"load average before: {os.getloadavg()}")
    rows, failed = [], []
    for name in args.cases:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--B",
            str(args.B),
            "--H",
            str(args.H),
            "--S",
            str(args.S),
            "--d",
            str(args.d),
            "--reps",
            str(args.reps),
            "--threads",
            str(args.threads),
        ]
        if args.block_bh:
            cmd += ["--block-bh", str(args.block_bh)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{name}: failed\n{res.stderr[-2000:]}")
            failed.append(name)
            continue
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    hdr = (
        f"| {'case':<26} | {'path':<12} | {'wall ms':>7} | {'median':>6} | {'sdpa*':>5} | "
        f"{'x sdpa':>6} | {'cpu ms':>6} | {'sdpa*':>5} | {'x sdpa':>6} | "
        f"{'peak RSS MB':>11} | {'largest MB':>10} |"
    )
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for r in rows:
        print(
            f"| {r['name']:<26} | {r['path']:<12} | {r['best_ms']:>7.0f} | "
            f"{r['median_ms']:>6.0f} | {r['sdpa_best_ms']:>5.0f} | {r['ratio']:>6.2f} | "
            f"{r['cpu_ms']:>6.0f} | {r['sdpa_cpu_ms']:>5.0f} | {r['cpu_ratio']:>6.2f} | "
            f"{r['peak_rss_mb']:>11.0f} | {r['largest_tensor_mb']:>10.1f} |"
        )
    print("wall ms / cpu ms: best of the reps (perf_counter / process_time, all threads);")
    print("* sdpa: plain scaled_dot_product_attention timed in the same process, interleaved.")
    print(f"load average after: {os.getloadavg()}")
    if failed:
        sys.exit(f"failed cases (no row above): {', '.join(failed)}")


if __name__ == "__main__":
    main()
