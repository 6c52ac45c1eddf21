"""ASM_CM's capacity at 32,768 tokens within the byte vocabulary (docs/mqar.md
section 9.2): the study's driver and its collector.

Per seed S a J_NO_DIRECTION base (tiny, 2M tokens, as in docs/studies/asm-cm-controls); per pair count P
and fast-weight width D, ``drmlab specialise`` at ten times the recipe's rates, read at the control (5P),
512, 4,096 and 32,768 tokens and under the read-off, write-off and shuffled-key controls at 5P, 512 and
4,096. The folder (``--out``) holds ``base/J_NO_DIRECTION-seedS``, ``spec/pP-wD-seedS`` with its
``reads`` and ``controls``, and the study's own files: ``locks/`` (one lock per job), ``jobs/`` (each job's
attempts and wall seconds) and ``logs/`` (each job's output).

    python tools/capacity_study.py run --out studies/asm-cm-capacity --threads 1   # in one or two terminals
    python tools/capacity_study.py run --out studies/asm-cm-capacity --dry-run     # the jobs and their commands
    python tools/capacity_study.py collect --study studies/asm-cm-capacity --machine "..." --how "..."

``run`` walks the jobs in order -- the bases, then per seed, per pair count, per width: the
specialisation, its reads, its controls -- so whole (pairs, width) cells finish one after another.
Each job is a ``drmlab`` command in a subprocess. A finished job is skipped; a half-finished one is
resumed by the verb itself (``drmlab train --resume`` from its checkpoint, ``drmlab specialise``
started again, the distance reads reusing every length already read; a run killed before its first
checkpoint starts again with ``--overwrite``). Two processes running the same command share the jobs:
each job is taken under its lock (``locks/JOB.lock``, :class:`drmlab.runs.RunLock`), a job held by the
other process is left to it, and a job whose input is not finished yet (a specialisation's base, the
reads' specialisation) waits for it. ``collect`` writes docs/studies/asm-cm-capacity/results.json from
the finished cells and lists the others as pending.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import distance_record  # tools/distance_record.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "asm-cm-capacity" / "results.json"
SEEDS, PAIRS, WIDTHS = (0, 1, 2), (8, 16, 32), (64, 32)
BASE_MODEL = "J_NO_DIRECTION"
READ_KEYS = ("acc", "ci95", "first_acc", "state_bytes")
CONTROL_KEYS = ("acc", "first_acc", "bound_acc")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the jobs run with: the study's settings (a test shrinks them). ``read_lengths`` and
    ``control_lengths`` follow the control, 5 x pairs, which every read takes first."""

    base: tuple[str, ...] = ("--model", BASE_MODEL, "--preset", "tiny", "--tokens", "2M")
    specialise: tuple[str, ...] = ("--backbone-lr", "1e-4", "--memory-lr", "1e-3")
    read: tuple[str, ...] = ("--n-eval", "128", "--eval-batch", "8", "--chunk", "32768", "--read-all")
    read_lengths: tuple[int, ...] = (512, 4096, 32768)
    control_lengths: tuple[int, ...] = (512, 4096)
    controls: tuple[str, ...] = ("memory_read_off", "memory_write_off", "keys_shuffled")
    threads: int = 1


@dataclasses.dataclass(frozen=True)
class Job:
    """One ``drmlab`` command of the study: ``kind`` base, specialise, reads or controls; ``out`` the
    folder it writes; ``needs`` the jobs whose output it reads."""

    name: str
    kind: str
    argv: tuple[str, ...]
    out: Path
    needs: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()
    controls: tuple[str, ...] = ()


def cell_name(pairs, width, seed) -> str:
    return f"p{pairs}-w{width}-seed{seed}"


def base_dir(study: Path, seed) -> Path:
    return study / "base" / f"{BASE_MODEL}-seed{seed}"


def spec_dir(study: Path, pairs, width, seed) -> Path:
    return study / "spec" / cell_name(pairs, width, seed)


def _train(s: Settings, seed, out) -> list[str]:
    return ["train", *s.base, "--seed", str(seed), "--out", str(out), "--threads", str(s.threads), "--quiet"]


def _specialise(s: Settings, base, out, pairs, width) -> list[str]:
    return [
        "specialise",
        *("--base", str(base), "--out", str(out), "--pairs", str(pairs), "--fast-weight-dim", str(width)),
        *s.specialise,
        *("--threads", str(s.threads), "--quiet"),
    ]


def _read(s: Settings, spec, pairs, lengths: str, out, controls: str | None = None) -> list[str]:
    return [
        "mqar",
        *("--protocol", "distance", "--ckpt", str(spec), "--pairs", str(pairs), "--lengths", lengths),
        *s.read,
        *(("--controls", controls) if controls else ()),
        *("--out", str(out), "--threads", str(s.threads), "--quiet"),
    ]


def commands(s: Settings = Settings()) -> dict[str, str]:
    """The four commands as templates (S the seed, P the pairs, D the width), for the record."""
    reads, controls = (",".join(["5P", *map(str, ls)]) for ls in (s.read_lengths, s.control_lengths))
    return {
        kind: shlex.join(["drmlab", *argv])
        for kind, argv in {
            "base": _train(s, "S", "BASE"),
            "specialise": _specialise(s, "BASE", "SPEC", "P", "D"),
            "reads": _read(s, "SPEC", "P", reads, "SPEC/reads"),
            "controls": _read(s, "SPEC", "P", controls, "SPEC/controls", ",".join(s.controls)),
        }.items()
    }


def plan(study: Path, seeds=SEEDS, pairs=PAIRS, widths=WIDTHS, s: Settings = Settings()) -> list[Job]:
    """Every job in the order it is taken: the bases, then per seed, pair count and width the
    specialisation, its reads and its controls."""
    from drmlab.experiments.mqar.distance_task import check_pairs, control_length

    for p in pairs:
        if check_pairs(p) < 2:
            raise ValueError(f"--pairs {p}: the shuffled-key control needs at least 2 pairs")
    jobs = [
        Job(f"base-seed{seed}", "base", tuple(_train(s, seed, base_dir(study, seed))), base_dir(study, seed))
        for seed in seeds
    ]
    for seed, p, d in ((seed, p, d) for seed in seeds for p in pairs for d in widths):
        name, spec, control = cell_name(p, d, seed), spec_dir(study, p, d, seed), control_length(p)
        reads = (control, *(L for L in s.read_lengths if L > control))
        controlled = (control, *(L for L in s.control_lengths if L > control))
        made = (f"{name}-specialise",)
        jobs += [
            Job(
                made[0],
                "specialise",
                tuple(_specialise(s, base_dir(study, seed), spec, p, d)),
                spec,
                (f"base-seed{seed}",),
            ),
            Job(
                f"{name}-reads",
                "reads",
                tuple(_read(s, spec, p, ",".join(map(str, reads)), spec / "reads")),
                spec / "reads",
                made,
                reads,
            ),
            Job(
                f"{name}-controls",
                "controls",
                tuple(_read(s, spec, p, ",".join(map(str, controlled)), spec / "controls", ",".join(s.controls))),
                spec / "controls",
                made,
                controlled,
                s.controls,
            ),
        ]
    return jobs


# ---------------------------------------------------------------------------------------------- state


def finished(job: Job) -> bool:
    """Whether ``job``'s output is complete: a rescored run, a specialisation with its language CE
    after, every length read (and under every control)."""
    from drmlab.runs import RunDir

    if job.kind == "base":
        return RunDir(job.out).finished_summary() is not None
    if job.kind == "specialise":
        summary = RunDir(job.out).read_summary() or {}
        return bool(summary.get("finished")) and "after" in _json(job.out / "specialise.json")
    entries = _json(job.out / "results.json").get("entries") or [{}]
    lengths = entries[0].get("lengths", {})
    for length in job.lengths:
        record = lengths.get(str(length), {})
        if record.get("status") != "read":
            return False
        done = record.get("controls") or {}
        if any(done.get(c, {}).get("status") not in ("read", "n/a") for c in job.controls):
            return False
    return True


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return {}


def command_now(job: Job) -> list[str]:
    """The job's command as it runs now: a run with a checkpoint is continued (``drmlab train
    --resume``; ``drmlab specialise`` continues by itself), one killed before its first checkpoint
    starts again (``--overwrite``: nothing is lost); the reads reuse what they have read."""
    from drmlab.runs import RunDir

    argv = list(job.argv)
    if job.kind in ("base", "specialise"):
        run = RunDir(job.out)
        if run.has_checkpoint():
            return argv + (["--resume"] if job.kind == "base" else [])
        if run.holds_run() or (job.out / "specialise.json").exists():
            return argv + ["--overwrite"]
    return argv


def job_record(study: Path, name: str) -> dict:
    """``jobs/NAME.json``: the job's attempts (start, wall seconds, exit code -- None where this process
    was stopped --, the flags added to resume) and their seconds in all; empty before its first attempt."""
    return _json(study / "jobs" / f"{name}.json")


def _record_attempt(study: Path, job: Job, argv: list[str], started: str, seconds: float, code) -> None:
    from drmlab.runs import write_json_atomic

    record = job_record(study, job.name) or {"job": job.name, "kind": job.kind, "attempts": []}
    record["attempts"].append(
        {
            "started": started,
            "seconds": seconds,
            "returncode": code,
            "added": argv[len(job.argv) :],
        }
    )
    record["seconds"] = sum(a["seconds"] for a in record["attempts"])
    record["finished"] = finished(job)
    (study / "jobs").mkdir(parents=True, exist_ok=True)
    write_json_atomic(study / "jobs" / f"{job.name}.json", record)


# ---------------------------------------------------------------------------------------------- running


def run_drmlab(argv: list[str], log: Path) -> int:
    """``python -m drmlab ARGV`` with its output appended to ``log``; its exit code. Ctrl-C reaches it
    too (the same process group) and a SIGTERM to this process is passed on: either way the verb stops
    after its current step with a checkpoint, then this process stops."""
    stopping = []
    with open(log, "a") as handle:
        handle.write(f"\n$ drmlab {shlex.join(argv)}  # {_now()}\n")
        handle.flush()
        proc = subprocess.Popen([sys.executable, "-m", "drmlab", *argv], stdout=handle, stderr=subprocess.STDOUT)

        def forward(signum, frame):
            stopping.append(signum)
            proc.send_signal(signum)

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, forward) if main else None
        try:
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                proc.wait()
                raise
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    if stopping:
        raise SystemExit(128 + stopping[0])
    return code


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def run_jobs(
    study: Path,
    jobs: list[Job],
    runner: Callable[[list[str], Path], int] = run_drmlab,
    *,
    wait_seconds: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Run every unfinished job of ``jobs`` whose inputs are finished, always the first such in order,
    under its lock; leave the jobs another process holds to it and wait (``wait_seconds`` between
    looks) until every job is finished or cannot be (a failed job, and what needs it). The jobs that
    failed or could not run."""
    from drmlab.runs import RunLock, RunLockedError

    named = {job.name: job for job in jobs}
    given_up: dict[str, str] = {}
    held_said: set = set()
    for folder in ("locks", "jobs", "logs"):
        (study / folder).mkdir(parents=True, exist_ok=True)
    while True:
        todo = [job for job in jobs if job.name not in given_up and not finished(job)]
        if not todo:
            return list(given_up)
        ran = False
        for job in todo:
            blocked = [n for n in job.needs if n in given_up]
            if blocked:
                given_up[job.name] = f"needs {blocked[0]}"
                say(f"{job.name}: not run, it needs {blocked[0]}")
                continue
            if not all(finished(named[n]) for n in job.needs if n in named):
                continue  # its input is being made by another process
            try:
                lock = RunLock(study / "locks" / f"{job.name}.lock").acquire()
            except RunLockedError:
                if job.name not in held_said:
                    say(f"{job.name}: held by another process, left to it")
                    held_said.add(job.name)
                continue
            try:
                if finished(job):  # the other process finished it meanwhile
                    continue
                argv = command_now(job)
                say(f"{job.name}: drmlab {shlex.join(argv)}")
                started, t0, code = _now(), time.perf_counter(), None
                try:
                    code = runner(argv, study / "logs" / f"{job.name}.log")
                finally:
                    _record_attempt(study, job, argv, started, time.perf_counter() - t0, code)
            finally:
                lock.release()
            seconds = job_record(study, job.name)["attempts"][-1]["seconds"]
            if not finished(job):
                given_up[job.name] = f"exit code {code}"
                say(f"{job.name}: failed (exit code {code}) after {seconds:.0f} s; see logs/{job.name}.log")
            else:
                say(f"{job.name}: done in {seconds:.0f} s")
            ran = True
            break  # from the top again: the earliest job first
        if not ran and any(job.name not in given_up for job in todo):
            sleep(wait_seconds)


def dry_run(jobs: list[Job], say: Callable[[str], None] = print) -> None:
    for number, job in enumerate(jobs, 1):
        state = "done" if finished(job) else "to run"
        say(f"[{number}/{len(jobs)}] {job.name} ({state}): drmlab {shlex.join(command_now(job))}")


# ---------------------------------------------------------------------------------------------- collecting


def collect(study: Path, seeds=SEEDS, pairs=PAIRS, widths=WIDTHS, s: Settings = Settings()) -> dict:
    """The record's numbers: the bases, per (pairs, width) its finished seeds and their means, and the
    unfinished cells (``pending``, with the jobs each still needs)."""
    jobs = plan(study, seeds, pairs, widths, s)
    open_jobs = [job.name for job in jobs if not finished(job)]
    base = {}
    for seed in seeds:
        summary = _json(base_dir(study, seed) / "summary.json")
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


def record(found: dict, seeds, pairs, widths, machine: str, how: str, s: Settings = Settings()) -> dict:
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


# ---------------------------------------------------------------------------------------------- command line


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="run or resume the study's jobs (two processes may share them)")
    run.add_argument("--out", type=Path, default=Path("studies/asm-cm-capacity"))
    run.add_argument("--threads", type=int, default=1, help="CPU threads of each job (default 1)")
    run.add_argument("--wait", type=float, default=60.0, help="seconds between looks at jobs held elsewhere")
    run.add_argument("--dry-run", action="store_true", help="print the jobs, their state and commands; run nothing")
    col = verbs.add_parser("collect", help="write docs/studies/asm-cm-capacity/results.json")
    col.add_argument("--study", type=Path, default=Path("studies/asm-cm-capacity"))
    col.add_argument("--machine", default="not stated")
    col.add_argument("--how", default="", help="the provenance's 'how' line")
    for p in (run, col):
        p.add_argument("--seeds", type=_ints, default=SEEDS, help="default 0,1,2")
        p.add_argument("--pairs", type=_ints, default=PAIRS, help="default 8,16,32")
        p.add_argument("--widths", type=_ints, default=WIDTHS, help="fast-weight widths (default 64,32)")
    args = parser.parse_args(argv)
    if args.verb == "run":
        settings = Settings(threads=args.threads)
        jobs = plan(args.out, args.seeds, args.pairs, args.widths, settings)
        if args.dry_run:
            dry_run(jobs)
            return 0
        failed = run_jobs(args.out, jobs, wait_seconds=args.wait)
        print(
            f"{len(jobs) - len(failed)} of {len(jobs)} jobs finished"
            + (f"; not: {', '.join(failed)}" if failed else "")
        )
        return 1 if failed else 0
    found = collect(args.study, args.seeds, args.pairs, args.widths)
    write_record = record(found, args.seeds, args.pairs, args.widths, args.machine, args.how)
    from drmlab.experiments.results import write

    write(RECORD, write_record)
    print(table(found))
    print(f"{RECORD.relative_to(ROOT)}: {len(found['rows'])} rows; pending: {len(found['pending'])} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
