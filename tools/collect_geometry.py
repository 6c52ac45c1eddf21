"""Collect the geometry study (docs/geometry.md section 10) into docs/studies/geometry-tiny.

Reads every run folder STUDY/MODEL-seedS that has a ``summary.json`` and a ``geometry-v2/geometry.json``
(written by the two commands in the record's provenance) and writes the run's entry: the scalar
findings of each instrument, without the spectra, diagrams and per-step lists that stay in the study
folder. Entries already committed whose run folders are not here are kept as they are (a study
continued on another machine adds its seeds without losing the earlier ones).

    python tools/collect_geometry.py --study studies/geometry [--how TEXT] [--commit HASH]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from drmlab.experiments.results import source_commit, write

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "geometry-tiny" / "results.json"
MODELS = ("J", "J_NO_DIRECTION", "J_METRIC_SUBSPACE")

KEEP = {
    "metric": (
        "exact_rank",
        "kernel_dim",
        "numerical_rank_approx",
        "eigenvalue_min",
        "eigenvalue_max",
        "condition_number_mean",
        "pinv_vs_woodbury_max_rel",
    ),
    "pullback": ("how", "exact_rank_bound", "numerical_rank_approx", "trace_mean", "eigenvalue_max"),
    "agreement": (
        "steps",
        "energy_log_pearson",
        "energy_spearman",
        "energy_learned_mean",
        "energy_pullback_mean",
        "subspace_k",
        "principal_angle_largest_mean_rad",
        "random_subspace_largest_angle_rad",
    ),
    "topology": ("landmarks", "diameter", "threshold", "betti_at_threshold", "longest_h1"),
}
HOLONOMY = (
    "block",
    "side",
    "angle",
    "area",
    "curvature",
    "curvature_half",
    "curvature_extrapolated",
    "consistent",
    "resolved",
)
TRANSPORT = (
    "block",
    "segments",
    "segment_g_length_max",
    "completed",
    "angle_transported_mean_rad",
    "angle_untransported_mean_rad",
    "transport_failed",
    "schild_failed",
    "schild_vs_ode_angle_rad",
)
GEODESIC = (
    "block",
    "path_action",
    "path_length",
    "action_ratio",
    "straight_line_action",
    "path_state_norm_max",
    "converged",
    "iterations",
    "residual",
    "residual_abs",
    "action",
    "metric_weighted_residual",
    "hessian_vector_products",
    "action_upper_bound",
    "state_norm_max",
)


def _pick(row: dict, keys: tuple[str, ...]) -> dict:
    return {k: row[k] for k in keys if k in row}


def run_entry(run: Path) -> dict:
    """The committed entry of one run folder."""
    summary = json.loads((run / "summary.json").read_text())
    geo = json.loads((run / "geometry-v2" / "geometry.json").read_text())
    inst = geo["instruments"]
    entry = {
        "model": summary["model"],
        "seed": summary["seed"],
        "val_ce": summary["val_ce"],
        "steps": summary["steps"],
        "tokens_measured": geo["tokens"],
        "windows": geo["windows"],
    }
    for name, keys in KEEP.items():
        entry[name] = _pick(inst[name], keys)
    entry["connection"] = {
        "holonomy": [_pick(h, HOLONOMY) for h in inst["connection"]["holonomy"]],
        "transport": [_pick(t, TRANSPORT) for t in inst["connection"]["transport"]],
    }
    # each block's solve result (row["geodesic"]) beside the model path's own figures, on one level
    entry["geodesics"] = [_pick({**g, **g.get("geodesic", {})}, GEODESIC) for g in inst["geodesics"]["blocks"]]
    entry["seconds"] = {name: inst[name]["seconds"] for name in inst}
    entry["notes"] = geo["notes"]
    return entry


def collect(study: Path, record: dict) -> dict:
    runs = dict(record.get("runs", {}))
    for run in sorted(study.glob("*-seed*")):
        if (run / "summary.json").is_file() and (run / "geometry-v2" / "geometry.json").is_file():
            runs[run.name] = run_entry(run)
    record["runs"] = {name: runs[name] for name in sorted(runs)}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("studies/geometry"))
    parser.add_argument("--how", help="replace the provenance's 'how' line")
    parser.add_argument("--commit", help="the commit whose instruments measured the new runs")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text())
    record = collect(args.study, record)
    seeds = sorted({r["seed"] for r in record["runs"].values()})
    models = [m for m in MODELS if any(r["model"] == m for r in record["runs"].values())]
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(map(str, seeds))
    record["title"] = (
        "The geometry instruments (docs/geometry.md) on DRM runs trained at the protocol's tiny settings: "
        f"{', '.join(models)}, {seed_text}"
    )
    prov = record["provenance"]
    if args.how:
        prov["how"] = args.how
    if args.commit:
        prov["commit"] = args.commit
    else:
        prov["commit"] = source_commit()
    prov["date"] = datetime.date.today().isoformat()
    write(RECORD, record)
    print(f"{RECORD.relative_to(ROOT)}: {len(record['runs'])} runs ({seed_text})")


if __name__ == "__main__":
    main()
