"""The tables (markdown) and plots (PNG) of a geometry record (``docs/geometry.md`` section 7)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_plots", "write_tables"]


def measured(record: dict) -> dict:
    """The instruments of ``record`` that measured (a failed one is stated in the notes instead)."""
    return {name: r for name, r in record["instruments"].items() if "failed" not in r}


def _fmt(x) -> str:
    if x is None:
        return "--"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def write_tables(record: dict) -> str:
    """Markdown: one table of costs, then one per instrument."""
    ins = measured(record)
    lines = [
        f"# Geometry of {record['model']} ({record.get('run', 'in memory')})",
        "",
        (
            f"{record['windows']} windows, {record['tokens']} tokens, d_state {record['d_state']}, "
            f"vocabulary {record['vocab_size']}; float64."
        ),
        "",
    ]
    lines += [f"- {note}" for note in record["notes"]] + ([""] if record["notes"] else [])
    lines += ["| instrument | seconds |", "|---|---:|"]
    lines += [
        f"| {name} | {_fmt(r['seconds'])}{' (failed)' if 'failed' in r else ''} |"
        for name, r in record["instruments"].items()
    ] + [""]
    if "metric" in ins:
        m = ins["metric"]
        pullback = "exact_rank" not in m  # metric="pullback": its rank is only bounded
        lines += [
            "## The model's metric G(z) at block starts" + (" (the decoder pullback)" if pullback else ""),
            "",
            m.get("exact_rank_how", m["note"]) + ".",
            "",
            "| quantity | value |",
            "|---|---:|",
            f"| states | {m['states']} |",
        ]
        if pullback:
            lines += [
                f"| exact rank bound min(d, V - 1) | {m['exact_rank_bound']} |",
                f"| rank at LAPACK's tolerance (approx.) | {m['svd_rank_approx']} |",
            ]
        else:
            lines += [
                f"| exact rank (exact kernel) | {m['exact_rank']} |",
                f"| kernel dimension | {m['kernel_dim']} |",
            ]
        lines += [
            f"| numerical rank, {k.replace('rank_', '')} (approx.) | {_fmt(v)} |"
            for k, v in m["numerical_rank_approx"].items()
        ]
        lines += [
            "| condition number (mean) | "
            + ("infinite (an exact kernel)" if m["condition_number_mean"] is None else _fmt(m["condition_number_mean"]))
            + " |",
            f"| damped pseudo-inverse vs Woodbury (max rel.) | {_fmt(m['pinv_vs_woodbury_max_rel'])} |",
        ]
        if "pinv_vs_model_max_rel" in m:
            lines.append(f"| damped pseudo-inverse vs the model's (max rel.) | {_fmt(m['pinv_vs_model_max_rel'])} |")
        lines.append("")
    if "pullback" in ins:
        p = ins["pullback"]
        lines += [
            "## Decoder pullback metric J^T (diag p - p p^T) J",
            "",
            f"{p['how']}; {p['states']} states.",
            "",
            "| quantity | value |",
            "|---|---:|",
            f"| exact rank bound min(d, V - 1) | {p['exact_rank_bound']} |",
        ]
        lines += [
            f"| numerical rank, {k.replace('rank_', '')} (approx.) | {_fmt(v)} |"
            for k, v in p["numerical_rank_approx"].items()
        ]
        lines += [f"| trace (mean) | {_fmt(p['trace_mean'])} |", ""]
    if "strata" in ins:
        lines += [
            "## Rank strata",
            "",
            "| metric | strata | occupancy | changes | mean dwell |",
            "|---|---|---|---:|---:|",
        ]
        for key, s in ins["strata"].items():
            if isinstance(s, dict):
                occ = ", ".join(f"{k}: {v:.2f}" for k, v in s["occupancy"].items())
                lines.append(f"| {key} | {s['strata']} | {occ} | {s['changes']} | {_fmt(s['mean_dwell'])} |")
        lines.append("")
        if "metric_exact_how" in ins["strata"]:
            lines += [f"metric_exact: {ins['strata']['metric_exact_how']}.", ""]
        if "metric_exact_bound" in ins["strata"]:
            lines += [
                f"The model's metric is the pullback: its exact rank is only bounded, by "
                f"{ins['strata']['metric_exact_bound']}.",
                "",
            ]
    if "agreement" in ins:
        a = ins["agreement"]
        lines += [
            "## Learned metric against the pullback",
            "",
            "| quantity | value |",
            "|---|---:|",
            f"| steps | {a['steps']} |",
            f"| log-energy Pearson | {_fmt(a['energy_log_pearson'])} |",
            f"| energy Spearman | {_fmt(a['energy_spearman'])} |",
            f"| largest principal angle, top-{a['subspace_k']} (rad) | {_fmt(a['principal_angle_largest_mean_rad'])} |",
            f"| same for random subspaces (rad) | {_fmt(a['random_subspace_largest_angle_rad'])} |",
            "",
        ]
    if "connection" in ins:
        c = ins["connection"]
        lines += [
            "## Connection",
            "",
            "Loops sized in G-length (side s, G-area s^2), halved until small against the metric's variation; "
            "the curvature estimate at s and s / 2, consistent when they agree to 25 %.",
            "",
            "| block start | G-side | holonomy angle (rad) | curvature K(s) | K(s / 2) | extrapolated | consistent |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        for h in c["holonomy"]:
            if h.get("angle") is None:
                lines.append(
                    f"| {h['block']} | {_fmt(h.get('side'))} | -- | -- | -- | -- | failed: {h.get('failed')} |"
                )
            else:
                lines.append(
                    f"| {h['block']} | {_fmt(h['side'])} | {_fmt(h['angle'])} | {_fmt(h['curvature'])} | "
                    f"{_fmt(h['curvature_half'])} | {_fmt(h['curvature_extrapolated'])} | {h['consistent']} |"
                )
        if c.get("transport"):
            lines += [
                "",
                "| block -> next | angle to V_i(next), transported (rad) | untransported (rad) | sub-steps | "
                "isometry defect |",
                "|---|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {t['block']} -> {t['block'] + 1} | {_fmt(t['angle_transported_mean_rad'])} | "
                f"{_fmt(t['angle_untransported_mean_rad'])} | {t.get('substeps')} | {_fmt(t.get('isometry_defect'))} |"
                for t in c["transport"]
            ]
            lines += [
                f"\nBlock {t['block']}: {t[key]}."
                for t in c["transport"]
                for key in ("transport_failed", "schild_failed")
                if t.get(key)
            ]
        lines.append("")
    if "geodesics" in ins:
        lines += [
            "## The model's block paths against geodesics",
            "",
            ins["geodesics"]["note"] + ".",
            "",
            "| block | path action | straight line | geodesic action | upper bound (last iterate) | ratio | converged | "
            "residual | metric-weighted residual |",
            "|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        ]
        for g in ins["geodesics"]["blocks"]:
            geo = g["geodesic"]
            lines.append(
                f"| {g['block']} | {_fmt(g['path_action'])} | {_fmt(g.get('straight_line_action'))} | "
                f"{_fmt(geo['action'])} | {_fmt(geo.get('action_upper_bound'))} | {_fmt(g['action_ratio'])} | "
                f"{geo['converged']} | {_fmt(geo['residual'])} | {_fmt(geo.get('metric_weighted_residual'))} |"
            )
        lines.append("")
    if "topology" in ins:
        t = ins["topology"]
        lines += [
            "## Persistent homology of the visited states",
            "",
            (
                f"{t['landmarks']} landmarks, diameter {_fmt(t['diameter'])}, threshold {_fmt(t['threshold'])}: "
                f"bars longer than the threshold {t['betti_at_threshold']}; longest H1 {_fmt(t['longest_h1'])}."
            ),
            "",
        ]
    return "\n".join(lines) + "\n"


def write_plots(record: dict, cache: dict, folder: Path) -> list[Path]:
    """spectra.png (G and G_pb at the first block start), energies.png (log energies under both),
    persistence.png (the diagram); only those whose data the record holds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ins, files = measured(record), []
    spectra = [(name, ins[name]["_spectrum_first"]) for name in ("metric", "pullback") if name in ins]
    if spectra:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, values in spectra:
            ax.semilogy(
                sorted((max(v, 1e-300) for v in values), reverse=True), label="G" if name == "metric" else "G_pb"
            )
        (
            ax.set_xlabel("index"),
            ax.set_ylabel("eigenvalue"),
            ax.legend(),
            ax.set_title("spectra at the first block start"),
        )
        files.append(_save(fig, folder / "spectra.png"))
    if "energies" in cache:
        e_l, e_p = cache["energies"]
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.loglog(e_l.clamp_min(1e-300).numpy(), e_p.clamp_min(1e-300).numpy(), ".", ms=2)
        ax.set_xlabel("v^T G v"), ax.set_ylabel("v^T G_pb v"), ax.set_title("step energies")
        files.append(_save(fig, folder / "energies.png"))
    if "topology" in ins:
        fig, ax = plt.subplots(figsize=(4, 4))
        top = 0.0
        for dim, bars in ins["topology"]["_diagrams"].items():
            finite = [(b, d) for b, d in bars if d != float("inf")]
            if finite:
                ax.plot(*zip(*finite), ".", label=f"H{dim}")
                top = max(top, max(d for _, d in finite))
        ax.plot([0, top], [0, top], "k-", lw=0.5), ax.set_xlabel("birth"), ax.set_ylabel("death"), ax.legend()
        files.append(_save(fig, folder / "persistence.png"))
    return files


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
