"""The MQAR probe: data rules of ``docs/mqar.md`` section 1 (drmlab.experiments.mqar.task), accuracy on
the query positions only, chance, the anchor arms (mqar_models), the trainer's batch sources, the
study and its report (mqar, mqar_report) and a tiny CLI run (drmlab.cli.mqar)."""

from __future__ import annotations

import argparse
import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.cli import mqar as mqar_cli
from drmlab.experiments.mqar import models as mqar_models
from drmlab.experiments.mqar import report as mqar_report
from drmlab.experiments.mqar import study as mqar
from drmlab.experiments.mqar import task as mqar_task
from drmlab.experiments.spec import Runtime
from drmlab.models.output import ModelOutput
from drmlab.models.registry import config_fields
from drmlab.training.batches import FixedSetBatches
from drmlab.training.config import TrainConfig
from drmlab.training.trainer import IGNORE_INDEX, targets_loss, train

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------- data
def test_task_sizes_follow_the_notes():
    t4, t16 = mqar_task.MQARTask(kv=4), mqar_task.MQARTask(kv=16)
    assert (t4.length, t16.length) == (16, 52)  # 3 kv + 4
    assert t4.vocab_size == 130 and t4.first_value == 66
    assert t4.chance == pytest.approx(1 / 64)
    assert (t4.n_train, t4.n_test, t4.test_seed_offset) == (4096, 1024, 999)
    assert mqar_task.MQARTask(kv=8, queries=3).length == 2 * 8 + 3 + 4
    with pytest.raises(ValueError):
        mqar_task.MQARTask(kv=4, queries=5).validate()
    with pytest.raises(ValueError):
        mqar_task.MQARTask(kv=4, seq_len=11).validate()


def _reference(n: int, kv: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rule of ``docs/mqar.md`` section 1 written out: per sequence keys, values, permutation, in that order."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(n):
        keys = rng.choice(np.arange(2, 66), size=kv, replace=False)
        values = rng.integers(66, 130, size=kv)
        perm = rng.permutation(kv)
        x = [t for pair in zip(keys, values) for t in pair] + list(keys[perm]) + [0] * 4
        y = [-100] * (2 * kv) + list(values[perm]) + [-100] * 4
        xs.append(x)
        ys.append(y)
    return np.array(xs), np.array(ys)


@pytest.mark.parametrize("kv", [4, 16])
def test_generation_matches_the_rule_and_is_deterministic(kv):
    task = mqar_task.MQARTask(kv=kv)
    x, y = mqar_task.generate(task, 50, seed=3)
    rx, ry = _reference(50, kv, seed=3)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (50, 3 * kv + 4)
    np.testing.assert_array_equal(x.numpy(), rx)
    np.testing.assert_array_equal(y.numpy(), ry)
    x2, y2 = mqar_task.generate(task, 50, seed=3)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, mqar_task.generate(task, 50, seed=4)[0])
    for row, tgt in zip(x.tolist(), y.tolist()):
        keys, values = row[0 : 2 * kv : 2], row[1 : 2 * kv : 2]
        assert len(set(keys)) == kv and all(2 <= k <= 65 for k in keys)
        assert all(66 <= v <= 129 for v in values)
        queries = row[2 * kv : 3 * kv]
        assert sorted(queries) == sorted(keys) and row[3 * kv :] == [0, 0, 0, 0]
        lookup = dict(zip(keys, values))
        assert tgt[2 * kv : 3 * kv] == [lookup[q] for q in queries]
        assert set(tgt[: 2 * kv] + tgt[3 * kv :]) == {IGNORE_INDEX}


def test_pinned_first_sequence_and_split_seeds():
    task = mqar_task.MQARTask(kv=4)
    x, y = mqar_task.train_set(task, 0)
    assert x.shape == (4096, 16)
    assert x[0].tolist() == [19, 67, 34, 77, 53, 118, 41, 107, 19, 53, 41, 34, 0, 0, 0, 0]
    assert y[0].tolist() == [-100] * 8 + [67, 118, 107, 77] + [-100] * 4
    xt, _ = mqar_task.test_set(task, 0)
    assert xt.shape == (1024, 16)
    assert torch.equal(xt, mqar_task.generate(task, 1024, seed=999)[0])


def test_fewer_queries_take_the_first_of_the_permutation():
    x, y = mqar_task.generate(mqar_task.MQARTask(kv=4, queries=2), 20, seed=1)
    full_x, full_y = mqar_task.generate(mqar_task.MQARTask(kv=4), 20, seed=1)
    assert x.shape == (20, 14)
    assert torch.equal(x[:, :10], full_x[:, :10]) and torch.equal(y[:, :10], full_y[:, :10])
    assert ((y != -100).sum(1) == 2).all()


def test_batch_sampler_is_a_pure_function_of_its_coordinates():
    x, y = mqar_task.generate(mqar_task.MQARTask(kv=4), 64, seed=0)
    fn = FixedSetBatches(x, y, 16).global_batch
    a, b = fn(0, 5, 0), fn(0, 5, 0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].shape == (16, 16)
    assert not torch.equal(fn(0, 6, 0)[0], a[0]) and not torch.equal(fn(1, 5, 0)[0], a[0])
    rows = {tuple(r) for r in x.tolist()}
    assert all(tuple(r) in rows for r in a[0].tolist())


# ---------------------------------------------------------------------------------- accuracy
class CopyModel(nn.Module):
    """Solves MQAR causally: at position t predicts the token after the last earlier occurrence of
    tokens[t] at a key position (even index); everywhere else it predicts token 1 (never a target)."""

    def __init__(self, vocab: int = 130):
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens, step=None):
        B, T = tokens.shape
        pred = torch.ones(B, T, dtype=torch.long)
        for b in range(B):
            row = tokens[b].tolist()
            for t in range(T):
                for j in range(t - 1, -1, -1):
                    if j % 2 == 0 and row[j] == row[t] and j + 1 < t:
                        pred[b, t] = row[j + 1]
                        break
        return ModelOutput(logits=F.one_hot(pred, self.vocab).float() + 0 * self.dummy, aux={})


class ConstantModel(nn.Module):
    def __init__(self, token: int, vocab: int = 130):
        super().__init__()
        self.token, self.vocab = token, vocab
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens, step=None):
        return ModelOutput(logits=F.one_hot(torch.full_like(tokens, self.token), self.vocab).float(), aux={})


def test_copy_model_scores_100_and_constant_model_scores_chance():
    task = mqar_task.MQARTask(kv=4)
    x, y = mqar_task.test_set(task, 0)
    copy = mqar_task.accuracy(CopyModel(), x[:128], y[:128])
    ce = copy.pop("ce")  # one-hot logits: -log(e / (e + 129)) at every query
    assert ce == pytest.approx(math.log(math.e + 129) - 1, rel=1e-6)
    assert copy == {
        "acc": 1.0,
        "correct": 512,
        "total": 512,  # only the 4 query positions per sequence
        "by_query": [1.0, 1.0, 1.0, 1.0],
    }
    const = mqar_task.accuracy(ConstantModel(66), x, y)
    assert const["total"] == 4096
    assert 0.5 * task.chance < const["acc"] < 2 * task.chance
    # a model right on every non-query position but wrong on the queries scores 0
    shifted = mqar_task.accuracy(ConstantModel(0), x, y)  # predicts the pad: right at the 4 pad positions only
    assert shifted["acc"] == 0.0


class GuessModel(nn.Module):
    """Binds nothing: at a query answers with a uniformly drawn value slot of the context, or (with
    ``eliminate``) one whose key has not been queried yet in this sequence."""

    def __init__(self, kv: int, eliminate: bool, vocab: int = 130, seed: int = 0):
        super().__init__()
        self.kv, self.eliminate, self.vocab = kv, eliminate, vocab
        self.gen = torch.Generator().manual_seed(seed)
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens, step=None):
        B, T = tokens.shape
        pred = torch.ones(B, T, dtype=torch.long)
        for b in range(B):
            row = tokens[b].tolist()
            slots = list(range(self.kv))  # pair j: key at 2j, value at 2j + 1
            for t in range(2 * self.kv, T - 1):
                if row[t] == mqar_task.PAD:
                    break
                pick = slots[int(torch.randint(len(slots), (1,), generator=self.gen))]
                pred[b, t] = row[2 * pick + 1]
                if self.eliminate:
                    slots = [j for j in slots if row[2 * j] != row[t]]
        return ModelOutput(logits=F.one_hot(pred, self.vocab).float(), aux={})


@pytest.mark.parametrize("kv", [4, 8])
def test_the_no_binding_levels_are_what_guessers_score(kv):
    task = mqar_task.MQARTask(kv=kv)
    x, y = mqar_task.test_set(task, 0)
    context = mqar_task.accuracy(GuessModel(kv, eliminate=False), x, y)
    eliminate = mqar_task.accuracy(GuessModel(kv, eliminate=True), x, y)
    assert context["acc"] == pytest.approx(task.context_guess, abs=0.025)
    assert eliminate["acc"] == pytest.approx(task.elimination_guess, abs=0.025)
    assert eliminate["by_query"][-1] > 0.95  # the last query has one candidate left
    assert eliminate["by_query"][0] == pytest.approx(task.context_guess, abs=0.05)  # the first has them all
    assert task.context_guess < task.elimination_guess


# ---------------------------------------------------------------------------------- models
def test_anchor_arms_have_the_study_parameter_counts():
    task = mqar_task.MQARTask(kv=4)
    for name, expected in mqar_models.ANCHOR_PARAMS.items():
        model, registry, kw = mqar_models.build(name, "tiny", task, seed=0)
        assert registry == "LOOPED" and kw["positions"] == "none" and kw["d_model"] == 128
        assert sum(p.numel() for p in model.parameters()) == expected
    eps = {arm: mqar_models.build(f"{arm}_ds8", "tiny", task, 0)[0].body.eps for arm in ("L1", "L4", "L4u")}
    assert eps == {"L1": 1.0, "L4": 0.25, "L4u": 1.0}
    tied, _, _ = mqar_models.build("L4_ds8", "tiny", task, 0, arm_model="registry")
    assert sum(p.numel() for p in tied.parameters()) == mqar_models.ANCHOR_PARAMS["L4_ds8"] - 130 * 128
    a, b = mqar_models.build("L4_ds8", "tiny", task, 0)[0], mqar_models.build("L4_ds8", "tiny", task, 0)[0]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.body.tok_emb.weight.std() > 0.5  # torch's default N(0, 1) embedding, not the GPT init
    out = a(mqar_task.generate(task, 2, 0)[0])
    assert out.logits.shape == (2, 16, 130)


def test_width_mapping_and_position_table():
    task = mqar_task.MQARTask(kv=16)  # 52 tokens: longer than the micro presets' 32 positions
    # (GPT2 is left out: building it imports transformers, seconds; its field is checked below)
    assert mqar_models.width_overrides({"n_embd": 26, "n_head": 2}, 40) == {"n_embd": 40}
    assert mqar_models.width_overrides({"d_token": 16, "d_state": 16, "d_model": 3}, 40) == {
        "d_token": 40,
        "d_state": 40,
    }
    assert mqar_models.width_overrides({"hidden_size": 28, "num_attention_heads": 2}, 40) == {"hidden_size": 40}
    assert mqar_models.width_overrides({"d_model": 16}, None) == {}
    with pytest.raises(ValueError, match="width"):
        mqar_models.width_overrides({"hidden": 16}, 40)
    expect = {
        "J": {"d_token": 40, "d_state": 40},
        "LOOPED": {"d_model": 40},
        "MAMBA": {"d_model": 40},
        "L4_ds64": {"d_model": 40},
    }
    for name, fields in expect.items():
        registry, kw = mqar_models.resolve_model(name, "micro", task, width=40, overrides={})
        config = config_fields(registry, "micro", task.vocab_size, **kw)
        assert {k: config[k] for k in fields} == fields, name
        for key in mqar_models.POSITION_FIELDS:
            if key in config and name != "L4_ds64":
                assert config[key] >= 52, (name, key)
    _, kw = mqar_models.resolve_model("LOOPED", "micro", task, width=None, overrides={"d_model": 24})
    assert kw["d_model"] == 24 and kw["max_seq_len"] == 52


# ---------------------------------------------------------------------------------- trainer hook
def test_targets_loss_scores_only_the_unignored_targets():
    torch.manual_seed(0)
    model = nn.Module()
    logits = torch.randn(2, 5, 7)
    model.forward = lambda tokens, step=None: ModelOutput(logits=logits, aux={})
    targets = torch.tensor([[-100, 3, -100, 1, -100], [2, -100, -100, -100, 6]])
    _, ce = targets_loss(model, torch.zeros(2, 5, dtype=torch.long), targets)
    mask = targets != -100
    assert ce.item() == pytest.approx(F.cross_entropy(logits[mask], targets[mask]).item())


def test_train_with_a_batch_source_is_deterministic_and_checks_its_rows(tmp_path):
    task = mqar_task.MQARTask(kv=2, n_train=32)
    x, y = mqar_task.train_set(task, 0)
    cfg = TrainConfig(
        tokens=4 * 8 * task.length, batch_size=8, seq_len=task.length, eval_every=0, eval_windows=0, checkpoint_every=0
    )
    losses = []
    for run in range(2):
        model, _, _ = mqar_models.build("LOOPED", "micro", task, seed=0)
        summary = train(model, FixedSetBatches(x, y, 8), None, cfg, tmp_path / f"r{run}", quiet=True)
        assert summary["steps"] == 4 and summary["finished"] and "val_ce" not in summary
        losses.append([r["loss"] for r in summary["rows"]])
    assert losses[0] == losses[1]
    with pytest.raises(ValueError, match="not divisible by the number of processes"):
        FixedSetBatches(x, y, 6).batch(0, 1, 0, rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"one shape \[B, T\]"):
        FixedSetBatches(x, y[:, :-1], 8).batch(0, 1, 0)


# ---------------------------------------------------------------------------------- CLI
def _cli(argv):
    parser = argparse.ArgumentParser()
    mqar_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["mqar", *argv])
    return args.func(args)


def test_cli_end_to_end_and_reuse(tmp_path, capsys):
    out = tmp_path / "mqar"
    argv = [
        "--models",
        "L4_ds8,LOOPED,LOOPED:B",
        "--kv",
        "2,4",
        "--seeds",
        "0,1",
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--n-train",
        "32",
        "--n-test",
        "16",
        "--preset",
        "micro",
        "--width",
        "16",
        "--set",
        "lr=3e-3",
        "--out",
        str(out),
        "--quiet",
    ]
    assert _cli(argv) == 0
    printed = capsys.readouterr().out
    assert "chance = 1/64 = 1.56%" in printed and "| L4_ds8 |" in printed and "| LOOPED |" in printed
    assert not re.search(r"\[study: \d", printed)  # width 16 is not the study's model
    summary = json.loads((out / "mqar.json").read_text())
    cell = summary["models"]["LOOPED"]["cells"]["4"]
    assert cell["n_seeds"] == 2 and cell["chance"] == pytest.approx(1 / 64) and 0 <= cell["acc_mean"] <= 1
    run = json.loads((out / "runs" / "LOOPED_kv4_s1" / "result.json").read_text())
    assert run["test_queries"] == 16 * 4 and run["steps"] == 2 and run["spec"]["train"]["lr"] == 3e-3
    arm_b = json.loads((out / "runs" / "LOOPED-B_kv4_s1" / "result.json").read_text())  # NAME:ARM
    assert arm_b["registry_model"] == "LOOPED" and arm_b["overrides"]["arm"] == "B" and "| LOOPED:B |" in printed
    assert (out / "mqar.png").stat().st_size > 0 and (out / "mqar.md").is_file()
    # a result written before per-query accuracy existed is completed from its saved weights; one written
    # before a train setting existed (bf16_memory_products) ran at its default: reused, not retrained
    stripped = {k: v for k, v in run.items() if k != "test_by_query"}
    train = {k: v for k, v in run["spec"]["train"].items() if k != "bf16_memory_products"}
    stripped["spec"] = dict(run["spec"], train=train)
    (out / "runs" / "LOOPED_kv4_s1" / "result.json").write_text(json.dumps(stripped))
    assert _cli(argv) == 0  # every run reused
    assert (
        json.loads((out / "runs" / "LOOPED_kv4_s1" / "result.json").read_text())["test_by_query"]
        == run["test_by_query"]
    )
    assert json.loads((out / "mqar.json").read_text())["models"] == summary["models"]
    assert all(r.get("reused") for r in json.loads((out / "mqar.json").read_text())["runs"])


def test_table_shows_the_study_value_only_for_the_study_setting():
    def fake(seed, acc):
        return {
            "model": "L4_ds64",
            "kv": 4,
            "seed": seed,
            "test_acc": acc,
            "train_acc": 0.9,
            "chance": 1 / 64,
            "seconds_per_step": 0.4,
            "params": 215_873,
            "final_loss": 1.0,
        }

    study = mqar.MQARStudy(models=["L4_ds64"], kvs=[4], seeds=[0, 1])
    summary = mqar.summarize(study, [fake(0, 0.5), fake(1, 0.7)])
    cell = summary["models"]["L4_ds64"]["cells"]["4"]
    assert cell["acc_mean"] == pytest.approx(0.6) and cell["acc_std"] == pytest.approx(0.1)  # population std
    text = mqar_report.markdown(summary)
    assert "| L4_ds64 | 215,873 | 60.0% +- 10.0 (2) [study: 59.8%] | -- |" in text
    assert "| chance | | 1.56% | 1.56% |" in text and "| elimination (no binding) | | 52.83% | 26.17% |" in text
    other = mqar.MQARStudy(models=["L4_ds64"], kvs=[4], seeds=[0, 1], arm_model="registry")
    assert mqar.summarize(other, [fake(0, 0.5)])["models"]["L4_ds64"]["cells"]["4"]["anchor_acc"] is None


def test_cli_rejects_bad_settings(tmp_path):
    base = ["--steps", "1", "--out", str(tmp_path), "--quiet"]
    with pytest.raises(ValueError, match="unknown model"):
        _cli(["--models", "L4_ds65", *base])
    with pytest.raises(ValueError, match="unknown LOOPED arm 'Q'"):
        _cli(["--models", "LOOPED:Q", *base])
    with pytest.raises(ValueError, match="seq_len"):
        _cli(["--models", "L4_ds8", "--set", "seq_len=20", *base])
    with pytest.raises(ValueError, match="unknown setting"):
        _cli(["--models", "L4_ds8", "--set", "d_stat=4", *base])


def test_fresh_batches_every_step(tmp_path, capsys):
    """--n-train 0: every step draws new sequences (a pure function of seed, step, micro), never
    the test set's; no train accuracy is reported."""
    task = mqar_task.MQARTask(kv=4, n_train=0).validate()
    fn = mqar_task.FreshMQARBatches(task, 8).global_batch
    a, b = fn(1, 0, 0), fn(1, 1, 0)
    assert torch.equal(a[0], fn(1, 0, 0)[0]) and not torch.equal(a[0], b[0])
    x_test, _ = mqar_task.test_set(task, 1)
    test_rows = {tuple(r) for r in x_test.tolist()}
    assert not any(tuple(r) in test_rows for r in a[0].tolist())
    with pytest.raises(ValueError, match="n_train"):
        mqar_task.MQARTask(n_train=-1).validate()
    out = tmp_path / "fresh"
    assert (
        _cli(
            [
                "--models",
                "L4_ds8",
                "--kv",
                "4",
                "--seeds",
                "0",
                "--steps",
                "2",
                "--batch-size",
                "8",
                "--n-train",
                "0",
                "--n-test",
                "16",
                "--preset",
                "micro",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "train fresh every step" in printed and "% / --," in printed
    run = json.loads((out / "runs" / "L4_ds8_kv4_s0" / "result.json").read_text())
    assert run["train_acc"] is None and run["steps"] == 2


def test_the_study_runs_from_python_with_plain_arguments(tmp_path, capsys):
    options = dict(preset="micro", width=16, steps=2, batch_size=8, n_train=32, n_test=16, settings={"lr": 3e-3})
    summary = mqar.run_study(
        mqar.MQARSpec(models=["LOOPED", "L4_ds8"], kvs=[2], seeds=[0], **options), Runtime(), tmp_path / "py"
    )
    assert capsys.readouterr().out == ""  # nothing below the command line prints
    assert (tmp_path / "py" / "mqar.md").read_text() == mqar_report.markdown(summary)
    assert (
        _cli(
            [
                "--models",
                "LOOPED,L4_ds8",
                "--kv",
                "2",
                "--seeds",
                "0",
                "--preset",
                "micro",
                "--width",
                "16",
                "--steps",
                "2",
                "--batch-size",
                "8",
                "--n-train",
                "32",
                "--n-test",
                "16",
                "--set",
                "lr=3e-3",
                "--out",
                str(tmp_path / "cli"),
                "--quiet",
            ]
        )
        == 0
    )
    cli = json.loads((tmp_path / "cli" / "mqar.json").read_text())
    for name in ("LOOPED", "L4_ds8"):
        ours, theirs = summary["models"][name]["cells"]["2"], cli["models"][name]["cells"]["2"]
        assert (ours["accs"], ours["params"]) == (theirs["accs"], theirs["params"])
    with pytest.raises(ValueError, match="train setting 'seed'"):
        mqar.plan_study(mqar.MQARSpec(models=["LOOPED"], kvs=[2], seeds=[0], settings={"seed": 3}))
