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

This file runs the jobs and holds the command line; the jobs themselves (the settings, the plan, each job's
state on disk) are in tools/capacity_jobs.py and the collector in tools/capacity_record.py.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# the study's other parts, beside this file: its jobs and its collector (their names stay reachable from here)
from capacity_jobs import (  # noqa: F401
    BASE_MODEL,
    PAIRS,
    SEEDS,
    WIDTHS,
    Job,
    Settings,
    base_dir,
    cell_name,
    command_now,
    commands,
    finished,
    job_record,
    plan,
    spec_dir,
)
from capacity_record import RECORD, ROOT, collect, record, table

# ---------------------------------------------------------------------------------------------- running


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
