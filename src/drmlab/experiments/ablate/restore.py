"""Continue a study on another machine from its collected ``results.json`` (docs/drm.md section A.7,
"Moving a study"): ``drmlab ablate ... --restore RESULTS`` writes the record's study and, for each
finished run and sweep run it holds, a run folder with the summary and the metrics rows the collection reads,
so the study skips them and trains only the rest.

A restored run folder holds ``summary.json`` (marked ``"restored": true``) and a ``metrics.jsonl`` of the
run's collected curves (at most :data:`~drmlab.experiments.results.MAX_POINTS` rows each, which the
collection takes as they are) and milestones, with each evaluation's seconds where the record has them (so
``--status`` times the evaluations still to come): collecting the study again gives the record's numbers for
those runs. It has no checkpoint (nothing to resume, export or rescore from); a half-finished run is not
in a record and trains again from its start.
"""

from __future__ import annotations

from pathlib import Path

from drmlab.experiments import lr_sweep
from drmlab.experiments.ablate.study import STUDY_FILE, run_dir, tuning_dir

__all__ = ["restore_study"]

SUMMARY_KEYS = ("model", "seed", "params", "val_ce", "val_bpb", "tokens", "tokens_per_s", "train_seconds")


def _metrics_rows(run: dict) -> list[dict]:
    """The metrics rows that make ``collect_runs`` give ``run``'s curves and milestones back."""
    rows = []
    for kind, values in (("train", run["curves"]["train"]), ("eval", run["curves"]["eval"])):
        keys = list(values)
        rows += [{"kind": kind, **dict(zip(keys, point))} for point in zip(*(values[k] for k in keys))]
    marks = [{"kind": "milestone", "tokens": t, "val_ce": ce, "val_bpb": bpb} for t, ce, bpb in run["milestones"]]
    timed = run.get("eval_seconds") or []
    if len(timed) == len(marks) + 1:  # each milestone's evaluation time, then the final one's (summary)
        marks = [m | {"eval_seconds": s} for m, s in zip(marks, timed)]
    return rows + marks


def _write_run(folder: Path, summary: dict, rows: list[dict]) -> str:
    """Write one restored run unless its folder already holds something; what was done."""
    import json

    from drmlab.runs import RunDir, write_json_atomic

    run = RunDir(folder)
    if run.finished_summary() is not None:
        return "kept"
    if folder.exists() and any(folder.iterdir()):
        return "left"  # a run of this machine (started, or stopped): it resumes or trains as before
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_json_atomic(folder / "summary.json", summary)
    return "restored"


def restore_study(record: dict, out: str | Path) -> dict[str, int]:
    """Write the study of ``record`` (an ablation study's collected results) under ``out`` with its
    finished runs and sweep runs; counts of runs ``restored``, ``kept`` (already finished here) and
    ``left`` (a folder of this machine's own, untouched). A different study already in ``out`` is refused."""
    from drmlab.runs import read_json, write_json_atomic

    study = record.get("study") if isinstance(record, dict) else None
    if not isinstance(study, dict) or "models" not in study or not isinstance(record.get("runs"), list):
        raise ValueError("not the results.json of an ablation study (it has no study record and runs)")
    out = Path(out)
    here = out / STUDY_FILE
    saved = read_json(here) if here.exists() else None
    if saved is not None and saved != study:
        differ = sorted(k for k in set(study) | set(saved) if study.get(k) != saved.get(k))
        raise ValueError(
            f"{here} records a different study than the results ({', '.join(differ)} differ): a folder restored "
            "from them before, whose settings grew since, goes on without --restore; else restore into another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    if not here.exists():
        write_json_atomic(here, study)
    counts = {"restored": 0, "kept": 0, "left": 0}
    for run in record["runs"]:
        summary = {k: run[k] for k in SUMMARY_KEYS} | {"finished": True, "restored": True}
        if run.get("wall_seconds") is not None:  # the first machine's wall time, as its summary had it
            summary["elapsed"] = run["wall_seconds"]
        if len(run.get("eval_seconds") or []) == len(run["milestones"]) + 1:  # and its final evaluation's time
            summary["eval_seconds"] = run["eval_seconds"][-1]
        counts[_write_run(run_dir(out, run["model"], run["seed"]), summary, _metrics_rows(run))] += 1
    for model, sweep in (record.get("lr_sweep") or {}).items():
        diverged = {lr_sweep.lr_label(float(lr)) for lr in sweep.get("diverged") or []}
        for label, score in sweep["scores"].items():
            if score is not None:
                summary = {"model": model, "seed": study["tune_seed"], "val_ce": score, "finished": True}
            elif label in diverged:
                summary = {"model": model, "seed": study["tune_seed"], "stopped": "diverged"}
            else:
                continue  # not finished where the record was collected: it trains here
            counts[_write_run(tuning_dir(out, model, float(label)), summary | {"restored": True}, [])] += 1
    return counts
