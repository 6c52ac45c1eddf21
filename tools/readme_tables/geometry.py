"""The geometry instruments on trained tiny runs (``geometry-tiny``): the learned metric, its agreement with
the decoder's pullback metric, curvature, transport and the geodesic solve, one row per run.
"""

from __future__ import annotations

from .format import markdown_table


def _curvature_cell(h: dict) -> str:
    """K(s) / K(s/2) of a small-loop holonomy, and whether the two loop sizes agree."""
    if h.get("curvature") is None:
        return "no angle"
    return f"{h['curvature']:.3g} / {h['curvature_half']:.3g}" + ("" if h.get("consistent") else " (not consistent)")


def _geometry_table(studies: dict[str, dict]) -> str:
    """The geometry instruments on trained tiny runs (docs/geometry.md section 10): per run the learned
    metric's spectrum and ranks, its agreement with the decoder's pullback metric, the small-loop
    curvatures, and whether transport and the geodesic solve gave a number."""
    runs = studies["geometry-tiny"]["runs"]
    rows = []
    for name in sorted(runs):
        r = runs[name]
        m, pb, ag, conn = r["metric"], r["pullback"], r["agreement"], r["connection"]
        transport = conn["transport"]
        geo = r["geodesics"][0]
        rows.append(
            [
                name,
                f"{r['val_ce']:.4f}",
                f"{m['eigenvalue_min']:.1e} / {m['eigenvalue_max']:.1e}",
                f"{m['numerical_rank_approx']['rank_rtol_1e-02']:g} / {m['exact_rank'][0]}",
                f"{pb['numerical_rank_approx']['rank_rtol_1e-02']:.1f}",
                f"{ag['energy_log_pearson']:+.2f}",
                f"{ag['principal_angle_largest_mean_rad']:.3f} ({ag['random_subspace_largest_angle_rad']:.3f})",
                "; ".join(_curvature_cell(h) for h in conn["holonomy"]),
                "no directions"
                if not transport
                else ("all completed" if all(t["completed"] for t in transport) else "stopped at the cap"),
                "converged" if geo["converged"] else f"not converged (residual {geo['residual']:.2f})",
                f"{geo['path_action'] / geo['action_upper_bound']:.1e}",
            ]
        )
    header = [
        "run",
        "val CE",
        "G eigenvalues min / max",
        "rank of G at rtol 1e-2 (approx.) / exact",
        "rank of G_pb at rtol 1e-2 (approx.)",
        "energies G vs G_pb, log Pearson",
        "top-8 subspace angle (random)",
        "curvature K(s) / K(s/2), block starts 0; 1",
        "transport of the directions",
        "geodesic, block 0",
        "path action / best action found",
    ]
    return markdown_table(header, ["---"] + ["---:"] * 6 + ["---", "---", "---", "---:"], rows)
