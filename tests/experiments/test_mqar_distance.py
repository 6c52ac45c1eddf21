"""The distance MQAR protocol (docs/mqar.md section 8, drmlab.experiments.mqar.distance): the task's
tokens and scored positions, the Wilson interval, reading with a carried state against one forward,
context limits, the gates, and the study end to end on micro (train, resume, --ckpt, the CLI)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from drmlab.cli import main
from drmlab.cli import mqar as mqar_cli
from drmlab.experiments.mqar import distance as md
from drmlab.models import build_model

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------- the task
@pytest.mark.parametrize("length", [40, 72])
def test_examples_follow_the_layout(length):
    tokens = md.evaluation_tokens(3, length, range(12))
    assert tokens.dtype == torch.int64 and tokens.shape == (12, length)
    inputs, targets = md.split_tokens(tokens)
    assert torch.equal(inputs, tokens[:, :-1]) and targets.shape == inputs.shape
    q = length - 24
    for row, tgt in zip(tokens.tolist(), targets.tolist()):
        keys, values = row[0:16:2], row[1:16:2]
        assert len(set(keys)) == 8 and all(2 <= k <= 33 for k in keys) and all(34 <= v <= 97 for v in values)
        assert all(98 <= f <= 255 for f in row[16:q]) and len(row[16:q]) == length - 40
        assert row[q::3] == [1] * 8 and sorted(row[q + 1 :: 3]) == sorted(keys)
        lookup = dict(zip(keys, values))
        assert row[q + 2 :: 3] == [lookup[k] for k in row[q + 1 :: 3]]
        scored = [t for t, y in enumerate(tgt) if y != md.IGNORE]
        assert scored == [q + 3 * j + 1 for j in range(8)] == md.scored_positions(length).tolist()
        assert [tgt[t] for t in scored] == [lookup[row[t]] for t in scored]  # the value after each queried key


def test_rows_ask_the_same_questions_at_every_length_and_batches_are_fresh():
    short, long = md.evaluation_tokens(0, 40, range(6)), md.evaluation_tokens(0, 136, range(6))
    assert torch.equal(short[:, :16], long[:, :16]) and torch.equal(short[:, 16:], long[:, -24:])
    assert torch.equal(md.evaluation_tokens(0, 136, range(2, 4)), long[2:4])  # a row is a pure function of its index
    assert not torch.equal(md.evaluation_tokens(1, 40, range(6)), short)
    batches = md.DistanceBatches(4)
    x, y = batches.batch(7, 3, 0)
    assert x.shape == y.shape == (4, 39) and ((y != md.IGNORE).sum(1) == 8).all()
    assert torch.equal(x, batches.batch(7, 3, 0)[0]) and not torch.equal(x, batches.batch(7, 4, 0)[0])
    assert not any(torch.equal(x, short[i : i + 4, :-1]) for i in range(3))
    # numpy pads seed lists with zeros: no training stream [s, k, m] (even k = 0) is an evaluation row's
    row0 = md.draw_example(np.random.default_rng([0, 0, 0, 1]), np.random.default_rng([0, 0, 0, 2]), 40)
    assert np.array_equal(row0, short[0].numpy()) and not np.array_equal(
        md.training_tokens(0, 0, 0, 1)[0].numpy(), row0
    )
    with pytest.raises(ValueError, match=">= 40"):
        md.evaluation_tokens(0, 39, range(1))


# ---------------------------------------------------------------------------------- statistics
def test_wilson_interval_against_hand_computed_values():
    # 8/10, z = 1.9599640, z^2 = 3.8414588: centre (0.8 + 0.1920729) / 1.3841459 = 0.7167402, half
    # (1.9599640 / 1.3841459) * sqrt(0.016 + 0.0096036) = 1.4160097 * 0.1600114 = 0.2265777,
    # so [0.4901625, 0.9433179] (the textbook 0.4902 / 0.9433)
    lo, hi = md.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=2e-7) and hi == pytest.approx(0.9433179, abs=2e-7)
    # the notes' control row: 32.25% of 4,096 targets = 1,321, printed [30.84, 33.70]
    lo, hi = md.wilson_interval(1321, 4096)
    assert (round(100 * lo, 2), round(100 * hi, 2)) == (30.84, 33.70)
    assert md.wilson_interval(0, 64)[0] == 0.0 and md.wilson_interval(64, 64)[1] == 1.0
    with pytest.raises(ValueError):
        md.wilson_interval(3, 0)
    # no-binding levels: (1 + 7/64) / 8, and the mean over r = 8..1 candidates left of (1 + (r-1)/64) / r
    # = (H_8 + (8 - H_8) / 64) / 8 with H_8 = 761/280
    assert md.CONTEXT_GUESS == pytest.approx(0.138671875)
    assert md.ELIMINATION_GUESS == pytest.approx((761 / 280 + (8 - 761 / 280) / 64) / 8) == pytest.approx(0.3500488)


def _read(acc, state=1000):
    return {"status": "read", "acc": acc, "state_bytes": state}


def test_gates_on_synthetic_numbers():
    ok = md.gate_verdicts({40: _read(0.85), 512: _read(0.8), 4096: _read(0.99), 32768: _read(0.9)})
    assert ok["passed"] and ok["control"]["pass"] and set(ok["lengths"].values()) == {"pass"} and ok["reasons"] == []
    assert ok["state"] == {"lengths": [4096, 32768], "bytes": [1000, 1000], "pass": True}
    one = md.gate_verdicts({40: _read(0.85), 512: _read(0.9), 4096: _read(0.81), 32768: _read(0.79)})
    assert not one["passed"] and one["lengths"] == {"512": "pass", "4096": "pass", "32768": "fail"}
    assert one["reasons"] == ["32768: fail (79.00%)"]
    weak = md.gate_verdicts({40: _read(0.7999), 512: _read(1.0), 4096: {"status": "not read"}})
    assert not weak["passed"] and weak["lengths"] == {"512": "not authorised", "4096": "not authorised"}
    assert weak["reasons"][0].startswith("control 79.99% < 80%")
    na = md.gate_verdicts({40: _read(1.0), 512: {"status": "n/a", "context": 256}, 4096: {"status": "not read"}})
    assert not na["passed"] and na["lengths"] == {"512": "n/a (context 256)", "4096": "not read"}
    grown = md.gate_verdicts({40: _read(1.0), 4096: _read(1.0, 100), 32768: _read(1.0, 111)})
    assert not grown["passed"] and grown["state"]["pass"] is False
    assert md.gate_verdicts({40: _read(1.0), 4096: _read(1.0, 100), 32768: _read(1.0, 110)})["passed"]
    assert not md.gate_verdicts({512: _read(1.0)})["passed"]  # no control, no authorisation


# ---------------------------------------------------------------------------------- reading
@pytest.mark.parametrize("name", ["SSM_CONTROL", "J", "MAMBA"])
def test_reading_with_a_carried_state_equals_one_forward(name):
    model = build_model(name, preset="micro", vocab_size=256, seed=0).double().eval()
    inputs, _ = md.split_tokens(md.evaluation_tokens(0, 72, range(3)))
    positions = md.scored_positions(72)
    full = model(inputs).logits[:, positions]
    stepped, state = md.read_scored(model, inputs, positions, chunk=13)  # prefill 13 tokens, step 58
    assert torch.allclose(stepped, full, rtol=0, atol=1e-10)
    whole, parallel_state = md.read_scored(model, inputs, positions, chunk=71)  # one forward
    assert torch.allclose(whole, full, rtol=0, atol=1e-12)
    assert md.state_nbytes(parallel_state) == md.state_nbytes(state)
    longer = md.read_scored(
        model, md.split_tokens(md.evaluation_tokens(0, 136, range(3)))[0], md.scored_positions(136), 13
    )[1]
    assert md.state_nbytes(longer) == md.state_nbytes(state) > 0  # constant memory: the state does not grow
    assert md.context_limit(model) is None


def test_an_attention_model_beyond_its_context_is_not_applicable():
    gpt2 = build_model("GPT2", preset="micro", vocab_size=256, seed=0)
    resolvent = build_model("RESOLVENT", preset="micro", vocab_size=256, seed=0)
    assert md.context_limit(gpt2) == 32  # its position table
    assert md.context_limit(resolvent) == 32  # no table, but a cache that grows: its training window
    record = md.read_length(gpt2, 72, 4, context=32)
    assert record["status"] == "n/a" and record["context"] == 32 and "acc" not in record
    wider = build_model("GPT2", preset="micro", vocab_size=256, seed=0, n_positions=39)
    assert (
        md.context_limit(wider) == 39 and md.read_length(wider, 40, 2, context=39)["status"] == "read"
    )  # 39 inputs fit


# ---------------------------------------------------------------------------------- the study
def test_defaults_of_the_cli_are_the_studys():
    assert mqar_cli.DISTANCE_MODELS == ",".join(md.DEFAULT_MODELS)
    assert mqar_cli.DISTANCE_SEEDS == ",".join(map(str, md.DEFAULT_SEEDS))
    assert mqar_cli.DISTANCE_LENGTHS == ",".join(map(str, md.DEFAULT_LENGTHS))
    assert mqar_cli.DISTANCE_MILESTONES == ",".join(map(str, md.DEFAULT_MILESTONES))
    assert (mqar_cli.DISTANCE_STEPS, mqar_cli.DISTANCE_BATCH_SIZE, mqar_cli.DISTANCE_LR) == (
        md.DEFAULT_STEPS,
        md.DEFAULT_BATCH_SIZE,
        md.DEFAULT_LR,
    )
    assert (
        mqar_cli.DISTANCE_N_EVAL,
        mqar_cli.DISTANCE_EVAL_BATCH,
        mqar_cli.DISTANCE_EVAL_SEED,
        mqar_cli.DISTANCE_CHUNK,
    ) == (md.DEFAULT_N_EVAL, md.DEFAULT_EVAL_BATCH, md.DEFAULT_EVAL_SEED, md.DEFAULT_CHUNK)


ARGS = [
    "mqar",
    "--protocol",
    "distance",
    "--preset",
    "micro",
    "--steps",
    "2",
    "--milestones",
    "1",
    "--batch-size",
    "4",
    "--lengths",
    "72",
    "--n-eval",
    "4",
    "--eval-batch",
    "4",
    "--chunk",
    "32",
    "--read-all",
]


def test_the_study_end_to_end_on_micro(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    assert main([*ARGS, "--models", "SSM_CONTROL,GPT2", "--seeds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| SSM_CONTROL s1 |" in printed and "n/a (context 40)" in printed and "results.md" in printed
    assert (out / "results.md").read_text() in printed and (out / "results.png").stat().st_size > 0
    summary = json.loads((out / "results.json").read_text())
    ssm, gpt2 = summary["entries"]
    assert [m["step"] for m in ssm["milestones"]] == [1, 2] and ssm["context"] is None
    assert ssm["lengths"]["72"]["mode"] == "prefill 32 + steps" and ssm["lengths"]["72"]["total"] == 32
    assert ssm["lengths"]["40"]["acc"] == ssm["milestones"][-1]["acc"]
    assert gpt2["lengths"]["72"] == {"length": 72, "n_eval": 4, "eval_seed": 0, "status": "n/a", "context": 40}
    assert not ssm["gates"]["passed"] and gpt2["gates"]["lengths"] == {"72": "n/a (context 40)"}

    # a rerun trains nothing; a run killed after its last step but before result.json is resumed, not redone
    import drmlab.training.trainer as trainer

    run_dir = out / "runs" / "SSM_CONTROL_s1"
    saved = json.loads((run_dir / "result.json").read_text())
    real_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("retrained a finished run"))
    # a result written before a train setting existed (bf16_memory_products) ran at its default: reused
    older = {k: v for k, v in saved["spec"]["train"].items() if k != "bf16_memory_products"}
    (run_dir / "result.json").write_text(json.dumps(dict(saved, spec=dict(saved["spec"], train=older))))
    assert main([*ARGS, "--models", "SSM_CONTROL,GPT2", "--seeds", "1", "--out", str(out)]) == 0
    partial = dict(saved, milestones=saved["milestones"][:1], lengths={})
    (run_dir / "result.json").write_text(json.dumps(partial))
    calls = []
    monkeypatch.setattr(trainer, "train", lambda *a, **k: calls.append(k) or real_train(*a, **k))
    assert main([*ARGS, "--models", "SSM_CONTROL", "--seeds", "1", "--out", str(out)]) == 0
    assert [(c["resume"], c["stop_after_step"]) for c in calls] == [(True, 2)]
    again = json.loads((run_dir / "result.json").read_text())
    assert again["milestones"] == saved["milestones"]
    assert again["lengths"]["72"]["correct"] == saved["lengths"]["72"]["correct"]

    # the trained run directory through --ckpt: no training, the same reads
    capsys.readouterr()
    assert (
        main(
            [
                "mqar",
                "--protocol",
                "distance",
                "--ckpt",
                str(run_dir),
                "--lengths",
                "72",
                "--n-eval",
                "4",
                "--chunk",
                "16",
                "--read-all",
                "--out",
                str(tmp_path / "evals"),
            ]
        )
        == 0
    )
    entry = json.loads((tmp_path / "evals" / "results.json").read_text())["entries"][0]
    assert entry["kind"] == "ckpt" and entry["model"] == "SSM_CONTROL" and entry["step"] == 2
    assert entry["lengths"]["72"]["correct"] == saved["lengths"]["72"]["correct"]
    assert entry["lengths"]["72"]["mode"] == "prefill 16 + steps"

    # the same run moved elsewhere: its reads are the same checkpoint's (the files' sha256), so none is redone
    import shutil

    from drmlab.experiments.mqar import distance

    moved = tmp_path / "moved" / run_dir.name
    shutil.copytree(run_dir, moved)
    # nothing is read now: the entry can only be the stored reads, reused
    monkeypatch.setattr(distance, "_read_lengths", lambda study, runtime, model, result, path: None)
    argv = ["mqar", "--protocol", "distance", "--ckpt", str(moved), "--lengths", "72", "--n-eval", "4"]
    assert main([*argv, "--chunk", "16", "--read-all", "--out", str(tmp_path / "evals")]) == 0
    assert json.loads((tmp_path / "evals" / "results.json").read_text())["entries"][0] == entry


@pytest.mark.parametrize(
    "argv, message",
    [
        (["mqar", "--protocol", "distance", "--kv", "8"], "--kv: only with --protocol fixed"),
        (["mqar", "--lengths", "512"], "--lengths: only with --protocol distance"),
        (["mqar", "--eval-seed", "0"], "--eval-seed: only with --protocol distance"),
        (["mqar", "--protocol", "distance", "--lengths", "30"], "length must be an integer >= 40"),
        (
            ["mqar", "--protocol", "distance", "--models", "L4_ds64"],
            "L4_ds64 is an anchor arm of the fixed MQAR protocol",
        ),
        (
            ["mqar", "--protocol", "distance", "--models", "SSM_CONTROL", "--steps", "10", "--milestones", "20"],
            "milestone 20 is beyond the 10 training steps",
        ),
        (["mqar", "--protocol", "distance", "--ckpt", "no-such-run"], "--ckpt no-such-run: not a drmlab run directory"),
    ],
    ids=lambda v: " ".join(v[2:4]) if isinstance(v, list) else None,
)
def test_bad_input_is_one_line(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("drmlab mqar: error: ") and message in err, err
    assert not (tmp_path / "out").exists()


def test_state_bytes_count_what_a_sequence_carries_not_the_fast_steps_caches():
    """The DRM fast step's block constants and the mixer's partial sums (``CACHE_FIELDS``) are
    recomputable from the rest of the state: a prefilled J state counts the same bytes as the state
    with those caches dropped, and the caches are really there (so the test can fail)."""
    model = build_model("J", preset="micro", vocab_size=256, seed=0).eval()
    state = model(torch.randint(0, 256, (2, 21)), return_state=True).state
    stripped = dataclasses.replace(
        state,
        stages=tuple(
            s._replace(**{f: None for f in type(s).CACHE_FIELDS}) if hasattr(type(s), "CACHE_FIELDS") else s
            for s in state.stages
        ),
    )
    cached = [s for s in state.stages if hasattr(type(s), "CACHE_FIELDS")]
    assert cached and all(getattr(s, f) is not None for s in cached for f in type(s).CACHE_FIELDS)
    assert md.state_nbytes(state) == md.state_nbytes(stripped) > 0
