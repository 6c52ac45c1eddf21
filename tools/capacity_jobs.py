"""The jobs of ASM_CM's capacity study (tools/capacity_study.py runs them, tools/capacity_record.py collects
what they wrote): the study's settings, every job's ``drmlab`` command in the order the jobs are taken and
the folder each writes, and, read from those folders, whether a job is finished and how it resumes
(docs/mqar.md section 9.2).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

SEEDS, PAIRS, WIDTHS = (0, 1, 2), (8, 16, 32), (64, 32)
BASE_MODEL = "J_NO_DIRECTION"


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


DEFAULT_SETTINGS = Settings()  # the study's own settings, the default of every function taking some


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


def commands(s: Settings = DEFAULT_SETTINGS) -> dict[str, str]:
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


def plan(study: Path, seeds=SEEDS, pairs=PAIRS, widths=WIDTHS, s: Settings = DEFAULT_SETTINGS) -> list[Job]:
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
        return bool(summary.get("finished")) and "after" in read_json_or_empty(job.out / "specialise.json")
    entries = read_json_or_empty(job.out / "results.json").get("entries") or [{}]
    lengths = entries[0].get("lengths", {})
    for length in job.lengths:
        record = lengths.get(str(length), {})
        if record.get("status") != "read":
            return False
        done = record.get("controls") or {}
        if any(done.get(c, {}).get("status") not in ("read", "n/a") for c in job.controls):
            return False
    return True


def read_json_or_empty(path: Path) -> dict:
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
    return read_json_or_empty(study / "jobs" / f"{name}.json")
