"""tools/capacity_study.py (docs/mqar.md section 9.2): the jobs in their order with their commands, a finished
job skipped and a half-finished one resumed, a job another process holds left to it, a failure stopping
only what needs it, each job's wall seconds recorded; the collector over a study folder of the verbs'
files; and the study end to end at preset micro."""

from __future__ import annotations

import contextlib
import json
import shlex
from pathlib import Path

import pytest
import torch
from test_collectors import _tool

from drmlab.cli import main
from drmlab.experiments.mqar.distance import summarize
from drmlab.experiments.mqar.distance_gates import wilson_interval
from drmlab.experiments.mqar.distance_plan import DistanceStudy
from drmlab.runs import RunDir, RunLock

cs = _tool("capacity_study")


def _names(jobs) -> list[str]:
    return [job.name for job in jobs]


def test_the_jobs_go_bases_first_then_cell_by_cell_with_the_issues_commands(tmp_path):
    jobs = cs.plan(tmp_path, seeds=(0, 1), pairs=(8, 32), widths=(64, 32))
    cells = [f"p{p}-w{d}-seed{s}" for s in (0, 1) for p in (8, 32) for d in (64, 32)]
    steps = ("specialise", "reads", "controls")
    assert _names(jobs) == ["base-seed0", "base-seed1"] + [f"{c}-{step}" for c in cells for step in steps]
    by_name = {job.name: job for job in jobs}
    spec = tmp_path / "spec" / "p32-w32-seed1"
    assert by_name["p32-w32-seed1-specialise"].argv == (
        *("specialise", "--base", str(tmp_path / "base" / "J_NO_DIRECTION-seed1"), "--out", str(spec)),
        *("--pairs", "32", "--fast-weight-dim", "32", "--backbone-lr", "1e-4", "--memory-lr", "1e-3"),
        *("--threads", "1", "--quiet"),
    )
    reads, controls = by_name["p32-w32-seed1-reads"], by_name["p32-w32-seed1-controls"]
    assert reads.needs == controls.needs == ("p32-w32-seed1-specialise",)
    assert by_name["p32-w32-seed1-specialise"].needs == ("base-seed1",)
    assert (reads.lengths, reads.out) == ((160, 512, 4096, 32768), spec / "reads")
    assert (controls.lengths, controls.out) == ((160, 512, 4096), spec / "controls")
    assert shlex.join(controls.argv).endswith(
        "--lengths 160,512,4096 --n-eval 128 --eval-batch 8 --chunk 32768 --read-all "
        f"--controls memory_read_off,memory_write_off,keys_shuffled --out {spec / 'controls'} --threads 1 --quiet"
    )
    assert cs.commands() == {
        "base": "drmlab train --model J_NO_DIRECTION --preset tiny --tokens 2M --seed S --out BASE --threads 1 --quiet",
        "specialise": "drmlab specialise --base BASE --out SPEC --pairs P --fast-weight-dim D --backbone-lr 1e-4 "
        "--memory-lr 1e-3 --threads 1 --quiet",
        "reads": "drmlab mqar --protocol distance --ckpt SPEC --pairs P --lengths 5P,512,4096,32768 --n-eval 128 "
        "--eval-batch 8 --chunk 32768 --read-all --out SPEC/reads --threads 1 --quiet",
        "controls": "drmlab mqar --protocol distance --ckpt SPEC --pairs P --lengths 5P,512,4096 --n-eval 128 "
        "--eval-batch 8 --chunk 32768 --read-all --controls memory_read_off,memory_write_off,keys_shuffled "
        "--out SPEC/controls --threads 1 --quiet",
    }
    assert "--threads 2" in shlex.join(cs.plan(tmp_path, (0,), (8,), (64,), cs.Settings(threads=2))[1].argv)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        cs.plan(tmp_path, pairs=(1,))
    with pytest.raises(ValueError, match="from 1 to 32"):
        cs.plan(tmp_path, pairs=(33,))


# ------------------------------------------------------------------------ the verbs' files, hand-made


def _read(length: int, share: float, pairs: int, control: str | None = None, n_eval: int = 128) -> dict:
    """A record of ``read_length``'s shape: ``share`` of the targets (and of the first queries) right."""
    correct, first = round(share * n_eval * pairs), round(share * n_eval)
    record = {"length": length, "n_eval": n_eval, "eval_seed": 0, "status": "read", "correct": correct}
    record.update(
        total=n_eval * pairs, acc=correct / (n_eval * pairs), ci95=list(wilson_interval(correct, n_eval * pairs))
    )
    record.update(first_correct=first, first_total=n_eval, first_acc=first / n_eval)
    record.update(first_ci95=list(wilson_interval(first, n_eval)), by_query=[share] * pairs, state_bytes=9000)
    if control is not None:
        record["control"] = control
    if control == "keys_shuffled":
        record.update(bound_correct=n_eval * pairs, bound_acc=1.0, binder_level=1 / 64)
    return record


def write_reads(out: Path, spec: Path, pairs: int, lengths, controls=(), share: float = 1.0) -> None:
    """``OUT/results.json`` of ``drmlab mqar --protocol distance --ckpt SPEC``, through the study's own
    summary (its control verdicts) and writer."""
    from drmlab.experiments.results import write

    records = {}
    for length in lengths:
        records[str(length)] = dict(_read(length, share, pairs), spec={})
        records[str(length)]["controls"] = {c: _read(length, 0.01, pairs, c) for c in controls}
    study = DistanceStudy(models=[], seeds=[], lengths=list(lengths), controls=list(controls), pairs=pairs)
    result = {"label": f"{spec.name} (ckpt)", "kind": "ckpt", "model": "ASM_CM", "step": 9, "lengths": records}
    write(out / "results.json", summarize(study, [result]))


def finish(argv: list[str]) -> None:
    """What a finished verb leaves in its ``--out`` (the files the driver and the collector read)."""
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    run = RunDir(out)
    if argv[0] == "train":
        seed = int(argv[argv.index("--seed") + 1])
        run.write_summary({"finished": True, "val_ce": 1.95 + seed / 100, "steps": 245, "params": 802624, "seed": seed})
    elif argv[0] == "specialise":
        specialised = {"spec": {}, "stages": [], "before": {"ce": 1.95}, "after": {"ce": 1.90}, "recall_pass": True}
        (out / "specialise.json").write_text(json.dumps(specialised))
        run.write_summary({"finished": True, "val_ce": 1.90, "steps": 2625, "recall_pass": True})
    else:
        pairs = int(argv[argv.index("--pairs") + 1])
        lengths = [int(x) for x in argv[argv.index("--lengths") + 1].split(",")]
        controls = argv[argv.index("--controls") + 1].split(",") if "--controls" in argv else ()
        write_reads(out, Path(argv[argv.index("--ckpt") + 1]), pairs, lengths, controls)


class FakeVerbs:
    """The driver's runner without the verbs: records each command and leaves its finished files, or
    fails the jobs named in ``fail``."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], fail

    def __call__(self, argv: list[str], log: Path) -> int:
        name = log.stem
        self.calls.append((name, argv))
        if name in self.fail:
            return 1
        finish(argv)
        return 0


def test_finished_jobs_are_skipped_half_finished_ones_resumed_and_each_timed(tmp_path):
    jobs = cs.plan(tmp_path, seeds=(0, 1, 2), pairs=(8,), widths=(64,))
    by_name = {job.name: job for job in jobs}
    finish(list(by_name["base-seed0"].argv))  # finished before
    interrupted = RunDir(by_name["base-seed1"].out)  # killed after a checkpoint
    interrupted.path.mkdir(parents=True)
    interrupted.config_path.write_text("{}")
    interrupted.pointer_path.write_text("{}")
    RunDir(by_name["base-seed2"].out).path.mkdir(parents=True)  # killed before its first checkpoint
    RunDir(by_name["base-seed2"].out).config_path.write_text("{}")
    spec = RunDir(by_name["p8-w64-seed0-specialise"].out)  # a specialisation killed after a checkpoint
    spec.path.mkdir(parents=True)
    (spec.path / "specialise.json").write_text("{}")
    spec.pointer_path.write_text("{}")
    said, verbs = [], FakeVerbs()
    assert cs.run_jobs(tmp_path, jobs, verbs, say=said.append) == []
    ran = dict(verbs.calls)
    assert list(ran) == _names(jobs)[1:]
    assert ran["base-seed1"] == [*by_name["base-seed1"].argv, "--resume"]
    assert ran["base-seed2"] == [*by_name["base-seed2"].argv, "--overwrite"]
    assert ran["p8-w64-seed0-specialise"] == list(by_name["p8-w64-seed0-specialise"].argv)  # it continues itself
    assert ran["p8-w64-seed1-specialise"] == list(by_name["p8-w64-seed1-specialise"].argv)
    record = cs.job_record(tmp_path, "base-seed1")
    assert record["finished"] and record["seconds"] >= 0
    assert [(a["returncode"], a["added"]) for a in record["attempts"]] == [(0, ["--resume"])]
    assert cs.job_record(tmp_path, "base-seed0") == {}  # never run here
    assert "base-seed1: done in 0 s" in said
    verbs = FakeVerbs()
    assert cs.run_jobs(tmp_path, jobs, verbs, say=said.append) == [] and verbs.calls == []  # all done


def test_a_job_another_process_holds_is_left_to_it_and_what_needs_it_waits(tmp_path):
    jobs = cs.plan(tmp_path, seeds=(0, 1), pairs=(8,), widths=(64,))
    base0 = jobs[0]
    other = RunLock(tmp_path / "locks" / "base-seed0.lock").acquire()  # the other process trains base 0
    waits = []

    def sleep(seconds):  # meanwhile the other process finishes base 0
        waits.append(seconds)
        finish(list(base0.argv))
        other.release()

    said, verbs = [], FakeVerbs()
    assert cs.run_jobs(tmp_path, jobs, verbs, wait_seconds=7, sleep=sleep, say=said.append) == []
    cell = ["specialise", "reads", "controls"]
    assert [name for name, _ in verbs.calls] == ["base-seed1"] + [f"p8-w64-seed{s}-{c}" for s in (1, 0) for c in cell]
    assert waits == [7] and said.count("base-seed0: held by another process, left to it") == 1


def test_a_failed_job_stops_only_what_needs_it(tmp_path):
    jobs = cs.plan(tmp_path, seeds=(0,), pairs=(8, 16), widths=(64,))
    said, verbs = [], FakeVerbs(fail={"p8-w64-seed0-specialise"})
    failed = cs.run_jobs(tmp_path, jobs, verbs, say=said.append)
    assert failed == ["p8-w64-seed0-specialise", "p8-w64-seed0-reads", "p8-w64-seed0-controls"]
    assert [name for name, _ in verbs.calls] == ["base-seed0", "p8-w64-seed0-specialise"] + [
        f"p16-w64-seed0-{c}" for c in ("specialise", "reads", "controls")
    ]
    assert cs.job_record(tmp_path, "p8-w64-seed0-specialise")["attempts"][0]["returncode"] == 1
    assert "p8-w64-seed0-reads: not run, it needs p8-w64-seed0-specialise" in said


def test_the_collector_keeps_the_finished_cells_their_means_and_lists_the_rest(tmp_path):
    seeds, pairs, widths = (0, 1), (8, 32), (64,)
    jobs = cs.plan(tmp_path, seeds, pairs, widths)
    for job in jobs:
        if not job.name.startswith("p32-w64-seed1") and job.name != "p8-w64-seed1-controls":
            finish(list(job.argv))
            cs._record_attempt(tmp_path, job, list(job.argv), "2026-12-03T10:00:00+00:00", 12.34, 0)
    found = cs.collect(tmp_path, seeds, pairs, widths)
    assert found["base"]["1"] == {"val_ce": 1.96, "steps": 245, "params": 802624, "wall_seconds": 12.3}
    assert found["pending"] == ["p8-w64-seed1: controls", "p32-w64-seed1: specialise, reads, controls"]
    p8, p32 = found["rows"]
    assert (p8["pairs"], p8["fast_weight_dim"], p8["complete"], p8["state_bytes"]) == (8, 64, False, 9000)
    assert sorted(p8["runs"]) == ["0"] and sorted(p32["runs"]) == ["0"]
    run = p32["runs"]["0"]
    assert sorted(run["reads"], key=int) == ["160", "512", "4096", "32768"]
    assert run["reads"]["32768"] == {"acc": 1.0, "ci95": list(wilson_interval(4096, 4096)), "first_acc": 1.0}
    assert (run["ce_before"], run["ce_after"], run["recall_pass"], run["state_bytes"]) == (1.95, 1.90, True, 9000)
    assert set(run["controls"]) == {"memory_read_off", "memory_write_off", "keys_shuffled"}
    shuffled = run["controls"]["keys_shuffled"]
    assert shuffled["verdict"] == "falls" and sorted(shuffled) == ["160", "4096", "512", "verdict"]
    assert shuffled["4096"] == {"acc": 41 / 4096, "first_acc": 1 / 128, "bound_acc": 1.0}
    assert run["wall_seconds"] == {"specialise": 12.3, "reads": 12.3, "controls": 12.3}
    mean = p32["mean"]
    assert mean["seeds"] == ["0"] and mean["reads"]["160"] == {"acc": 1.0, "first_acc": 1.0}
    assert mean["controls"]["memory_read_off"] == {"falls": 1, "160": 41 / 4096, "512": 41 / 4096, "4096": 41 / 4096}
    record = cs.record(found, seeds, pairs, widths, "M", "H")
    assert record["provenance"]["settings"] == cs.commands() and record["provenance"]["machine"] == "M"
    assert sorted(record["no_binding_levels"]) == ["32", "8"] and str(tmp_path) not in json.dumps(record)
    assert "32 pairs, width  64, 9,000 B: 160: 100.0%, 512: 100.0%" in cs.table(found)


# ------------------------------------------------------------------------ end to end at micro


def test_the_study_end_to_end_at_micro(corpus_file, tmp_path):
    """The real verbs in subprocesses on a micro base of a few steps: base, specialisation, reads and
    controls; a second run finds everything done; the collector reads what the verbs wrote."""
    cache = str(tmp_path / "cache")
    settings = cs.Settings(
        base=("--model", "J_NO_DIRECTION", "--preset", "micro", "--tokens", "256", "--batch-size", "4")
        + ("--seq-len", "32", "--eval-tokens", "1000", "--data", str(corpus_file), "--cache-dir", cache),
        specialise=("--backbone-lr", "1e-4", "--memory-lr", "1e-3", "--curriculum", "10:2,24:1")
        + ("--eval-sequences", "4", "--eval-tokens", "1000", "--checkpoint-every", "0", "--cache-dir", cache),
        read=("--n-eval", "4", "--eval-batch", "4", "--chunk", "32", "--read-all", "--device", "cpu"),
        read_lengths=(24,),
        control_lengths=(24,),
    )
    study = tmp_path / "study"
    jobs = cs.plan(study, (0,), (2,), (4,), settings)
    said, ran = [], []

    def runner(argv, log):
        """The first job through the study's own subprocess runner, the rest in this process (each new
        process spends seconds importing torch; the verbs and their files are the same)."""
        ran.append(argv[0])
        if len(ran) == 1:
            return cs.run_drmlab(argv, log)
        threads = torch.get_num_threads()  # a verb sets torch's threads for its process: this one's are restored
        with open(log, "a") as handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
            try:
                return main(argv)
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else 1
            finally:
                torch.set_num_threads(threads)

    failed = cs.run_jobs(study, jobs, runner, say=said.append)
    assert failed == [], (said, [p.read_text() for p in study.glob("logs/*")])
    assert len(ran) == len(jobs) and ran[0] == "train"
    assert [line.split(":")[0] for line in said if "done in" in line] == _names(jobs)
    assert all(cs.job_record(study, name)["seconds"] > 0 for name in _names(jobs))
    verbs = FakeVerbs()
    assert cs.run_jobs(study, jobs, verbs) == [] and verbs.calls == []
    found = cs.collect(study, (0,), (2,), (4,), settings)
    assert found["pending"] == [] and sorted(found["base"]) == ["0"]
    (row,) = found["rows"]
    run = row["runs"]["0"]
    assert (row["pairs"], row["fast_weight_dim"], row["complete"]) == (2, 4, True)
    assert sorted(run["reads"]) == ["10", "24"] and row["state_bytes"] > 0
    assert set(run["controls"]) == set(settings.controls) and sorted(run["controls"]["keys_shuffled"]) == [
        "10",
        "24",
        "verdict",
    ]
    config = json.loads((study / "spec" / "p2-w4-seed0" / "config.json").read_text())
    assert config["model"] == "ASM_CM" and config["overrides"] == {"fast_weight_dim": 4}
    assert str(tmp_path) not in json.dumps(found)  # (the test's commands name its corpus; the study's do not)
