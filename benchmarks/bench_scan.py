"""Benchmark of drmlab.ops.linear_scan against one elementwise pass and the memory floor.

    python benchmarks/bench_scan.py [--B 8 --T 1024 --D 256 --repeats 15 --threads 0 --complex]

Prints, in one run, forward and forward+backward times (medians, float32 -- complex64 with
complex gates of modulus < 1 under ``--complex`` --, default
torch thread count unless --threads) for

* ``torch.addcmul(c, a, b)``: one elementwise fused multiply-add pass through torch over tensors
  of the same size (fwd+bwd through autograd: gradients for a, b and c, three more passes).  A
  baseline, not a floor: its backward moves more bytes than the scan's fused reverse scan, so the
  scan can beat it;
* linear_scan on the compiled C kernel (skipped when unavailable);
* linear_scan on the pure-torch backend, the log-depth scan (``linear_scan/log_depth.py``);
* the pure-torch backend it replaced, a loop over time with a reverse-loop backward,
  kept here only as a baseline (:class:`TimeLoop`);
* a naive autograd Python loop indexing ``f[:, t]`` (its backward is O(T^2); it is run at full
  size only if the estimate scaled from T=256 is under 30 s, otherwise the estimate is printed);

each as ratios: to the ``addcmul`` pass, to the C kernel, and to the memory floor -- the bytes the scan must
move (forward: read f and u, write m, 3 tensors; backward: read f, m and dm, write du and df,
5 tensors) divided by the copy bandwidth measured in the same run, ``dst.copy_(src)`` with src
and dst each three [B, T, D] float32 tensors big (the footprint of the six tensors the scan's
forward and backward touch, so the copy runs from the same level of the memory hierarchy).  No
implementation can go below the floor.  Implementations are measured round-robin (one repeat of
each per round) so drift in machine load affects them alike.  Also prints the max abs error of
the float32 results against a float64 sequential loop, and the number of aten operations the two
pure-torch scans dispatch for one forward + backward at T = 256 and T = 4,096 (B = 1, D = 2,
counted with a TorchDispatchMode; views included): what a GPU pays per launch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from drmlab.ops import c_kernel_status, linear_scan
from drmlab.ops.linear_scan import log_depth

# [B, T, D] tensors read + written by the scan: forward (f, u -> m), backward (f, m, dm -> du, df)
FWD_TENSORS, BWD_TENSORS = 3, 5
ELEMENTWISE = "addcmul (1 torch pass)"
LOG_DEPTH = "linear_scan (torch)"
OLD_LOOP = "time loop (torch, old)"
C_KERNEL = "linear_scan (C)"


def naive_loop(f, u):
    m = torch.zeros_like(u[:, 0])
    outs = []
    for t in range(u.shape[1]):
        m = f[:, t] * m + u[:, t]
        outs.append(m)
    return torch.stack(outs, 1)


def loop64(f, u):
    m = torch.zeros_like(u[:, 0])
    outs = []
    for ft, ut in zip(f.unbind(1), u.unbind(1)):
        m = ft * m + ut
        outs.append(m)
    return torch.stack(outs, 1)


class TimeLoop(torch.autograd.Function):
    """The pure-torch backend before the log-depth scan, as a baseline: one addcmul per step forward
    (m_t = f_t m_{t-1} + u_t, m_{-1} = 0) and one per step backward
    (g_t = dm_t + conj(f_{t+1}) g_{t+1}, df_t = g_t conj(m_{t-1})), so about 2 T dispatched
    kernels.  Inputs f, u: [B, T, D] of one dtype."""

    @staticmethod
    def forward(ctx, f, u):
        out = torch.empty_like(u)
        fs, us, ms = f.unbind(1), u.unbind(1), out.unbind(1)
        ms[0].copy_(us[0])
        for t in range(1, u.shape[1]):
            torch.addcmul(us[t], fs[t], ms[t - 1], out=ms[t])
        ctx.save_for_backward(f, out)
        return out

    @staticmethod
    def backward(ctx, dm):
        f, m = ctx.saved_tensors
        fc = f.conj() if f.is_complex() else f
        du = torch.empty_like(m)
        fs, gs, us = fc.unbind(1), dm.unbind(1), du.unbind(1)
        T = m.shape[1]
        us[T - 1].copy_(gs[T - 1])
        for t in range(T - 2, -1, -1):
            torch.addcmul(gs[t], fs[t + 1], us[t + 1], out=us[t])
        mc = m.conj() if m.is_complex() else m
        df = torch.empty_like(m)
        torch.mul(du[:, 1:], mc[:, :-1], out=df[:, 1:])
        df[:, 0].zero_()
        return df, du


def time_loop_scan(f, u):
    return TimeLoop.apply(f, u)


def log_depth_scan(f, u):
    """The "torch" backend's forward and backward called directly (through linear_scan they run
    inside one custom operator, whose inner operations a dispatch mode does not see)."""
    return LogDepth.apply(f, u)


class LogDepth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, f, u):
        m = log_depth.forward(f, u, None)
        ctx.save_for_backward(f, m)
        return m

    @staticmethod
    def backward(ctx, dm):
        f, m = ctx.saved_tensors
        du, df, _ = log_depth.backward(f, m, None, dm, True, False)
        return df, du


def count_dispatched_ops(scan, T: int) -> tuple[int, int]:
    """(aten operations, of which not views) dispatched by one forward + backward of ``scan``
    at [1, T, 2]; views launch no kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        calls = views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.calls += 1
            Counter.views += func.is_view
            return func(*args, **(kwargs or {}))

    f = torch.rand(1, T, 2, requires_grad=True)
    u = torch.randn(1, T, 2, requires_grad=True)
    with Counter():
        y = scan(f, u)
        torch.autograd.grad(y, (f, u), torch.ones_like(y))
    return Counter.calls, Counter.calls - Counter.views


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--D", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=0, help="torch.set_num_threads(N) first (default: leave torch's default)"
    )
    p.add_argument(
        "--complex",
        action="store_true",
        help="complex64 gates and inputs (the memory floor still counts float32 bytes)",
    )
    p.add_argument(
        "--skip-naive-backward",
        action="store_true",
        help="report the naive loop's backward as the scaled estimate only",
    )
    args = p.parse_args()
    B, T, D = args.B, args.T, args.D
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    f = torch.sigmoid(2 * torch.randn(B, T, D))
    u = torch.randn(B, T, D)
    c = torch.randn(B, T, D)
    g = torch.randn(B, T, D)
    if args.complex:
        f = torch.polar(f, 2 * torch.pi * torch.rand(B, T, D))
        u, c, g = (torch.complex(x, torch.randn(B, T, D)) for x in (u, c, g))
    wide = torch.complex128 if args.complex else torch.float64
    fr, ur, cr = (x.clone().requires_grad_() for x in (f, u, c))

    status = c_kernel_status()["linear_scan"]
    c_ok = status["available"]

    def fwd_bwd(fn, inputs):
        def run():
            y = fn(*inputs)
            torch.autograd.grad(y, inputs, g)

        return run

    impls = {
        ELEMENTWISE: (lambda: torch.addcmul(c, f, u), fwd_bwd(lambda a, b, x: torch.addcmul(x, a, b), (fr, ur, cr))),
    }
    if c_ok:
        impls[C_KERNEL] = (
            lambda: linear_scan(f, u, backend="c"),
            fwd_bwd(lambda a, b: linear_scan(a, b, backend="c"), (fr, ur)),
        )
    impls[LOG_DEPTH] = (
        lambda: linear_scan(f, u, backend="torch"),
        fwd_bwd(lambda a, b: linear_scan(a, b, backend="torch"), (fr, ur)),
    )
    impls[OLD_LOOP] = (
        lambda: time_loop_scan(f, u),
        fwd_bwd(time_loop_scan, (fr, ur)),
    )

    # the copy that measures the bandwidth: as many bytes as the scan's six tensors hold
    src = torch.randn(3 * B * T * D)
    dst = torch.empty_like(src)
    copy = ("copy", lambda: dst.copy_(src))

    # warm up (also builds / loads the C kernel)
    copy[1](), copy[1]()
    for fwd, fb in impls.values():
        fwd(), fb(), fwd(), fb()

    times = {name: ([], []) for name in impls}
    copy_times = []
    for _ in range(args.repeats):
        copy_times.append(timed(copy[1]))
        for name, (fwd, fb) in impls.items():
            times[name][0].append(timed(fwd))
            times[name][1].append(timed(fb))
    rows = {name: (statistics.median(a) * 1e3, statistics.median(b) * 1e3) for name, (a, b) in times.items()}
    copy_bytes = 2 * src.numel() * src.element_size()  # read src + write dst
    bandwidth = copy_bytes / statistics.median(copy_times)  # bytes / s
    tensor_bytes = B * T * D * 4
    floor_fwd = FWD_TENSORS * tensor_bytes / bandwidth * 1e3
    floor_fb = (FWD_TENSORS + BWD_TENSORS) * tensor_bytes / bandwidth * 1e3

    # naive loop: forward at full size.  Its backward is O(T^2) (every SelectBackward writes a
    # full-size zero tensor); time it at a short T_s and scale by (T/T_s)^2, and also measure it
    # at full size when that estimate is under 30 s.
    naive_fwd = statistics.median(timed(lambda: naive_loop(f, u)) for _ in range(3)) * 1e3
    Ts = min(T, 256)
    fs, us, gs = fr[:, :Ts].detach().requires_grad_(), ur[:, :Ts].detach().requires_grad_(), g[:, :Ts]

    def naive_small():
        y = naive_loop(fs, us)
        torch.autograd.grad(y, (fs, us), gs)

    naive_small()
    estimate = statistics.median(timed(naive_small) for _ in range(3)) * (T / Ts) ** 2
    if estimate <= 30.0 and not args.skip_naive_backward:
        naive_fb = timed(fwd_bwd(naive_loop, (fr, ur))) * 1e3
        naive_note = f"measured once at full size (estimate from T={Ts}: {estimate:.1f} s)"
    else:
        naive_fb = estimate * 1e3
        naive_note = f"not run at full size: estimated from T={Ts} x (T/{Ts})^2"
    rows["naive autograd loop"] = (naive_fwd, naive_fb)

    # accuracy against a float64 sequential loop
    f64, u64 = f.to(wide).requires_grad_(), u.to(wide).requires_grad_()
    ref = loop64(f64, u64)
    rdf, rdu = torch.autograd.grad(ref, (f64, u64), g.to(wide))
    errs = {}
    scans = {
        C_KERNEL: lambda a, b: linear_scan(a, b, backend="c"),
        LOG_DEPTH: lambda a, b: linear_scan(a, b, backend="torch"),
        OLD_LOOP: time_loop_scan,
    }
    for name, scan in scans.items():
        if name not in rows:
            continue
        y = scan(fr, ur)
        df, du = torch.autograd.grad(y, (fr, ur), g)
        errs[name] = max(
            (y.to(wide) - ref).abs().max().item(),
            (df.to(wide) - rdf).abs().max().item(),
            (du.to(wide) - rdu).abs().max().item(),
        )

    base_f, base_fb = rows[ELEMENTWISE]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"linear_scan benchmark: B={B} T={T} D={D} {f.dtype}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs (load avg {load:.1f}), "
        f"median of {args.repeats}"
    )
    print(f"C kernel: {'available at ' + str(status['path']) if c_ok else 'unavailable: ' + str(status['error'])}")
    print(
        f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (dst.copy_(src), {copy_bytes / 2**20:.0f} MiB "
        f"read + written); memory floor: fwd {floor_fwd:.2f} ms ({FWD_TENSORS} tensors of "
        f"{tensor_bytes / 2**20:.1f} MiB), fwd+bwd {floor_fb:.2f} ms ({FWD_TENSORS + BWD_TENSORS} tensors)"
    )
    print()
    c_f, c_fb = rows.get(C_KERNEL, (float("nan"), float("nan")))
    print(
        f"| {'implementation':<24} | {'fwd ms':>8} | {'x addcmul':>10} | {'x C':>6} | {'x floor':>7} "
        f"| {'fwd+bwd ms':>10} | {'x addcmul':>10} | {'x C':>6} | {'x floor':>7} | {'max err vs f64':>14} |"
    )
    print(
        f"|{'-' * 26}|{'-' * 10}|{'-' * 12}|{'-' * 8}|{'-' * 9}|{'-' * 12}|{'-' * 12}|{'-' * 8}|{'-' * 9}|{'-' * 16}|"
    )
    for name, (a, b) in rows.items():
        err = f"{errs[name]:.1e}" if name in errs else ""
        print(
            f"| {name:<24} | {a:8.2f} | {a / base_f:10.2f} | {a / c_f:6.2f} | {a / floor_fwd:7.2f} "
            f"| {b:10.2f} | {b / base_fb:10.2f} | {b / c_fb:6.2f} | {b / floor_fb:7.2f} | {err:>14} |"
        )
    if OLD_LOOP in rows:
        (lf, lfb), (of, ofb) = rows[LOG_DEPTH], rows[OLD_LOOP]
        print(f"\nlog-depth torch scan / old time loop: fwd {lf / of:.2f}, fwd+bwd {lfb / ofb:.2f}")
    print()
    print(f"naive autograd loop fwd+bwd: {naive_note}")
    print()
    print("aten ops dispatched by one forward + backward, all (of which not views: kernels), B=1, D=2:")
    for name, scan in ((LOG_DEPTH, log_depth_scan), (OLD_LOOP, time_loop_scan)):
        (short, short_k), (long, long_k) = (count_dispatched_ops(scan, n) for n in (256, 4096))
        print(
            f"  {name:<24} T=256: {short:6,d} ({short_k:5,d})   T=4,096: {long:6,d} ({long_k:5,d})"
            f"   ratio {long / short:.2f} ({long_k / short_k:.2f})"
        )


if __name__ == "__main__":
    main()
