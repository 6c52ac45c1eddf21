"""The collector of ASM_CM's capacity study (``python tools/capacity_study.py collect``): from the finished
jobs of a study folder (tools/capacity_jobs.py), the bases, per (pairs, fast-weight width) the seeds
collected with their means over the seeds and the cells still pending, and the committed record
(docs/studies/asm-cm-capacity/results.json) around them, with its provenance and units.
"""

from __future__ import annotations

from pathlib import Path

import distance_record  # tools/distance_record.py, beside this file
from capacity_jobs import (
    DEFAULT_SETTINGS,
    PAIRS,
    SEEDS,
    WIDTHS,
    Settings,
    base_dir,
    cell_name,
    commands,
    finished,
    job_record,
    plan,
    read_json_or_empty,
    spec_dir,
)

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "asm-cm-capacity" / "results.json"
READ_KEYS = ("acc", "ci95", "first_acc", "state_bytes")
CONTROL_KEYS = ("acc", "first_acc", "bound_acc")


def collect(study: Path, seeds=SEEDS, pairs=PAIRS, widths=WIDTHS, s: Settings = DEFAULT_SETTINGS) -> dict:
    """The record's numbers: the bases, per (pairs, width) its finished seeds and their means, and the
    unfinished cells (``pending``, with the jobs each still needs)."""
    jobs = plan(study, seeds, pairs, widths, s)
    open_jobs = [job.name for job in jobs if not finished(job)]
    base = {}
    for seed in seeds:
        summary = read_json_or_empty(base_dir(study, seed) / "summary.json")
        if f"base-seed{seed}" not in open_jobs:
            base[str(seed)] = {k: summary[k] for k in ("val_ce", "steps", "params")} | _seconds(
                study, f"base-seed{seed}"
            )
    rows, pending = [], []
    for p in pairs:
        for d in widths:
            runs = {}
            for seed in seeds:
                name = cell_name(p, d, seed)
                missing = [j.split(f"{name}-")[1] for j in open_jobs if j.startswith(f"{name}-")]
                run = (
                    None
                    if missing
                    else distance_record.specialised(spec_dir(study, p, d, seed), READ_KEYS, CONTROL_KEYS)
                )
                if run is None:
                    pending.append(f"{name}: " + ", ".join(missing or ["files"]))
                    continue
                runs[str(seed)] = _compact(run) | {
                    "wall_seconds": {
                        k: _seconds(study, f"{name}-{k}")["wall_seconds"] for k in ("specialise", "reads", "controls")
                    }
                }
            if runs:
                rows.append(
                    {
                        "pairs": p,
                        "fast_weight_dim": d,
                        "state_bytes": _one({r["state_bytes"] for r in runs.values()}, f"p{p}-w{d}: state bytes"),
                        "complete": len(runs) == len(seeds),
                        "mean": _mean(runs),
                        "runs": runs,
                    }
                )
    return {"base": base, "rows": rows, "pending": pending}


def _seconds(study: Path, name: str) -> dict:
    seconds = job_record(study, name).get("seconds")
    return {"wall_seconds": None if seconds is None else round(seconds, 1)}


def _one(values: set, what: str):
    if len(values) != 1:
        raise ValueError(f"{what}: the seeds differ ({sorted(values)})")
    return values.pop()


def _compact(run: dict) -> dict:
    """A cell's run with the decoding state's bytes once (every length leaves the same state)."""
    states = {r.pop("state_bytes") for r in run["reads"].values()}
    return {"state_bytes": _one(states, "state bytes across lengths"), **run}


def _mean(runs: dict) -> dict:
    """Over the seeds of a row: the language CE, every length's all- and first-query accuracy, every
    control's accuracy per length, and how many seeds each control falls in."""

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    first = next(iter(runs.values()))
    return {
        "seeds": sorted(runs, key=int),
        "ce_before": mean(r["ce_before"] for r in runs.values()),
        "ce_after": mean(r["ce_after"] for r in runs.values()),
        "reads": {
            L: {k: mean(r["reads"][L][k] for r in runs.values()) for k in ("acc", "first_acc")} for L in first["reads"]
        },
        "controls": {
            c: {
                "falls": sum(r["controls"][c]["verdict"] == "falls" for r in runs.values()),
                **{L: mean(r["controls"][c][L]["acc"] for r in runs.values()) for L in v if L != "verdict"},
            }
            for c, v in first["controls"].items()
        },
    }


def table(found: dict) -> str:
    """Recall against pairs and state bytes, one line per (pairs, width): the mean all-query accuracy
    per length over the seeds collected."""
    lines = []
    for row in found["rows"]:
        reads = ", ".join(f"{L}: {100 * r['acc']:.1f}%" for L, r in row["mean"]["reads"].items())
        seeds = len(row["mean"]["seeds"])
        lines.append(
            f"{row['pairs']:>2} pairs, width {row['fast_weight_dim']:>3}, {row['state_bytes']:,} B: {reads} ({seeds} seeds)"
        )
    return "\n".join(lines)


def record(found: dict, seeds, pairs, widths, machine: str, how: str, s: Settings = DEFAULT_SETTINGS) -> dict:
    from drmlab.experiments.mqar.controls import binding_levels
    from drmlab.experiments.results import provenance

    return {
        "title": "ASM_CM's recall against pairs and state bytes at up to 32,768 tokens in the byte vocabulary: "
        "drmlab specialise at ten times the recipe's rates at 8, 16 and 32 pairs and two fast-weight widths, "
        "per seed, with the read-off, write-off and shuffled-key controls",
        "provenance": provenance(commands(s), command="python tools/capacity_study.py run (the commands in settings)")
        | {
            "machine": machine,
            "how": how,
            "source": "the runs' summary.json and specialise.json, the reads' results.json and the study's "
            "jobs/*.json (not committed), by tools/capacity_study.py collect",
        },
        "units": {
            "acc": "share of the P query positions per sequence answered by the argmax over the 256 logits, "
            "128 sequences (128 x P targets) per length; lengths from the control, 5P tokens",
            "ci95": "Wilson 95% interval",
            "first_acc": "the first query of each sequence only (128 targets)",
            "bound_acc": "keys_shuffled: share of answers naming the value the queried key now precedes",
            "state_bytes": "the decoding state per sequence after the last token, the same at every length",
            "ce": "nats per byte over the whole validation stream",
            "wall_seconds": "each job's wall time, all its attempts together (two processes at one thread each)",
            "falls": "the seeds in which the control falls (docs/mqar.md section 8.1)",
        },
        "plan": {
            "seeds": list(seeds),
            "pairs": list(pairs),
            "fast_weight_dims": list(widths),
            "controls": list(s.controls),
        },
        "no_binding_levels": {str(p): binding_levels(p) for p in pairs},
        **found,
    }
