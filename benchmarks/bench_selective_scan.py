"""Benchmark of drmlab.ops.selective_scan: the fused C kernel against the chunked torch path.

    python benchmarks/bench_selective_scan.py [--B 32 --T 256 --E 304 --N 16 --repeats 5 --threads 1]

The default shape is one MAMBA layer at preset tiny on a training batch (d_inner 304, d_state
16, 32 x 256 tokens). Prints forward and forward+backward medians (float32) of

* ``backend="torch"``: time chunks of ``linear_scan`` over the flattened (E, N) channels, which
  materialise exp(dt A), (dt x) B and the states as [B, chunk, E * N] tensors (the reference
  point, measured in the same run);
* ``backend="c"``: the fused kernel (state kept in an [N, E] buffer, backward recomputed per
  segment);

as ratios, measured round-robin so load drift affects both alike, plus the peak size of what
each path saves for the backward and the max abs difference of the C result from a float64
run of the reference loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drmlab.ops import c_kernel_status
from drmlab.ops.selective_scan import selective_scan, selective_scan_backend, selective_scan_reference


def inputs(b, t, e, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, e, generator=g, dtype=dtype)
    dt = torch.rand(b, t, e, generator=g, dtype=dtype) * 0.1
    A = -torch.rand(e, n, generator=g, dtype=dtype) * 4
    Bm = torch.randn(b, t, n, generator=g, dtype=dtype)
    Cm = torch.randn(b, t, n, generator=g, dtype=dtype)
    return [v.requires_grad_() for v in (x, dt, A, Bm, Cm)]


def saved_bytes(y) -> int:
    """Bytes held by the autograd graph behind ``y`` (saved tensors, each counted once)."""
    seen, total, stack = set(), 0, [y.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for name in dir(fn):
            if name.startswith("_saved_") or name == "saved_tensors":
                try:
                    value = getattr(fn, name)
                except RuntimeError:
                    continue
                for t in value if isinstance(value, tuple) else (value,):
                    if isinstance(t, torch.Tensor):
                        total += t.numel() * t.element_size()
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=32)
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--E", type=int, default=304)
    parser.add_argument("--N", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x, dt, A, Bm, Cm = inputs(args.B, args.T, args.E, args.N)
    if selective_scan_backend(x) != "c":
        raise SystemExit(f"the C kernel is not available here: {c_kernel_status()['selective_scan']['error']}")
    print(f"B {args.B}, T {args.T}, E {args.E}, N {args.N}, float32, {torch.get_num_threads()} thread(s)")
    times = {b: {"fwd": [], "fwd+bwd": []} for b in ("torch", "c")}
    held = {}
    for _ in range(args.repeats + 1):  # the first round warms up
        for backend in ("torch", "c"):
            t0 = time.perf_counter()
            y, h = selective_scan(x, dt, A, Bm, Cm, backend=backend)
            t1 = time.perf_counter()
            held[backend] = saved_bytes(y)
            (y.sum() + h.sum()).backward()
            t2 = time.perf_counter()
            times[backend]["fwd"].append(t1 - t0)
            times[backend]["fwd+bwd"].append(t2 - t0)
    base = {k: statistics.median(v[1:]) for k, v in times["torch"].items()}
    print(f"\n{'path':<8}{'fwd ms':>10}{'fwd+bwd ms':>12}{'x torch fwd':>13}{'x torch f+b':>13}{'saved MB':>10}")
    for backend in ("torch", "c"):
        med = {k: statistics.median(v[1:]) for k, v in times[backend].items()}
        print(
            f"{backend:<8}{1e3 * med['fwd']:>10.1f}{1e3 * med['fwd+bwd']:>12.1f}"
            f"{med['fwd'] / base['fwd']:>13.2f}{med['fwd+bwd'] / base['fwd+bwd']:>13.2f}{held[backend] / 2**20:>10.1f}"
        )
    small = [v.detach()[:2, :64] if v.dim() == 3 else v.detach() for v in (x, dt, A, Bm, Cm)]
    y_c, _ = selective_scan(*small, backend="c")
    y_ref, _ = selective_scan_reference(*(v.double() for v in small))
    print(f"\nmax |C float32 - float64 loop| on 2 x 64 tokens: {(y_c.double() - y_ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
