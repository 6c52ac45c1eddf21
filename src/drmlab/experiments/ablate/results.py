"""The numbers of an ablation study (docs/drm.md section A.7): each model's lr sweep so far
(:func:`sweep_results`), the finished runs with their curves (:func:`collect_runs`), per-model mean +-
population std and per-seed values, the promotion gate of :mod:`drmlab.experiments.stats` for every
ordered pair (:func:`summarize`), and the report they make (:func:`collect_results`,
:func:`write_results`, through :mod:`drmlab.experiments.ablate.report`)."""

from __future__ import annotations

from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate import report as ablate_report
from drmlab.experiments.ablate.study import STUDY_FILE, Study, run_dir, tuning_dir
from drmlab.experiments.spec import Log
from drmlab.experiments.stats import GATE_RULE, gate, mean_std


def sweep_results(out: str | Path, study: Study | dict) -> dict[str, dict]:
    """Each model's sweep so far: ``{model: {"scores": {rate label: tuning CE or None}, "complete":
    every rate finished or diverged, "lr": the chosen rate (None until complete), "edge", "edge_side",
    "diverged"}}``; {} for a study without a grid."""
    from drmlab.runs import RunDir

    grid = study.lr_grid if isinstance(study, Study) else study.get("lr_grid")
    models = study.models if isinstance(study, Study) else study["models"]
    if not grid:
        return {}
    sweeps = {}
    for model in models:
        scores, finished = {}, 0
        for lr in grid:
            run = RunDir(tuning_dir(out, model, lr))
            summary = run.read_summary() or {}
            done = summary.get("finished") and summary.get("val_ce") is not None
            stopped = summary.get("stopped") in ("non-finite", "diverged")
            scores[lr] = summary["val_ce"] if done else None
            finished += bool(done or stopped)
        complete = finished == len(grid)
        choice = lr_sweep.choose(scores) if complete else {"lr": None, "edge": False, "edge_side": None, "diverged": []}
        sweeps[model] = {
            "scores": {lr_sweep.lr_label(lr): v for lr, v in scores.items()},
            "complete": complete,
            **choice,
        }
    return sweeps


def collect_runs(out: str | Path, study: dict) -> list[dict]:
    """Every finished run of the recorded ``study`` under ``out/runs``, with its curves (training loss and
    sampled validation CE, downsampled: :func:`drmlab.experiments.results.curves`)."""
    from drmlab.experiments.results import curves
    from drmlab.runs import RunDir

    runs = []
    for model in study["models"]:
        for seed in study["seeds"]:
            run = RunDir(run_dir(out, model, seed))
            summary = run.finished_summary()
            if summary is None:
                continue
            rows = run.read_metrics()
            marks = [r for r in rows if r.get("kind") == "milestone"]
            milestones = [(r["tokens"], r["val_ce"], r["val_bpb"]) for r in marks]
            # the seconds of each evaluation (milestones, then the final one), where the run timed them all:
            # a study continued from this record (--restore) counts its evaluations still to come from them
            timed = [r.get("eval_seconds") for r in marks] + [summary.get("eval_seconds")]
            evals = {"eval_seconds": timed} if all(t is not None for t in timed) else {}
            runs.append(
                {
                    "model": model,
                    "seed": seed,
                    "params": summary["params"],
                    "val_ce": summary["val_ce"],
                    "val_bpb": summary["val_bpb"],
                    "tokens": summary["tokens"],
                    "tokens_per_s": summary["tokens_per_s"],
                    "train_seconds": summary["train_seconds"],
                    "curves": curves(rows),
                    "milestones": milestones,
                }
                | ({"wall_seconds": summary["elapsed"]} if summary.get("elapsed") is not None else {})
                | evals
            )
    return runs


def _milestone_means(rows: list[dict]) -> list[dict]:
    """Mean +- std over seeds of the rescored CE and bits/byte at each milestone every run reached."""
    marks = sorted({t for r in rows for t, _, _ in r.get("milestones", [])})
    out = []
    for tokens in marks:
        values = [(ce, bpb) for r in rows for t, ce, bpb in r.get("milestones", []) if t == tokens]
        if len(values) == len(rows):
            ce, ce_std = mean_std([v[0] for v in values])
            bpb, bpb_std = mean_std([v[1] for v in values])
            out.append(
                {
                    "tokens": tokens,
                    "ce_mean": ce,
                    "ce_std": ce_std,
                    "bpb_mean": bpb,
                    "bpb_std": bpb_std,
                    "n_seeds": len(values),
                }
            )
    return out


def summarize(runs: list[dict], models: list[str]) -> tuple[dict, list[dict]]:
    """(per-model statistics, the gate for every ordered pair of models with runs)."""
    per_model = {}
    for model in models:
        rows = [r for r in runs if r["model"] == model]
        if not rows:
            continue
        ce_mean, ce_std = mean_std([r["val_ce"] for r in rows])
        bpb_mean, bpb_std = mean_std([r["val_bpb"] for r in rows])
        speeds = [r["tokens_per_s"] for r in rows if r["tokens_per_s"]]
        per_model[model] = {
            "params": rows[0]["params"],
            "n_seeds": len(rows),
            "ce_mean": ce_mean,
            "ce_std": ce_std,
            "ce_min": min(r["val_ce"] for r in rows),
            "ce_max": max(r["val_ce"] for r in rows),
            "bpb_mean": bpb_mean,
            "bpb_std": bpb_std,
            "tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
            "per_seed": {r["seed"]: r["val_ce"] for r in rows},
            "milestones": _milestone_means(rows),
        }
    gates = []
    for cand in per_model:
        for base in per_model:
            if cand != base:
                gates.append(
                    dict(
                        candidate=cand, baseline=base, **gate(per_model[cand]["per_seed"], per_model[base]["per_seed"])
                    )
                )
    return per_model, gates


def collect_results(out: str | Path) -> dict:
    """The study under ``out`` as numbers: its record, per-model statistics, runs, gates, completeness, and
    the provenance of this collection (:func:`drmlab.experiments.results.provenance`)."""
    from drmlab.experiments.results import provenance
    from drmlab.runs import read_json

    study = read_json(Path(out) / STUDY_FILE)
    runs = collect_runs(out, study)
    per_model, gates = summarize(runs, study["models"])
    sweeps = sweep_results(out, study)
    for model, stats in per_model.items():
        stats["lr"] = sweeps[model]["lr"] if sweeps else (study.get("rates") or {}).get(model, study["train"]["lr"])
    results = {
        "provenance": provenance(study),
        "study": study,
        "models": per_model,
        "runs": runs,
        "gate": gates,
        "gate_rule": dict(GATE_RULE),
        "complete": len(runs) == len(study["models"]) * len(study["seeds"]),
    }
    if sweeps:
        results["lr_sweep"] = sweeps
    return results


def write_results(out: str | Path, log: Log | None = None) -> dict:
    """(Re)write the report of the finished runs under ``out``; return the results."""
    results = collect_results(out)
    ablate_report.write_report(results, out, log=log)
    return results
