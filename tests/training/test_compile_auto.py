"""``--compile auto`` (drmlab/training/compile_choice.py; docs/architecture.md "Compiled models"): a run compiles
when the saving its figures predict over its planned steps is at least MARGIN times the compile's cost; the
figures come from this machine's records of earlier compiled runs, else the benchmark's table on a CPU with the
eager step timed in the run; an unmeasured model, a ratio at or below 1 and a distributed run without a record
stay eager; the choice is one line and config.json's runtime; a resumed run keeps it; a compile that fails under
auto trains eager instead; a compiled run adds its figures to the records; ``drmlab train`` defaults to auto."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drmlab.training import compile_choice
from drmlab.training.compile_choice import MARGIN, CompileRecords, choose

CPU = torch.device("cpu")


def never():
    raise AssertionError("the eager step was timed though the figures could not make compiling pay")


def _choose(records, steps, eager=never, measured=None, device=CPU, precision="float32"):
    return choose(
        "SSM_CONTROL",
        key="k",
        device=device,
        precision=precision,
        steps=steps,
        grad_accum=1,
        eager_seconds=eager,
        records=records,
        measured={} if measured is None else measured,
    )


def test_a_record_of_this_machine_decides_by_the_margin(tmp_path):
    """ratio 1.5 saves a third of each 0.1 s step: 1,000 steps save 33 s, over 2 x 10 s of compiling (on);
    100 steps save 3.3 s (off). The record's own eager time is used: nothing is timed."""
    records = CompileRecords(tmp_path / "records.jsonl")
    records.add("other", eager_seconds=1.0, compiled_seconds=0.1, compile_seconds=1.0)
    records.add("k", eager_seconds=0.1, compiled_seconds=0.1 / 1.5, compile_seconds=10.0)
    on = _choose(records, 1000)
    assert on.on and on.source == "this machine"
    assert on.expected_saving_seconds == pytest.approx(1000 * 0.1 / 3) and on.compile_seconds == 10.0
    assert on.expected_saving_seconds >= MARGIN * on.compile_seconds
    assert on.why.startswith("compile: on (auto): 1.50x per step (measured on this machine on ")
    assert "saves about 33 s over 1,000 steps for about 10 s of compiling" in on.why
    off = _choose(records, 100)
    assert not off.on and "saves about 3.3 s over 100 steps" in off.why and "--compile on to force it" in off.why
    # the latest record of a key is the one used
    records.add("k", eager_seconds=0.1, compiled_seconds=0.2, compile_seconds=1.0)
    slower = _choose(records, 10**6)
    assert not slower.on and slower.ratio == pytest.approx(0.5) and "trained no faster (0.50x" in slower.why


def test_the_benchmark_table_on_a_cpu_times_the_eager_step(tmp_path):
    records = CompileRecords(tmp_path / "none.jsonl")
    table = {("SSM_CONTROL", "float32"): (1.25, 60.0), ("J", "float32"): (0.95, 150.0)}
    timed = []

    def eager():
        timed.append(1)
        return 0.5

    # 0.5 s x (1 - 1/1.25) = 0.1 s a step: 1,210 steps save 121 s > 2 x 60 s (on), 1,190 save 119 s (off)
    assert _choose(records, 1210, eager, table).on and timed == [1]
    assert not _choose(records, 1190, eager, table).on
    assert "measured on one thread of" in _choose(records, 1210, eager, table).why
    # at or below 1 the step is never timed; another precision or device has no figures
    j = choose(
        "J", key="k", device=CPU, precision="float32", steps=10**9, grad_accum=1, eager_seconds=never,
        records=records, measured=table,
    )  # fmt: skip
    assert not j.on and "0.95x" in j.why
    for device, precision in ((CPU, "bf16"), (torch.device("cuda"), "float32")):
        none = _choose(records, 10**9, never, table, device=device, precision=precision)
        assert not none.on and f"not measured for SSM_CONTROL in {precision} on {device.type}" in none.why
    # a distributed run cannot time its eager step: without a record of its own it stays eager
    dist = _choose(records, 10**9, lambda: None, table)
    assert not dist.on and "a distributed run cannot time" in dist.why


def test_records_that_cannot_be_read_are_no_record(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('not json\n["a list"]\n{"key": "k", "eager_seconds": 0.2, "ratio": 2.0, "compile_seconds": 1}\n')
    assert CompileRecords(path).latest("k")["ratio"] == 2.0
    assert CompileRecords(tmp_path / "missing" / "records.jsonl").latest("k") is None
    CompileRecords(tmp_path / "missing" / "records.jsonl").add(
        "k", eager_seconds=1.0, compiled_seconds=0.5, compile_seconds=1.0
    )  # an unwritable place: nothing, no error
    assert CompileRecords(None).latest("k") is None


# ------------------------------------------------------------------------------------------ in the trainer


def _micro_cfg(steps, **kw):
    from drmlab.training import resolve_train_config

    cfg = resolve_train_config("micro", eval_every=0, eval_tokens=256, **kw)
    return resolve_train_config("micro", tokens=cfg.tokens_per_step * steps, eval_every=0, eval_tokens=256, **kw)


def _stream():
    import numpy as np

    return np.random.default_rng(0).integers(32, 127, 200_000).astype(np.uint8)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """The machine's records in a folder of the test's own."""
    store = CompileRecords(tmp_path / "compile-records.jsonl")
    monkeypatch.setattr(compile_choice.CompileRecords, "default", classmethod(lambda cls: store))
    return store


def _key_of(model, cfg):
    """The key a run of ``model`` under ``cfg`` in this process files its figures under (as config.json holds
    the model's configuration)."""
    from drmlab.runs import jsonable
    from drmlab.training.compile_choice import record_key

    config = jsonable(dataclasses.asdict(model.config))
    return record_key(model.model_name, config, (cfg.batch_size, cfg.seq_len), "float32", CPU)


def test_auto_compiles_when_its_record_pays_records_the_run_and_a_resume_keeps_the_choice(
    tmp_path, records, monkeypatch, capsys
):
    """A record that pays: the run compiles (compile_model stands in for inductor here: the plumbing is the
    subject), says so in one line, records the choice in config.json's runtime, and adds its own figures;
    resumed after the record changed to one that does not pay, it goes on compiled as it began."""
    import drmlab.training.compiled as compiled_module
    from drmlab.models import build_model
    from drmlab.training import train

    compiled = []
    monkeypatch.setattr(compiled_module, "compile_model", lambda net: compiled.append(net) or net)
    model = build_model("SSM_CONTROL", "micro", seed=0)
    cfg = _micro_cfg(3, compile="auto", schedule="constant", checkpoint_every=0)
    records.add(_key_of(model, cfg), eager_seconds=1.0, compiled_seconds=0.25, compile_seconds=0.5)
    out = tmp_path / "run"
    train(model, _stream(), None, cfg, out)
    assert len(compiled) == 1
    err = capsys.readouterr().err
    assert "compile: on (auto): 4.00x per step (measured on this machine" in err
    runtime = json.loads((out / "config.json").read_text())["runtime"]
    assert runtime["compile"]["on"] is True and runtime["compile"]["source"] == "this machine"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows].count("compile") == 1
    lines = records.path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[-1])["key"] == json.loads(lines[0])["key"]
    # now the record says it does not pay; the resumed run (2 more steps) still compiles, as it began
    records.add(_key_of(model, cfg), eager_seconds=1.0, compiled_seconds=2.0, compile_seconds=0.5)
    longer = _micro_cfg(5, compile="auto", schedule="constant", checkpoint_every=0)
    train(build_model("SSM_CONTROL", "micro", seed=0), _stream(), None, longer, out, resume=True)
    assert len(compiled) == 2
    assert json.loads((out / "config.json").read_text())["runtime"]["compile"]["on"] is True
    # a new run decides again, from the latest record (the resumed run added its own; this one says it does not
    # pay): off, quietly for a run this short (the choice is in config.json)
    records.add(_key_of(model, cfg), eager_seconds=1.0, compiled_seconds=2.0, compile_seconds=0.5)
    capsys.readouterr()
    train(build_model("SSM_CONTROL", "micro", seed=0), _stream(), None, cfg, tmp_path / "new")
    assert len(compiled) == 2 and "compile:" not in capsys.readouterr().err
    assert json.loads((tmp_path / "new" / "config.json").read_text())["runtime"]["compile"]["on"] is False


def test_a_compile_that_fails_under_auto_trains_eager(corpus_file, tmp_path, records, monkeypatch, capsys):
    """The scan's old graph break put back: under auto the run says in one line why it trains eager and
    finishes; under --compile on the same run is refused (test_compile.py)."""
    import drmlab.models.drm.stages.memory as drm_memory
    from drmlab.cli import main
    from drmlab.models import build_model

    monkeypatch.setattr(drm_memory, "linear_scan", torch.compiler.disable(drm_memory.linear_scan))
    model = build_model("SSM_CONTROL", "micro", seed=0)
    records.add(
        _key_of(model, _micro_cfg(1)), eager_seconds=10.0, compiled_seconds=1.0, compile_seconds=0.01
    )  # pays at once
    torch._dynamo.reset()
    out = tmp_path / "run"
    argv = ["train", "--model", "SSM_CONTROL", "--preset", "micro", "--tokens", "512", "--data", str(corpus_file)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--eval-tokens", "256", "--compile", "auto"]
    argv += ["--threads", str(torch.get_num_threads())]  # the record's key holds the thread count
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "compile: on (auto)" in err
    (line,) = [x for x in err.splitlines() if x.startswith("compile: off (auto): SSM_CONTROL cannot be compiled")]
    assert line.endswith("; training SSM_CONTROL eager")
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["compile"] == "auto" and config["runtime"]["compile"]["on"] is False
    assert "cannot be compiled" in config["runtime"]["compile"]["failed"]
    torch._dynamo.reset()


def test_train_defaults_to_auto_and_takes_on_off_and_a_bare_flag(monkeypatch):
    from drmlab.cli import build_parser, common
    from drmlab.cli.train_request import TrainRequest, resolve_settings

    parser = build_parser()

    def setting(*flags):
        request = TrainRequest.from_args(parser.parse_args(["train", "--model", "J", *flags]))
        return resolve_settings(request, None)[-1].compile

    monkeypatch.delenv("DRMLAB_COMPILE", raising=False)
    assert setting() == "auto"
    assert setting("--compile") is True and setting("--compile", "on") is True
    assert setting("--compile", "off") is False and setting("--compile", "auto") == "auto"
    monkeypatch.setenv("DRMLAB_COMPILE", "off")
    assert setting() is False and setting("--compile", "on") is True
    monkeypatch.setenv("DRMLAB_COMPILE", "sometimes")
    with pytest.raises(ValueError, match=r"\$DRMLAB_COMPILE must be on, off or auto, got 'sometimes'"):
        common.default_compile()
    # a resumed run keeps what it had
    monkeypatch.delenv("DRMLAB_COMPILE")
    request = TrainRequest.from_args(parser.parse_args(["train", "--resume", "--out", "x"]))
    saved = {"model": "J", "preset": "micro", "train": {"compile": False}}
    assert resolve_settings(request, saved)[-1].compile is False


def test_auto_from_the_benchmark_table_times_the_eager_step_once(tmp_path, records, monkeypatch, capsys):
    """No record here: the table's figures and one eager timing decide; the compile report reuses that timing."""
    import drmlab.training.compiled as compiled_module
    import drmlab.training.measuring as measuring
    from drmlab.models import build_model
    from drmlab.training import train

    calls = []
    real = measuring.time_eager_pass
    monkeypatch.setattr(measuring, "time_eager_pass", lambda *args: calls.append(1) or real(*args))
    monkeypatch.setattr(compiled_module, "compile_model", lambda net: net)
    monkeypatch.setattr(compile_choice, "MEASURED", {("SSM_CONTROL", "float32"): (100.0, 0.0)})
    train(build_model("SSM_CONTROL", "micro", seed=0), _stream(), None, _micro_cfg(3, compile="auto"), tmp_path / "r")
    assert calls == [1]
    choice = json.loads((tmp_path / "r" / "config.json").read_text())["runtime"]["compile"]
    assert choice["on"] is True and choice["source"] == "benchmark" and "measured on one thread" in choice["why"]
