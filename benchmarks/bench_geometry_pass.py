"""What the full ``drmlab geometry`` pass costs on a trained run, instrument by instrument
(``docs/geometry.md`` section 7, "Measured cost").

    python benchmarks/bench_geometry_pass.py --ckpt RUN [--tokens 512] [--threads 1] [--out /tmp/geo]

The run directory is only read: the outputs go to ``--out`` (default: a temporary folder). Prints the
seconds of each instrument and the total (wall clock, this process), and for the connection and the
geodesics what they gave (holonomy angles and curvature estimates, transport and ladder completion
with their sub-steps, the geodesic's convergence, residuals and Hessian-vector products). Absolute
timings on a shared machine move by +-30%; the instruments' own 'seconds' are what the record keeps.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def summary(record: dict) -> list[str]:
    lines = []
    for name, r in record["instruments"].items():
        lines.append(f"{name:<11} {r['seconds']:8.2f} s" + (f"  (failed: {r['failed']})" if "failed" in r else ""))
    c = record["instruments"].get("connection", {})
    for h in c.get("holonomy", []):
        if h.get("angle") is None:
            lines.append(f"holonomy block {h['block']}: no angle ({h.get('failed')})")
        else:
            lines.append(
                f"holonomy block {h['block']}: G-side {h['side']:.3g}, angle {h['angle']:.4g} rad, "
                f"K(s) {h['curvature']:.4g}, K(s/2) {h['curvature_half']:.4g}, consistent {h['consistent']}, "
                f"sub-steps {sum(row['substeps'] for row in h['loops'])}"
            )
    for t in c.get("transport", []):
        lines.append(
            f"transport block {t['block']}: completed {t['completed']}, sub-steps {t['substeps']} "
            f"(+{t['rejected']} rejected), angle transported {t['angle_transported_mean_rad']}, "
            f"untransported {t['angle_untransported_mean_rad']:.4g}"
            + (f"; {t['transport_failed']}" if t.get("transport_failed") else "")
        )
        if "schild" in t:
            lines.append(f"  ladder: {t['schild']}")
    for g in record["instruments"].get("geodesics", {}).get("blocks", []):
        geo = g["geodesic"]
        lines.append(
            f"geodesic block {g['block']}: converged {geo['converged']}, iterations {geo['iterations']}, "
            f"HVPs {geo['hessian_vector_products']}, residual {geo['residual']:.3g}, metric-weighted residual "
            f"{geo['metric_weighted_residual']:.3g}, action {geo['action']}, upper bound {geo['action_upper_bound']:.4g} "
            f"(path {g['path_action']:.4g}, straight line {g['straight_line_action']:.4g}), ratio {g['action_ratio']}, "
            f"largest state norm {geo['state_norm_max']:.3g} (path {g['path_state_norm_max']:.3g})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from drmlab.geometry.run import run_geometry

    out = args.out or tempfile.mkdtemp(prefix="geometry-bench-")
    start = time.perf_counter()
    record, files = run_geometry(args.ckpt, tokens=args.tokens, out=out)
    wall = time.perf_counter() - start
    print("\n".join(summary(record)))
    print(
        f"{record['model']}: instruments {record['seconds']:.1f} s, wall {wall:.1f} s with loading, "
        f"{args.threads} thread(s); written to {out}"
    )


if __name__ == "__main__":
    main()
