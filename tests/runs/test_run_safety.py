"""Runs that never lose work: the lock, no silent overwrite, the one-rename checkpoint commit (a kill at
every rename), checksums, resume refusals, non-finite and divergence stops, signals and a full disk."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from drmlab.models.output import ModelOutput
from drmlab.runs import POINTER_FILE, CorruptCheckpointError, RunDir, RunLockedError, read_json
from drmlab.training import TrainConfig, train
from drmlab.training.run_info import DataInfo, RunInfo
from drmlab.training.trainer import DivergenceError, NonFiniteLossError, Trainer, TrainingInterrupted


class Config:
    vocab_size = 64


class SmallLM(nn.Module):
    """A causal running-mean model; ``poison`` maps a step to what goes wrong there."""

    def __init__(self, seed=0, poison=None):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.emb = nn.Embedding(64, 8)
            self.out = nn.Linear(8, 64)
        self.config = Config()
        self.poison = poison or {}

    def forward(self, tokens, step=None):
        h = torch.cumsum(self.emb(tokens), 1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
        logits = self.out(h)
        what = self.poison.get(step)
        if what == "cholesky":
            torch.linalg.cholesky(-torch.eye(2))
        elif what == "huge":
            logits = logits * 0 + torch.arange(64.0) * 100
        elif what == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        return ModelOutput(logits=logits, aux={})


def _stream(n=4000, seed=0):
    return (np.random.default_rng(seed).integers(0, 64, size=n)).astype(np.int64)


def _cfg(**kw):
    base = dict(
        tokens=4 * 8 * 6, batch_size=4, seq_len=8, lr=1e-2, eval_every=0, eval_windows=0, checkpoint_every=4 * 8
    )
    base.update(kw)
    return TrainConfig(**base)


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- lock and overwrite


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    lock = RunDir(tmp_path).lock()
    try:
        with pytest.raises(RunLockedError, match=rf"in use by process {os.getpid()} on .* since "):
            train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True)
    finally:
        lock.release()
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True)  # free again


def test_a_look_at_the_lock_does_not_turn_a_writer_away(tmp_path, monkeypatch):
    """lock_holder's instant shared lock (a --status look) is waited out; a writer's lock is not."""
    import fcntl
    import threading

    from drmlab.runs import lock_holder

    path = tmp_path / ".lock"
    path.touch()
    look = open(path)
    fcntl.flock(look.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # a look, caught at its instant
    threading.Timer(0.05, lambda: fcntl.flock(look.fileno(), fcntl.LOCK_UN)).start()
    try:
        lock = RunDir(tmp_path).lock()  # waits the look out
    finally:
        look.close()
    try:
        assert lock_holder(path).startswith(f"process {os.getpid()} on ")
        from drmlab.runs import lock as lock_module

        waits = []
        monkeypatch.setattr(lock_module.time, "sleep", waits.append)
        with pytest.raises(RunLockedError, match="in use by"):  # a writer holds it: refused at once
            RunDir(tmp_path).lock()
        assert waits == []
    finally:
        lock.release()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from drmlab.runs import RunDir
        held = RunDir({str(tmp_path)!r}).lock()
        print("locked", flush=True)
        time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"process {holder.pid}"):
            RunDir(tmp_path).lock()
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # stale content stays ...
    lock = RunDir(tmp_path).lock()  # ... and is taken over
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_an_existing_run_is_refused_unless_resume_or_overwrite(tmp_path):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True)
    (tmp_path / "eval.json").write_text("{}")
    before = read_json(tmp_path / "summary.json")
    with pytest.raises(FileExistsError, match="already holds a finished run"):
        train(SmallLM(seed=1), _stream(), None, _cfg(), tmp_path, quiet=True)
    assert read_json(tmp_path / "summary.json") == before  # nothing touched
    train(SmallLM(seed=1), _stream(), None, _cfg(), tmp_path, quiet=True, overwrite=True)
    assert not (tmp_path / "eval.json").exists()  # the old run's files went with it


# ---------------------------------------------------------------- the one-rename commit


class SimulatedKill(BaseException):
    """Raised in place of a file-system call: the process 'dies' there."""


def test_a_kill_at_every_rename_leaves_a_loadable_checkpoint_and_an_exact_resume(tmp_path, monkeypatch):
    cfg = _cfg(tokens=4 * 8 * 5, checkpoint_every=4 * 8)
    reference = SmallLM(seed=3)
    ref_summary = train(reference, _stream(), None, cfg, tmp_path / "ref", quiet=True)
    ref_losses = [r["loss"] for r in ref_summary["rows"] if r["kind"] == "train"]
    expected = _weights(reference)

    real_replace, real_rename = os.replace, os.rename
    calls = {"n": 0, "kill_at": None}

    def counting(real):
        def call(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == calls["kill_at"]:
                raise SimulatedKill
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "replace", counting(real_replace))
    monkeypatch.setattr(os, "rename", counting(real_rename))
    train(SmallLM(seed=3), _stream(), None, cfg, tmp_path / "count", quiet=True)
    total = calls["n"]
    assert total >= 5 * 4  # every checkpoint renames several times

    for kill_at in range(1, total + 1):
        run = tmp_path / f"kill{kill_at}"
        calls.update(n=0, kill_at=kill_at)
        with pytest.raises(SimulatedKill):
            train(SmallLM(seed=3), _stream(), None, cfg, run, quiet=True)
        calls["kill_at"] = None
        resumable = RunDir(run).has_checkpoint()
        model = SmallLM(seed=99 if resumable else 3)  # a resumed run takes everything from its checkpoint
        if resumable:
            RunDir(run).verify_checkpoint()  # whatever the kill, the pointer names a complete checkpoint
        summary = train(model, _stream(), None, cfg, run, quiet=True, resume=resumable, overwrite=not resumable)
        assert summary["finished"], kill_at
        assert _same(_weights(model), expected), f"kill at rename {kill_at}: weights differ"
        losses = [r["loss"] for r in RunDir(run).read_metrics() if r["kind"] == "train"]
        assert losses == ref_losses, kill_at
        leftovers = [p.name for p in run.iterdir() if p.name.startswith(".") and p.name != ".lock"]
        assert not leftovers, (kill_at, leftovers)
        assert len(list((run / "checkpoints").iterdir())) == 1


STEPS_KILLED = 150  # steps of the run killed twice (each commits a checkpoint; the kills come early)
SIGKILL_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {test_dir!r})
    from test_run_safety import STEPS_KILLED, SmallLM, _cfg, _stream
    from drmlab.training import train
    train(SmallLM(seed=3), _stream(), None, _cfg(tokens=4 * 8 * STEPS_KILLED, checkpoint_every=4 * 8), {run!r},
          quiet=True, resume={resume})
""")


def test_sigkill_from_outside_then_resume_is_bit_exact(tmp_path):
    cfg = _cfg(tokens=4 * 8 * STEPS_KILLED, checkpoint_every=4 * 8)
    reference = SmallLM(seed=3)
    train(reference, _stream(), None, cfg, tmp_path / "ref", quiet=True)
    run = tmp_path / "killed"
    test_dir = os.path.dirname(__file__)
    steps_at_kill = []
    for attempt in range(2):
        child = subprocess.Popen(
            [sys.executable, "-c", SIGKILL_SCRIPT.format(test_dir=test_dir, run=str(run), resume=attempt > 0)]
        )
        seen = RunDir(run).read_pointer()["step"] if attempt else 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:  # kill only after a new commit
            if RunDir(run).has_checkpoint() and RunDir(run).read_pointer()["step"] > seen:
                break
            time.sleep(0.01)
        time.sleep(0.05)
        child.kill()  # SIGKILL: no handler, no cleanup
        assert child.wait() == -signal.SIGKILL, "the child finished before it could be killed"
        steps_at_kill.append(RunDir(run).read_pointer()["step"])
    assert 0 < steps_at_kill[0] < steps_at_kill[1] < STEPS_KILLED
    model = SmallLM(seed=1)  # everything comes from the checkpoint
    summary = train(model, _stream(), None, cfg, run, quiet=True, resume=True)
    assert summary["finished"]
    assert _same(_weights(model), _weights(reference))


def _train_argv(out, corpus_text, model: str = "SSM_CONTROL", tokens: str = "2k") -> list[str]:
    """``drmlab train`` of ``model`` at preset micro on the test corpus into ``out`` (its cache beside it)."""
    return [
        "train",
        "--model",
        model,
        "--preset",
        "micro",
        "--tokens",
        tokens,
        "--out",
        str(out),
        "--data",
        str(corpus_text),
        "--cache-dir",
        str(Path(out).parent / "cache"),
    ]


# ---------------------------------------------------------------- checksums and damaged files


def _trained_run(tmp_path):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True)
    return RunDir(tmp_path)


def test_a_flipped_bit_or_truncation_is_refused_naming_the_file(tmp_path):
    run = _trained_run(tmp_path)
    model_file = run.checkpoint_dir() / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-3] ^= 0x10
    model_file.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors does not match its recorded sha256"):
        run.load_checkpoint(SmallLM())
    model_file.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors has .* bytes.*truncated"):
        run.load_checkpoint(SmallLM())


def test_damaged_json_names_the_file(tmp_path):
    run = _trained_run(tmp_path)
    (run.checkpoint_dir() / "manifest.json").write_text("{not json")  # nothing left to recover from
    run.pointer_path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{POINTER_FILE} is not valid JSON; the file is damaged; and no checkpoint"):
        run.load_checkpoint(SmallLM())
    run.config_path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        run.read_config()


def _checkpoint_bytes(run):
    return {p.relative_to(run.path): p.read_bytes() for p in (run.path / "checkpoints").rglob("*") if p.is_file()}


@pytest.mark.parametrize("damage", ["lost", "not json", "a flipped step", "a key renamed", "a flipped folder name"])
def test_a_lost_or_damaged_pointer_is_recovered_from_the_manifest_and_nothing_is_deleted(tmp_path, damage):
    """Before the fix, resume verified nothing and deleted every folder the pointer did not name."""
    cfg = _cfg()
    train(SmallLM(), _stream(), None, cfg, tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    kept = _checkpoint_bytes(run)
    text = run.pointer_path.read_text()
    if damage == "lost":
        run.pointer_path.unlink()
    elif damage == "not json":
        run.pointer_path.write_text(text[:-5])
    elif damage == "a flipped step":
        run.pointer_path.write_text(text.replace('"step": 3', '"step": 9'))
    elif damage == "a key renamed":
        run.pointer_path.write_text(text.replace('"bytes"', '"cytes"', 1))
    else:
        run.pointer_path.write_text(text.replace("step-00000003", "step-00000009"))
    assert run.has_checkpoint()
    assert run.read_pointer()["step"] == 3  # a reader recovers too, without writing
    assert _checkpoint_bytes(run) == kept
    reference = SmallLM()
    train(reference, _stream(), None, cfg, tmp_path / "whole", quiet=True)
    model = SmallLM(seed=1)
    summary = train(model, _stream(), None, cfg, tmp_path, quiet=True, resume=True)
    assert summary["finished"] and _same(_weights(model), _weights(reference))
    assert json.loads(run.pointer_path.read_text())["step"] == summary["steps"]


def test_a_damaged_checkpoint_is_refused_and_nothing_is_deleted(tmp_path):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    model_file = run.checkpoint_dir() / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-8])
    kept = _checkpoint_bytes(run)
    with pytest.raises(CorruptCheckpointError, match="model.safetensors has .* bytes"):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True)
    assert _checkpoint_bytes(run) == kept


def test_another_tools_files_are_never_touched(tmp_path):
    """A directory with another tool's config.json and checkpoints/epoch-10/: neither --resume nor
    --overwrite deletes anything of it."""
    (tmp_path / "checkpoints" / "epoch-10").mkdir(parents=True)
    (tmp_path / "checkpoints" / "epoch-10" / "weights.bin").write_bytes(b"theirs")
    (tmp_path / "config.json").write_text('{"epochs": 10}')
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True)
    with pytest.raises(
        FileExistsError, match="is not a drmlab run .config.json is not a drmlab run's.; nothing was deleted"
    ):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, overwrite=True)
    assert (tmp_path / "checkpoints" / "epoch-10" / "weights.bin").read_bytes() == b"theirs"
    assert (tmp_path / "config.json").read_text() == '{"epochs": 10}'


# ---------------------------------------------------------------- resume refusals


def test_resume_refuses_other_data_and_lists_what_differs(tmp_path):
    data = DataInfo(64, "bytes", None, {"content_sha256": "aaa"})
    info = RunInfo(data=data)
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=2, run_info=info)
    other = RunInfo(data=dataclasses.replace(data, meta={"content_sha256": "bbb"}))
    with pytest.raises(ValueError, match="training data: content sha256 aaa in the run, bbb now"):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True, run_info=other)
    with pytest.raises(ValueError, match="tokenizer: 'bytes' in the run, 'gpt2' now"):
        train(
            SmallLM(),
            _stream(),
            None,
            _cfg(),
            tmp_path,
            quiet=True,
            resume=True,
            run_info=RunInfo(data=dataclasses.replace(data, tokenizer="gpt2")),
        )
    assert read_json(tmp_path / "config.json")["data"]["content_sha256"] == "aaa"  # the record is kept


def test_resuming_on_another_thread_count_continues_with_a_note(tmp_path, capsys):
    """The thread count changes the float rounding: allowed on resume, said in one line and in the
    resume row; the same count says nothing."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=2)
        assert read_json(tmp_path / "config.json")["runtime"]["threads"] == 1
        torch.set_num_threads(2)
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True, stop_after_step=3)
        err = capsys.readouterr().err
        assert "resuming with threads 2 (the run had 1)" in err and "same device and --threads" in err
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [r["changed"] for r in rows if r.get("kind") == "resume"][-1] == {"threads": [1, 2]}
        assert read_json(tmp_path / "config.json")["runtime"]["threads"] == 2  # the latest session's runtime
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True)
        assert "resuming with" not in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- stops


def test_a_cholesky_failure_stops_like_a_nan(tmp_path):
    with pytest.raises(
        NonFiniteLossError, match=r"linear-algebra failure inside the model at step 3 .*checkpoint \(step 2\)"
    ):
        train(SmallLM(poison={3: "cholesky"}), _stream(), None, _cfg(checkpoint_every=4 * 8 * 2), tmp_path, quiet=True)
    assert RunDir(tmp_path).read_state()["step"] == 2
    assert read_json(tmp_path / "summary.json")["stopped"] == "non-finite"


def test_divergence_stops_and_the_advised_fix_resumes(tmp_path):
    cfg = _cfg(tokens=4 * 8 * 10, divergence_steps=3, checkpoint_every=4 * 8)
    poison = {4: "huge", 5: "huge", 6: "huge"}
    with pytest.raises(DivergenceError, match=r"diverged: .* at step 6 .* above the uniform guess 4.1589"):
        train(SmallLM(poison=poison), _stream(), None, cfg, tmp_path, quiet=True)
    assert read_json(tmp_path / "summary.json")["stopped"] == "diverged"
    with pytest.raises(ValueError, match="lr: 0.01 in the run, 0.001 now"):  # not without a stop
        fresh = tmp_path / "fresh"
        train(SmallLM(), _stream(), None, cfg, fresh, quiet=True, stop_after_step=2)
        train(SmallLM(), _stream(), None, TrainConfig(**dict(vars(cfg), lr=1e-3)), fresh, quiet=True, resume=True)
    fixed = TrainConfig(**dict(vars(cfg), lr=1e-3))
    summary = train(SmallLM(), _stream(), None, fixed, tmp_path, quiet=True, resume=True)
    assert summary["finished"]
    (resume_row,) = [r for r in RunDir(tmp_path).read_metrics() if r["kind"] == "resume"]
    assert resume_row["changed"] == {"lr": [0.01, 0.001]}


def test_non_finite_weights_are_never_committed_nor_evaluated(tmp_path):
    from drmlab.models import build_model

    model = build_model("SSM_CONTROL", "micro", vocab_size=64, seed=0)
    info = RunInfo("SSM_CONTROL", "micro", data=DataInfo(64, "bytes", None, None))
    train(model, _stream(), None, _cfg(seed=0), tmp_path, quiet=True, run_info=info)
    run = RunDir(tmp_path)
    name, weight = next(iter(model.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=rf"non-finite weights \({name}\)"):  # the trainer's commit refuses
        Trainer(model, None, _cfg(), run, val_tokens=None, evaluate=None, run_info=info, device="cpu", quiet=True).save(
            7
        )
    run.save_checkpoint(model, None, {"step": 7})  # written behind the trainer's back
    with pytest.raises(ValueError, match=rf"non-finite weights \({name}\); it cannot be evaluated or sampled"):
        run.load_model()


def test_sigint_finishes_the_step_commits_and_resumes_exactly(tmp_path):
    cfg = _cfg(tokens=4 * 8 * 6, checkpoint_every=4 * 8 * 100)
    reference = SmallLM(seed=4)
    train(reference, _stream(), None, cfg, tmp_path / "ref", quiet=True)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job
    with pytest.raises(TrainingInterrupted, match="SIGINT received: stopped after step 3 of 6") as info:
        train(SmallLM(seed=4, poison={3: "sigint"}), _stream(), None, cfg, tmp_path / "run", quiet=True)
    assert info.value.step == 3 and info.value.signal == signal.SIGINT
    assert RunDir(tmp_path / "run").read_state()["step"] == 3
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back
    model = SmallLM(seed=0)
    train(model, _stream(), None, cfg, tmp_path / "run", quiet=True, resume=True)
    assert _same(_weights(model), _weights(reference))


def test_the_cli_exits_143_on_sigterm_with_one_line(tmp_path, monkeypatch, capsys, corpus_text):
    from drmlab.cli import main

    real_step = Trainer.train_step

    def step_then_sigterm(self, step):
        row = real_step(self, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return row

    monkeypatch.setattr(Trainer, "train_step", step_then_sigterm)
    out = tmp_path / "run"
    argv = [*_train_argv(out, corpus_text), "--quiet"]
    assert main(argv) == 143
    err = capsys.readouterr().err
    assert "SIGTERM received: stopped after step 2 of 8" in err and f"--resume --out {out}" in err
    assert "Traceback" not in err
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert main(argv) == 2 and "already holds an interrupted run (checkpoint at step 2)" in capsys.readouterr().err
    assert main(argv[:-1] + ["--resume", "--quiet"]) == 0


def test_a_full_disk_is_one_error_and_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    from drmlab.runs import checkpoint

    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=2)
    before = RunDir(tmp_path).read_pointer()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", no_space)
    with pytest.raises(OSError, match=r"no space left on the device while writing .*checkpoints/step-00000003"):
        train(SmallLM(), _stream(), None, _cfg(checkpoint_every=4 * 8), tmp_path, quiet=True, resume=True)
    assert RunDir(tmp_path).read_pointer() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".checkpoint-")]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("lr", "nan", "lr must be a finite number, got 'nan'"),
        ("lr", float("nan"), "lr must be a finite number"),
        ("batch_size", 0, "batch_size must be > 0"),
        ("bf16", "yes", "bf16 must be true or false"),
        ("warmup_fraction", 2.0, "warmup_fraction must be <= 1"),
    ],
)
def test_bad_settings_name_themselves(key, value, message):
    with pytest.raises(ValueError, match=message):
        _cfg(**{key: value}).validate()


def test_a_window_longer_than_the_budget_is_refused():
    with pytest.raises(ValueError, match=r"budget of 512 tokens is smaller than one optimizer step of 3,200,000"):
        TrainConfig(tokens=512, batch_size=32, seq_len=100_000).validate()


@pytest.fixture
def corpus_text(tmp_path):
    path = tmp_path / "text.txt"  # paragraphs are the documents of a one-file corpus
    path.write_text("\n\n".join(f"paragraph {i}: the quick brown fox {i * 7 % 13} jumps\n" * 4 for i in range(600)))
    return path


def test_progress_lines_without_a_terminal(tmp_path, capsys):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=False, progress_seconds=0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line.split(" (")[0] for line in lines] == [f"step {k}/6" for k in range(1, 7)]
    assert "tok/s" in lines[-1]
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, progress_seconds=0, overwrite=True)
    assert "step 1/6" not in capsys.readouterr().err


def test_an_edited_config_is_refused_with_its_fields_unless_accepted(tmp_path):
    """Before the fix, resume and eval read the run's settings from config.json, which had no checksum."""
    from drmlab.runs import EditedConfigError

    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=2)
    run = RunDir(tmp_path)
    config = json.loads(run.config_path.read_text())
    config["train"]["seed"] += 1
    config["train"]["lr"] = 0.5
    run.config_path.write_text(json.dumps(config, indent=2))
    with pytest.raises(
        EditedConfigError,
        match=r"config.json was edited after the run wrote it \(train.seed: 0 -> 1; "
        r"train.lr: 0.01 -> 0.5\).*--accept-edited-config",
    ):
        run.read_config()
    assert run.read_config(accept_edited=True)["train"]["lr"] == 0.5
    assert run.accept_config_edits() == ["train.seed: 0 -> 1", "train.lr: 0.01 -> 0.5"]
    assert run.read_config()["train"]["seed"] == 1  # sealed again
    assert run.read_metrics()[-1] == {
        "kind": "config_edited",
        "changed": ["train.seed: 0 -> 1", "train.lr: 0.01 -> 0.5"],
    }
    assert run.accept_config_edits() == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real tmpfs of 480 KB (needs root and mount; skipped otherwise)."""
    where = tmp_path / "small"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=480k", "tmpfs", str(where)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


class WideLM(SmallLM):
    """SmallLM with a 1 MB buffer-free weight: its checkpoint cannot fit the small tmpfs."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.wide = nn.Parameter(torch.zeros(256, 1024))


def test_a_full_real_disk_is_one_line_naming_the_path(small_tmpfs, capsys):
    """Before the fix, safetensors' SafetensorError on ENOSPC was a 24-line traceback."""
    with pytest.raises(OSError) as caught:
        train(WideLM(), _stream(), None, _cfg(), small_tmpfs / "run", quiet=True, stop_after_step=2)
    message = str(caught.value)
    assert (
        message.startswith("no space left on the device while writing ") and "/run/checkpoints/step-0000000" in message
    )
    assert "\n" not in message and "intact" in message
    # the first checkpoint did not fit: nothing is committed, and the line does not pretend otherwise
    assert "no checkpoint was committed yet" in message and "start again" in message and "resume" not in message
    assert not [p for p in (small_tmpfs / "run").iterdir() if p.name.startswith(".checkpoint-")]


def test_the_disk_error_says_which_checkpoint_is_intact(tmp_path):
    """With a committed pointer in the run, the line names that run and says resume; without, start again."""
    import errno

    from drmlab.runs.jsonio import disk_error

    run = tmp_path / "run"
    target = run / "checkpoints" / ".tmp-step-2" / "model.safetensors"
    full = OSError(errno.ENOSPC, "No space left on device")
    assert "no checkpoint was committed yet" in str(disk_error(full, target))
    run.mkdir()
    (run / "checkpoint.json").write_text("{}")
    message = str(disk_error(full, target))
    assert f"the checkpoint committed in {run} " in message and "free some space and resume" in message
    assert f"the checkpoint committed in {run} " in str(disk_error(full, run / "metrics.jsonl"))


def test_a_full_disk_on_metrics_names_the_file(small_tmpfs):
    log_path = small_tmpfs / "metrics.jsonl"
    (small_tmpfs / "filler").write_bytes(b"\0" * (480 * 1024 - 4096))
    from drmlab.runs import MetricsLog

    log = MetricsLog(log_path)
    with pytest.raises(OSError, match=rf"no space left on the device while writing {log_path}"):
        for _ in range(1000):
            log.log({"kind": "train", "loss": 1.0, "pad": "x" * 200})


@pytest.mark.parametrize(
    "line, words",
    [
        ("[1]", "line 2 is not a JSON object (list)"),
        ('{"kind": "train", "step": null}', "line 2 has step None, not an integer"),
        ("{oops", "line 2 is not valid JSON"),
    ],
)
def test_a_damaged_metrics_line_is_named_by_its_number(tmp_path, line, words):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    lines = run.metrics_path.read_text().splitlines()
    run.metrics_path.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=re.escape(words)):
        run.read_metrics()
    with pytest.raises(ValueError, match=re.escape(words)):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True)


def test_lost_metrics_rows_are_reported_on_resume(tmp_path):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    assert run.truncate_metrics(3) is None
    rows = run.metrics_path.read_text().splitlines()
    run.metrics_path.write_text("\n".join(r for r in rows if '"step": 2,' not in r) + "\n")
    assert run.truncate_metrics(3) == (
        f"{run.metrics_path} lacks the train rows of 1 of the 3 steps before the "
        "checkpoint (first missing step 2): those rows are lost"
    )
    run.metrics_path.unlink()
    assert "metrics.jsonl is missing before the checkpoint (first missing step 1)" in run.truncate_metrics(3)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "a flipped sum"])
def test_a_damaged_manifest_is_refused_in_one_line(tmp_path, damage):
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    manifest = run.checkpoint_dir() / "manifest.json"
    text = manifest.read_text()
    if damage == "deleted":
        manifest.unlink()
    elif damage == "truncated":
        manifest.write_text(text[: len(text) // 2])
    else:
        digit = text.index('"sha256": "') + 11
        manifest.write_text(text[:digit] + ("0" if text[digit] != "0" else "1") + text[digit + 1 :])
    with pytest.raises(CorruptCheckpointError) as caught:
        run.load_checkpoint(SmallLM())
    assert "manifest.json" in str(caught.value) and "\n" not in str(caught.value)


def test_weights_readers_need_only_the_files_they_read(tmp_path):
    """Before the fix, a damaged optimizer file blocked eval, generate and export, which read only the weights."""
    train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    optimizer_file = run.checkpoint_dir() / "optimizer.safetensors"
    optimizer_file.write_bytes(optimizer_file.read_bytes()[:-4])
    run.load_checkpoint(SmallLM())  # the weights and the trainer state verify
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.safetensors has .* bytes"):
        train(SmallLM(), _stream(), None, _cfg(), tmp_path, quiet=True, resume=True)


def test_a_short_run_whose_final_ce_is_worse_than_uniform_is_diverged_not_finished(tmp_path):
    """Before the fix, --lr 10 on a run shorter than the divergence window finished with val CE 1,994."""
    cfg = _cfg(tokens=4 * 8 * 3)  # 3 steps, fewer than divergence_steps
    with pytest.raises(
        DivergenceError,
        match=r"the final validation CE is 1994.0000 nats/token .* above the uniform "
        r"guess 4.1589 \+ 1 nats",
    ):
        train(SmallLM(), _stream(), None, cfg, tmp_path, quiet=True, evaluate=lambda *a: {"ce": 1994.0})
    summary = read_json(tmp_path / "summary.json")
    assert summary["finished"] is False and summary["stopped"] == "diverged"
    train(SmallLM(), _stream(), None, cfg, tmp_path / "fine", quiet=True, evaluate=lambda *a: {"ce": 4.0})


def test_the_cli_refuses_an_edited_config_unless_accepted(tmp_path, capsys, corpus_text):
    """The sealed config.json on the command line: eval and --resume refuse an edited config.json in one line;
    --accept-edited-config takes it and records it."""
    from drmlab.cli import main

    out = tmp_path / "run"
    data = ["--data", str(corpus_text), "--cache-dir", str(tmp_path / "cache")]
    argv = [*_train_argv(out, corpus_text, tokens="1k"), "--quiet"]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    config["train"]["eval_tokens"] = 64
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(out), *data, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "config.json was edited after the run wrote it (train.eval_tokens: None -> 64)" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["eval", "--ckpt", str(out), *data, "--quiet", "--accept-edited-config"]) == 0
    assert "accepted the edited" in capsys.readouterr().err
    assert RunDir(out).read_config()["train"]["eval_tokens"] == 64  # sealed again
    assert [r for r in RunDir(out).read_metrics() if r["kind"] == "config_edited"]


@pytest.mark.parametrize("device", ["foo", "cuda:x", "xla"])
def test_an_unknown_device_is_one_line(device):
    from drmlab.devices import resolve_device

    with pytest.raises(ValueError, match=rf"--device '{device}'"):
        resolve_device(device)


def test_the_advice_after_a_stop_without_a_checkpoint_is_a_command_that_works(tmp_path, capsys, corpus_text):
    """Before the fix, --lr 1e6 stopped cleanly but advised --resume, which failed (no checkpoint)."""
    from drmlab.cli import main

    argv = _train_argv(tmp_path / "run", corpus_text)
    assert main([*argv, "--lr", "1e6", "--quiet"]) == 1
    err = capsys.readouterr().err
    advice = err.split("no checkpoint was written; start again with a fix: drmlab ", 1)[1].split(" (or --set")[0]
    assert "--overwrite --lr 100000" in advice
    assert main(advice.replace("--lr 100000", "--lr 0.003").split()) == 0  # the advised command runs


def test_a_resume_over_lost_metrics_rows_says_so_and_records_it(tmp_path, capsys):
    cfg = _cfg()
    train(SmallLM(), _stream(), None, cfg, tmp_path, quiet=True, stop_after_step=3)
    run = RunDir(tmp_path)
    run.metrics_path.write_text(
        "\n".join(r for r in run.metrics_path.read_text().splitlines() if '"step": 2,' not in r)
    )
    summary = train(SmallLM(), _stream(), None, cfg, tmp_path, quiet=True, resume=True)
    assert summary["finished"]
    assert "lacks the train rows of 1 of the 3 steps before the checkpoint" in capsys.readouterr().err
    (resume_row,) = [r for r in run.read_metrics() if r["kind"] == "resume"]
    assert "first missing step 2" in resume_row["lost_rows"]


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(tmp_path, capsys, corpus_text, monkeypatch):
    """Before the fix, --set d_state=100000000 hung in the allocation, then raised a traceback."""
    from drmlab.cli import machine, main

    monkeypatch.setattr(machine, "available_memory_bytes", lambda device: 8 * 2**30)
    out = tmp_path / "run"
    argv = [*_train_argv(out, corpus_text, "J", "1k"), "--quiet"]
    assert main([*argv, "--set", "d_state=100000000"]) == 2
    err = capsys.readouterr().err
    assert "J (micro, d_state=100000000) has 32,700,018,952 parameters: training needs at least 487.3 GiB" in err
    assert "8.0 GiB is available" in err and err.count("\n") == 1 and not out.exists()
    assert main(argv) == 0  # the preset's model fits


def test_a_second_sigterm_stops_at_once_with_143_and_one_line(tmp_path, monkeypatch, capsys, corpus_text):
    """Before the fix, a second SIGTERM exited 130 (as Ctrl-C) instead of 143."""
    from drmlab.cli import main

    real_step = Trainer.train_step

    def step_then_two_sigterms(self, step):
        row = real_step(self, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return row

    monkeypatch.setattr(Trainer, "train_step", step_then_two_sigterms)
    argv = [*_train_argv(tmp_path / "run", corpus_text), "--quiet"]
    assert main(argv) == 143
    err = capsys.readouterr().err
    assert "SIGTERM received twice: stopped at once" in err and "Traceback" not in err


def test_sigterm_during_the_final_evaluation_is_one_line_and_resume_evaluates(tmp_path, capsys, corpus_text):
    """Before the fix, SIGTERM during the final evaluation killed the process (exit -15) without a word."""
    from drmlab.cli import main
    from drmlab.evaluation import rescoring

    real = rescoring.rescore
    calls = []

    def sigterm_first_time(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    out = tmp_path / "run"
    argv = [*_train_argv(out, corpus_text), "--quiet"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rescoring, "rescore", sigterm_first_time)
        assert main(argv) == 143
        err = capsys.readouterr().err
        assert "SIGTERM received during the final evaluation: stopped it; the last good checkpoint (step 8)" in err
        assert f"continue with: drmlab train --resume --out {out}" in err and "Traceback" not in err
        assert main([*argv, "--resume"]) == 0  # the evaluation runs again
    assert RunDir(out).finished_summary() is not None


def test_a_damaged_summary_does_not_block_resume(tmp_path, capsys):
    """summary.json (no checksum; rewritten at the end) damaged after a stop: resume says so in one line
    and continues bit-exactly, as after an ordinary stop."""
    cfg = _cfg()
    train(SmallLM(), _stream(), None, cfg, tmp_path / "run", quiet=True, stop_after_step=3)
    (tmp_path / "run" / "summary.json").write_text('{"stopped": ')
    reference = SmallLM()
    train(reference, _stream(), None, cfg, tmp_path / "whole", quiet=True)
    model = SmallLM(seed=1)
    capsys.readouterr()
    summary = train(model, _stream(), None, cfg, tmp_path / "run", quiet=True, resume=True)
    note = [line for line in capsys.readouterr().err.splitlines() if "summary.json" in line]
    assert len(note) == 1 and "is not valid JSON" in note[0] and "resuming as after an ordinary stop" in note[0]
    assert summary["finished"] and _same(_weights(model), _weights(reference))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["finished"]
