"""Collect the long-context study at tiny into docs/studies/long-context-tiny (docs/guide.md section 9).

Does a model trained on 256-token windows use the text past them? For each model of the field recipe's
protocol at tiny (seed 1, 5,005,312 byte tokens), ``drmlab eval`` scored the validation split twice beside
the run's standard number (non-overlapping 256-token windows, each from a fresh state: its summary.json):
by position over 4,096-token windows, each from a fresh state, and with the state carried through each
document (an attention model, whose key/value cache grows with every token, in windows of the longest it
holds instead, cut at the same document starts). The record keeps each evaluation's totals and its
buckets of positions, and derives three numbers per model (:func:`derived`). Nothing is rounded here; the
table rounds. The eval files' ``data`` (the corpus cache, with machine paths) is not copied.

    python tools/collect_long_context.py --machine "..." --how "..." [--studies studies] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]
NAME = "long-context-tiny"
PROTOCOL = "protocol-tiny-field"
PRESET = "tiny"
SEED = 1
MODELS = ("J", "J_NO_DIRECTION", "SSM_CONTROL", "MAMBA", "GPT2", "RESOLVENT", "LLAMA")
# the two evaluations of each model M: the file it writes under studies/long-context-tiny/M and its command
EVALS = {
    "by_position": (
        "by-position.json",
        f"drmlab eval --ckpt studies/{PROTOCOL}/runs/M-seed{SEED} --by-position --seq-len 4096 --eval-tokens all "
        f"--threads 1 --quiet --output studies/{NAME}/M/by-position.json",
    ),
    "carried": (
        "carried.json",
        f"drmlab eval --ckpt studies/{PROTOCOL}/runs/M-seed{SEED} --carry-state --by-position --eval-tokens all "
        f"--threads 1 --quiet --output studies/{NAME}/M/carried.json",
    ),
}
BUCKET_KEYS = ("lo", "hi", "tokens", "ce", "low", "high")
INSIDE_WINDOW = (128, 256)  # the last bucket of positions inside the 256-token training window
FAR_PAST_WINDOW = (2048, 4096)  # the last bucket of a 4,096-token window


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _check_eval(report: dict, model: str, summary: dict, where: str) -> None:
    """Refuse an eval file that is not of this run as it finished, or not in bytes."""
    expected = {
        "model": model,
        "preset": PRESET,
        "seed": SEED,
        "step": summary["steps"],
        "params": summary["params"],
        "tokens_trained": summary["tokens"],
        "tokenizer": "bytes",
        "data_matches_run": True,
    }
    for key, value in expected.items():
        if report.get(key) != value:
            raise ValueError(f"{where}: {key} is {report.get(key)!r}, the run's is {value!r}")


def bucket_ce(buckets: list[dict], lo: int, hi: int) -> float | None:
    """The CE of the bucket [lo, hi), or None where it is "n/a", unscored or absent."""
    for row in buckets:
        if (row["lo"], row["hi"]) == (lo, hi):
            return row["ce"] if isinstance(row["ce"], float) else None
    return None


def _buckets(report: dict) -> list[dict]:
    return [{key: row.get(key) for key in BUCKET_KEYS} for row in report["buckets"]]


def by_position_entry(report: dict) -> dict:
    """The by-position evaluation: its window, totals, the position table's limit and the buckets. A model
    with a position table shorter than the window is scored only at the positions it reads: ``targets``
    counts those, ``ce`` is theirs, and ``bpb`` is None (drmlab eval gives bits per byte only when every
    target is scored; with the byte tokenizer it is ``ce / ln 2``)."""
    return {
        "seq_len": report["seq_len"],
        "windows": report["windows"],
        "targets": report["targets"],
        "ce": report["ce"],
        "bpb": report.get("bpb"),
        "position_limit": report["position_limit"],
        "position_limit_reason": report["position_limit_reason"],
        "buckets": _buckets(report),
        "seconds": report["seconds"],
    }


def carried_entry(report: dict) -> dict:
    """The carried-state evaluation: its context (``carried``: chunk and lanes of the forward before the
    steps; ``windows``: the window an attention model was scored in, and the note saying so), the
    resets, totals and the buckets (positions counted from each document's start)."""
    if report["context"] == "carried":
        shape = {"chunk": report["chunk"], "lanes": report["lanes"]}
    else:
        shape = {"window": report["window"], "windows": report["windows"]}
    return {
        "context": report["context"],
        **shape,
        "resets": report["resets"],
        "segments": report["segments"],
        "longest_segment": report["longest_segment"],
        "targets": report["targets"],
        "ce": report["ce"],
        "bpb": report.get("bpb"),
        "note": report["note"],
        "buckets": _buckets(report),
        "seconds": report["seconds"],
    }


def derived(entry: dict) -> dict:
    """Three numbers of one model, each None where a part it needs is missing or "n/a":

    * ``lowest``: the by-position bucket (4,096-token windows) with the lowest CE: ``lo``, ``hi``, ``ce``;
    * ``past_window``: CE of the bucket [2048, 4096) minus CE of [128, 256), both by position, nats per
      byte: positive means the loss rises past the 256-token training window, negative that it keeps
      falling;
    * ``carried_gain``: the windowed CE (256-token windows, fresh state) minus the carried CE, nats per
      byte (nats per token: the tokenizer is bytes): what carrying the state through each document gains
      over fresh windows. For an attention model scored in windows it is only what cutting the windows at
      the documents' starts changes.
    """
    by_position = entry.get("by_position")
    lowest = past_window = None
    if by_position is not None:
        scored = [row for row in by_position["buckets"] if isinstance(row["ce"], float)]
        if scored:
            best = min(scored, key=lambda row: row["ce"])
            lowest = {"lo": best["lo"], "hi": best["hi"], "ce": best["ce"]}
        far = bucket_ce(by_position["buckets"], *FAR_PAST_WINDOW)
        inside = bucket_ce(by_position["buckets"], *INSIDE_WINDOW)
        if far is not None and inside is not None:
            past_window = far - inside
    carried = entry.get("carried")
    carried_gain = None if carried is None else entry["windowed"]["ce"] - carried["ce"]
    return {"lowest": lowest, "past_window": past_window, "carried_gain": carried_gain}


def model_entry(studies: Path, model: str) -> dict | None:
    """One model's entry, or None where neither evaluation has written its file yet."""
    run = studies / PROTOCOL / "runs" / f"{model}-seed{SEED}"
    folder = studies / NAME / model
    reports = {part: _read(folder / file) for part, (file, _) in EVALS.items() if (folder / file).is_file()}
    if not reports:
        return None
    summary = _read(run / "summary.json")
    for part, report in reports.items():
        _check_eval(report, model, summary, f"{NAME}/{model}/{EVALS[part][0]}")
    config = run / "config.json"
    first = next(iter(reports.values()))
    seq_len = _read(config)["train"]["seq_len"] if config.is_file() else first["train_seq_len"]
    entry = {
        "params": summary["params"],
        "windowed": {"seq_len": seq_len, "ce": summary["val_ce"], "bpb": summary["val_bpb"]},
        "by_position": by_position_entry(reports["by_position"]) if "by_position" in reports else None,
        "carried": carried_entry(reports["carried"]) if "carried" in reports else None,
    }
    entry["derived"] = derived(entry)
    return entry


def _first_report(studies: Path, model: str) -> Path:
    """The first eval file the model has (the rules it states are the same in every file)."""
    return next(
        studies / NAME / model / file for file, _ in EVALS.values() if (studies / NAME / model / file).is_file()
    )


def head_commit() -> str | None:
    """The checkout's commit (12 hex digits), or None outside a git checkout."""
    done = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def record(studies: Path, machine: str, how: str, commit: str | None = None, date: str | None = None) -> dict:
    """The study's record from the eval files under ``studies``/long-context-tiny and the runs' summaries.
    ``commit``: the code that evaluated (default: this checkout's); the runs' own training commit, where
    their study recorded it, is ``runs.commit``."""
    entries = {model: entry for model in MODELS if (entry := model_entry(studies, model)) is not None}
    if not entries:
        raise FileNotFoundError(f"{studies / NAME}: no model has an eval file yet")
    protocol = studies / PROTOCOL / "results.json"
    trained_at = _read(protocol).get("provenance", {}).get("commit") if protocol.is_file() else None
    first_model = next(iter(entries))
    first_report = _read(_first_report(studies, first_model))
    return {
        "title": "Long context at tiny: the field protocol's seed-1 runs (256-token training window) scored by "
        "position over 4,096-token windows and with the state carried through each document",
        "provenance": {
            "command": f"for M in {' '.join(MODELS)}: " + "; ".join(command for _, command in EVALS.values()),
            "command_recorded": True,
            "commit": commit or head_commit(),
            "date": date or datetime.date.today().isoformat(),
            "how": how,
            "machine": machine,
            "source": f"studies/{NAME}/M/by-position.json and carried.json (drmlab eval's files, their corpus "
            f"description left out) and studies/{PROTOCOL}/runs/M-seed{SEED}/summary.json (the windowed number; "
            "none committed), collected with tools/collect_long_context.py",
        },
        "units": "ce: nats per token = nats per byte (byte tokenizer), validation split; bpb: bits per byte; "
        "buckets: CE per log2 bucket of positions [lo, hi) (a position: the inputs read since a fresh state, "
        'less one), its 95% band (low, high; null with fewer than 2 windows or documents), "n/a" past a '
        "learned position table; seconds: each evaluation's wall time on one thread",
        "runs": {
            "study": PROTOCOL,
            "preset": PRESET,
            "seed": SEED,
            "models": list(MODELS),
            "tokens_trained": first_report["tokens_trained"],
            "train_seq_len": entries[first_model]["windowed"]["seq_len"],
            "commit": trained_at,
        },
        "bucket_rule": first_report["bucket_rule"],
        "band": first_report["band"],
        "derived_rules": {
            "lowest": "the by-position bucket with the lowest CE",
            "past_window": "by-position CE of [2048, 4096) minus CE of [128, 256), nats per byte: positive, the "
            "loss rises past the training window",
            "carried_gain": "windowed CE (256-token windows, fresh state) minus carried CE, nats per byte: what "
            "carrying the state through each document gains; for an attention model scored in windows, only "
            "what cutting them at the documents' starts changes",
        },
        "complete": all(
            model in entries and entries[model]["by_position"] and entries[model]["carried"] for model in MODELS
        ),
        "models": entries,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", default="studies", help="the folder holding long-context-tiny and the runs")
    parser.add_argument("--machine", required=True, help="the machine and its load while the evaluations ran")
    parser.add_argument("--how", required=True, help="how the evaluations were made (processes, threads)")
    parser.add_argument("--commit", help="the commit of the code that evaluated (default: this checkout's)")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "studies" / NAME / "results.json",
        help="where the record goes (default: docs/studies/long-context-tiny/results.json)",
    )
    args = parser.parse_args(argv)
    result = record(Path(args.studies), args.machine, args.how, commit=args.commit)
    write(args.out, result)
    print(f"wrote {args.out}: {len(result['models'])} models, complete: {result['complete']}")


if __name__ == "__main__":
    main()
