"""Trainer: config parsing, batches, schedules, the loss target, resume, non-finite stops, seeds."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.cli.common import parse_assignments
from drmlab.evaluation import rescorer
from drmlab.models import build_model, list_models
from drmlab.models.output import ModelOutput
from drmlab.runs import STATE_FILE, RunDir, write_json_atomic
from drmlab.training import NonFiniteLossError, TrainConfig, lm_loss, parse_tokens, read_metrics, train
from drmlab.training.batches import eval_sample, train_batch, window_starts
from drmlab.training.config import resolve_train_config, split_overrides
from drmlab.training.optim import lr_at
from drmlab.training.run_info import DataInfo, RunInfo


@dataclasses.dataclass
class TinyConfig:
    vocab_size: int = 256
    d: int = 16


class TinyLM(nn.Module):
    """A causal bag-of-prefix model with an auxiliary loss; ``nan_at_step`` poisons one step."""

    def __init__(self, vocab_size=256, d=16, seed=0, nan_at_step=None):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.emb = nn.Embedding(vocab_size, d)
            self.mix = nn.Linear(d, d)
            self.out = nn.Linear(d, vocab_size)
        self.config = TinyConfig(vocab_size, d)
        self.model_name, self.preset = "TINY", "micro"
        self.nan_at_step = nan_at_step

    def forward(self, tokens, step=None):
        h = self.emb(tokens)
        h = torch.cumsum(h, 1) / torch.arange(1, tokens.shape[1] + 1, device=tokens.device)[None, :, None]
        logits = self.out(torch.tanh(self.mix(h)))
        if self.nan_at_step is not None and step == self.nan_at_step:
            logits = logits * float("nan")
        return ModelOutput(logits=logits, aux={"loss_aux": 0.01 * h.pow(2).mean()})


def _data(n=20_000, seed=0):
    """A learnable byte stream (a periodic pattern with 20% random bytes): train and validation."""
    rng = np.random.default_rng(seed)
    text = (np.arange(n) * 7 % 97 + 32).astype(np.uint8)
    noise = rng.random(n) < 0.2
    text[noise] = rng.integers(32, 127, size=int(noise.sum()))
    return text[: n * 4 // 5], text[n * 4 // 5 :]


def _cfg(**kw):
    base = dict(tokens=8 * 16 * 6, batch_size=8, seq_len=16, lr=3e-3, eval_every=0, eval_windows=4, eval_batch_size=4)
    base.update(kw)
    return TrainConfig(**base)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "text,value",
    [
        ("5M", 5_000_000),
        ("500k", 500_000),
        ("5_005_312", 5_005_312),
        ("5,005,312", 5_005_312),
        ("1.5M", 1_500_000),
        ("2e6", 2_000_000),
        (7, 7),
    ],
)
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


@pytest.mark.parametrize("bad", ["five", "1.5", "-3", "0", "3X"])
def test_parse_tokens_rejects(bad):
    with pytest.raises(ValueError):
        parse_tokens(bad)


def test_set_overrides_route_and_suggest():
    assigned = parse_assignments(["lr=3e-4", "d_state=64", "bf16=true", "schedule=cosine", "tokens=2M"])
    assert assigned == {"lr": 3e-4, "d_state": 64, "bf16": True, "schedule": "cosine", "tokens": "2M"}
    train_kw, model_kw = split_overrides(assigned, ["d_state", "n_directions"])
    assert train_kw == {"lr": 3e-4, "bf16": True, "schedule": "cosine", "tokens": 2_000_000}
    assert model_kw == {"d_state": 64}
    with pytest.raises(ValueError, match="did you mean 'd_state'"):
        split_overrides({"d_stat": 3}, ["d_state"])
    with pytest.raises(ValueError, match="did you mean 'warmup_fraction'"):
        split_overrides({"warmup_fractoin": 0.1}, [])
    with pytest.raises(ValueError, match="key=value"):
        parse_assignments(["lr"])


def test_preset_defaults_and_budget():
    cfg = resolve_train_config("125m")
    assert cfg.tokens_per_step == 8192 and cfg.total_steps == 611
    assert cfg.total_steps * cfg.tokens_per_step == 5_005_312
    assert resolve_train_config("tiny", lr=1e-4).lr == 1e-4
    with pytest.raises(ValueError, match="schedule"):
        resolve_train_config("tiny", schedule="cosin")


def test_schedules():
    const = _cfg(tokens=8 * 16 * 100)
    assert all(lr_at(k, const) == const.lr for k in (1, 50, 100))
    cos = _cfg(tokens=8 * 16 * 100, schedule="cosine", warmup_fraction=0.1)
    assert cos.warmup_steps == 10
    assert lr_at(1, cos) == pytest.approx(cos.lr / 10) and lr_at(10, cos) == pytest.approx(cos.lr)
    assert lr_at(100, cos) == pytest.approx(cos.lr * cos.min_lr_ratio)
    lrs = [lr_at(k, cos) for k in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


# ---------------------------------------------------------------- batches


def test_batches_are_pure_functions_and_split_across_ranks():
    stream = np.arange(5000, dtype=np.uint16) % 256
    a = train_batch(stream, seed=3, step=7, micro=1, batch_size=6, seq_len=10)
    b = train_batch(stream, seed=3, step=7, micro=1, batch_size=6, seq_len=10)
    assert a.shape == (6, 11) and a.dtype == torch.int64 and torch.equal(a, b)
    assert not torch.equal(a, train_batch(stream, seed=3, step=8, micro=1, batch_size=6, seq_len=10))
    assert not torch.equal(a, train_batch(stream, seed=4, step=7, micro=1, batch_size=6, seq_len=10))
    parts = [
        train_batch(stream, seed=3, step=7, micro=1, batch_size=6, seq_len=10, rank=r, world_size=3) for r in range(3)
    ]
    assert torch.equal(torch.cat(parts), a)
    starts = window_starts(3, 7, 1, 10_000, 10, len(stream))
    assert starts.min() >= 0 and starts.max() <= len(stream) - 11
    assert torch.equal(eval_sample(stream, 4, 10), eval_sample(stream, 4, 10))
    with pytest.raises(ValueError, match="divisible"):
        train_batch(stream, seed=0, step=1, micro=0, batch_size=5, seq_len=10, rank=0, world_size=2)


# ---------------------------------------------------------------- the loss target


def _hand_loss(model, window, step):
    out = model(window[:, :-1], step=step)
    logits = out.logits.float()
    terms = []
    for t in range(window.shape[1] - 1):
        terms.append(-torch.log_softmax(logits[:, t], -1).gather(1, window[:, t + 1 : t + 2]).squeeze(1))
    ce = torch.stack(terms, 1).mean()
    aux = out.aux.get("loss_aux")
    return ce + (aux.float() if aux is not None else 0.0), ce


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_trains_on_next_token(name):
    """The trainer's loss is CE(logits[:, t], tokens[:, t+1]) (+ aux) -- never x_{t+2}."""
    model = build_model(name, "micro", vocab_size=256, seed=0)
    window = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    loss, ce = lm_loss(model, window, step=3)
    hand_loss, hand_ce = _hand_loss(model, window, step=3)
    torch.testing.assert_close(ce, hand_ce, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, hand_loss, rtol=1e-5, atol=1e-6)
    # Off by one in either direction would give a different number.
    out = model(window[:, :-1], step=3).logits.float()
    shifted = F.cross_entropy(out[:, :-1].reshape(-1, 256), window[:, 2:].reshape(-1))
    assert not torch.isclose(shifted, ce)


def test_tiny_model_loss_includes_aux():
    model = TinyLM()
    window = torch.randint(0, 256, (3, 9))
    loss, ce = lm_loss(model, window, step=1)
    hand_loss, hand_ce = _hand_loss(model, window, 1)
    torch.testing.assert_close(loss, hand_loss)
    assert loss > ce


# ---------------------------------------------------------------- training runs


def test_seeded_runs_reproduce(tmp_path):
    tr, va = _data()
    a = train(TinyLM(seed=1), tr, va, _cfg(seed=1), quiet=True)
    b = train(TinyLM(seed=1), tr, va, _cfg(seed=1), quiet=True)
    c = train(TinyLM(seed=1), tr, va, _cfg(seed=2), quiet=True)
    losses = lambda s: [r["loss"] for r in s["rows"] if r["kind"] == "train"]
    assert losses(a) == losses(b)
    assert losses(a) != losses(c)
    assert losses(a)[-1] < losses(a)[0]


def test_resume_is_bit_exact(tmp_path):
    tr, va = _data()
    cfg = _cfg(tokens=8 * 16 * 8, grad_accum=2, batch_size=4, schedule="cosine", eval_every=4 * 2 * 16 * 2)
    straight_model = TinyLM(seed=5)
    evaluate = rescorer(va, cfg.seq_len, batch_size=cfg.eval_batch_size)
    straight = train(straight_model, tr, va, cfg, tmp_path / "straight", quiet=True, evaluate=evaluate)
    first = train(TinyLM(seed=5), tr, va, cfg, tmp_path / "split", quiet=True, stop_after_step=3)
    assert first["steps"] == 3 and not first["finished"] and "val_ce" not in first
    assert RunDir(tmp_path / "split").read_state()["step"] == 3
    resumed_model = TinyLM(seed=99)  # different init: everything must come from the checkpoint
    second = train(resumed_model, tr, va, cfg, tmp_path / "split", resume=True, quiet=True, evaluate=evaluate)
    assert second["finished"] and second["steps"] == 8

    rows_a = [r for r in read_metrics(tmp_path / "straight")]
    rows_b = [r for r in read_metrics(tmp_path / "split")]
    key = lambda rows, kind, field: [(r["step"], r[field]) for r in rows if r["kind"] == kind]
    assert key(rows_a, "train", "loss") == key(rows_b, "train", "loss")
    assert key(rows_a, "train", "lr") == key(rows_b, "train", "lr")
    assert key(rows_a, "eval", "val_ce") == key(rows_b, "eval", "val_ce")
    for (n, p), (_, q) in zip(straight_model.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(p, q), n
    assert straight["val_ce"] == second["val_ce"]
    summary = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert summary["val_ce"] == straight["val_ce"] and summary["steps"] == 8


@pytest.mark.parametrize("seconds", [0.0, None, 1e9])
def test_a_checkpoint_falls_every_checkpoint_seconds_and_a_crash_resumes_from_it_bit_exact(tmp_path, seconds):
    """Beside the cadence in steps (none here: no evaluations), a checkpoint is committed once
    ``checkpoint_seconds`` of wall time have passed (0: after every step); a process that dies without a
    signal after step 5 then resumes from step 5 and ends as the straight run, bit for bit. Without the
    timed checkpoints (None, or longer than the run) such a crash leaves no checkpoint to resume."""
    from drmlab.training.trainer import Trainer

    tr, va = _data()
    cfg = _cfg(tokens=8 * 16 * 8)
    assert cfg.checkpoint_every_steps == 0  # no cadence in steps
    straight_model = TinyLM(seed=5)
    straight = train(straight_model, tr, va, cfg, tmp_path / "straight", quiet=True, checkpoint_seconds=None)
    real_step = Trainer.train_step

    def dies_at_six(self, step):
        if step == 6:
            raise RuntimeError("the machine went away")
        return real_step(self, step)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train_step", dies_at_six)
        with pytest.raises(RuntimeError, match="went away"):
            train(TinyLM(seed=5), tr, va, cfg, tmp_path / "crashed", quiet=True, checkpoint_seconds=seconds)
    if seconds != 0.0:
        assert not RunDir(tmp_path / "crashed").has_checkpoint()
        return
    assert RunDir(tmp_path / "crashed").read_state()["step"] == 5
    resumed_model = TinyLM(seed=99)
    second = train(resumed_model, tr, va, cfg, tmp_path / "crashed", resume=True, quiet=True)
    assert second["finished"] and second["steps"] == 8
    losses = lambda path: [(r["step"], r["loss"]) for r in read_metrics(path) if r["kind"] == "train"]
    assert losses(tmp_path / "straight") == losses(tmp_path / "crashed")
    for (n, p), (_, q) in zip(straight_model.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(p, q), n
    assert second["final_loss"] == straight["final_loss"]


def test_milestones_rescore_the_model_as_it_was_then(tmp_path):
    """A milestone row is the final evaluation of the weights after that step (the same number as
    rescoring a run stopped there), does not change training, and survives a resume."""
    tr, va = _data()
    cfg = _cfg(tokens=8 * 16 * 8, milestones=[8 * 16 * 2, 8 * 16 * 5])
    evaluate = rescorer(va, cfg.seq_len, batch_size=cfg.eval_batch_size)
    full = train(TinyLM(seed=3), tr, va, cfg, tmp_path / "full", quiet=True, evaluate=evaluate)
    marks = [r for r in full["rows"] if r["kind"] == "milestone"]
    assert [(r["step"], r["tokens"]) for r in marks] == [(2, 256), (5, 640)]
    plain = train(TinyLM(seed=3), tr, va, _cfg(tokens=8 * 16 * 8), quiet=True)
    assert [r["loss"] for r in full["rows"] if r["kind"] == "train"] == [
        r["loss"] for r in plain["rows"] if r["kind"] == "train"
    ]
    stopped = TinyLM(seed=3)
    train(stopped, tr, va, cfg, tmp_path / "stopped", quiet=True, stop_after_step=5, evaluate=evaluate)
    assert marks[1]["val_ce"] == evaluate(stopped, torch.device("cpu"))["ce"]
    resumed = train(TinyLM(seed=0), tr, va, cfg, tmp_path / "stopped", resume=True, quiet=True, evaluate=evaluate)
    assert [r["val_ce"] for r in read_metrics(tmp_path / "stopped") if r["kind"] == "milestone"] == [
        r["val_ce"] for r in marks
    ]
    assert resumed["val_ce"] == full["val_ce"]
    with pytest.raises(ValueError, match="milestones must increase"):
        _cfg(tokens=1024, milestones=[512, 256]).validate()
    with pytest.raises(ValueError, match="below the budget"):
        _cfg(tokens=1024, milestones=[1024]).validate()
    assert split_overrides({"milestones": "1M,2M"}, ())[0] == {"milestones": [1_000_000, 2_000_000]}


def test_resume_rejects_changed_settings(tmp_path):
    tr, va = _data()
    train(TinyLM(), tr, va, _cfg(), tmp_path, quiet=True, stop_after_step=2)
    with pytest.raises(ValueError, match="lr"):
        train(TinyLM(), tr, va, _cfg(lr=1e-2), tmp_path, resume=True, quiet=True)
    with pytest.raises(FileNotFoundError):
        train(TinyLM(), tr, va, _cfg(), tmp_path / "empty", resume=True, quiet=True)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    tr, va = _data()
    cfg = _cfg(tokens=8 * 16 * 6, checkpoint_every=8 * 16 * 2)
    with pytest.raises(NonFiniteLossError, match=r"step 5 .*last good checkpoint \(step 4\)"):
        train(TinyLM(seed=2, nan_at_step=5), tr, va, cfg, tmp_path / "bad", quiet=True)
    assert RunDir(tmp_path / "bad").read_state()["step"] == 4
    reference = TinyLM(seed=2)
    train(reference, tr, va, cfg, tmp_path / "ref", quiet=True, stop_after_step=4)
    loaded = TinyLM(seed=0)
    RunDir(tmp_path / "bad").load_checkpoint(loaded)
    for p, q in zip(reference.parameters(), loaded.parameters()):
        assert torch.equal(p, q)
    assert all(math.isfinite(r["loss"]) for r in read_metrics(tmp_path / "bad") if r["kind"] == "train")


def test_huge_learning_rate_is_caught(tmp_path):
    tr, va = _data()
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        train(TinyLM(), tr, va, _cfg(lr=1e30, tokens=8 * 16 * 10), quiet=True)


def test_run_directory_contents(tmp_path):
    tr, va = _data()
    summary = train(
        TinyLM(),
        tr,
        va,
        _cfg(eval_every=8 * 16 * 3),
        tmp_path,
        quiet=True,
        evaluate=rescorer(va, 16),
        run_info=RunInfo("TINY", "micro", data=DataInfo(256, "bytes", None, {"content_sha256": "x"})),
    )
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "metrics.jsonl", "summary.json", "checkpoint.json", "checkpoints"} <= names
    assert [n for n in names if n.startswith(".")] == [".lock"]  # no temporary leftovers
    (folder,) = (tmp_path / "checkpoints").iterdir()  # only the committed checkpoint is kept
    assert folder.name == "step-00000006"
    assert {p.name for p in folder.iterdir()} == {
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "manifest.json",
    }
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"] == "TINY" and config["model_config"] == {"vocab_size": 256, "d": 16}
    assert config["train"]["lr"] == 3e-3 and config["data"]["content_sha256"] == "x"
    rows = read_metrics(tmp_path)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert {"step", "tokens", "loss", "lr", "tok_s", "elapsed", "grad_norm"} <= set(train_rows[0])
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 3, 6]
    for key in ("val_ce", "val_bpb", "tokens", "params", "tokens_per_s"):
        assert summary[key] is not None
    assert summary["val_bpb"] == pytest.approx(summary["val_ce"] / math.log(2))
    assert summary["val_targets"] == len(va) - 1


def test_inconsistent_checkpoint_is_refused(tmp_path):
    tr, va = _data()
    train(TinyLM(), tr, va, _cfg(), tmp_path, quiet=True, stop_after_step=2)
    run = RunDir(tmp_path)
    state = run.read_state()
    write_json_atomic(run.checkpoint_dir() / STATE_FILE, dict(state, step=3))
    with pytest.raises(ValueError, match="does not match its recorded sha256"):
        RunDir(tmp_path).load_checkpoint(TinyLM())


def test_bf16_autocast_trains():
    tr, va = _data()
    fp32 = train(TinyLM(), tr, va, _cfg(), quiet=True)
    bf16 = train(TinyLM(), tr, va, _cfg(bf16=True), quiet=True)
    a = [r["loss"] for r in fp32["rows"] if r["kind"] == "train"]
    b = [r["loss"] for r in bf16["rows"] if r["kind"] == "train"]
    assert all(math.isfinite(x) for x in b)
    assert a != b and np.allclose(a, b, atol=0.05)


def test_run_info_records_config_json_entries_in_their_order_and_refuses_a_clash():
    data = DataInfo(256, "bytes", None, {"content_sha256": "x"})
    info = RunInfo("J", "tiny", {"d_state": 8}, label="J:arm", data=data, study={"mqar": {"kv": 4}})
    assert list(info.record()) == [
        "model",
        "preset",
        "overrides",
        "label",
        "vocab_size",
        "tokenizer",
        "data_source",
        "data",
        "mqar",
    ]
    assert info.record()["data_source"] is None  # the embedded corpus is recorded as such, not left out
    assert list(RunInfo().record()) == ["overrides"]  # the trainer then names the model by its class
    with pytest.raises(ValueError, match=r"repeats the run's own entries: \['tokenizer'\]"):
        RunInfo("J", data=data, study={"tokenizer": "gpt2"}).record()


# ---------------------------------------------------------------- the swappable pieces


def test_the_default_pieces_are_the_language_model_loop(tmp_path):
    """TrainPieces() spelled out (the lm loss, build_optimizer) trains exactly as no pieces at all."""
    from drmlab.training.optim import build_optimizer
    from drmlab.training.pieces import TrainPieces
    from drmlab.training.trainer import lm_loss_fn

    tr, va = _data()
    cfg = _cfg(schedule="cosine", grad_accum=2, batch_size=4)
    plain = TinyLM(seed=4)
    spelled = TinyLM(seed=4)
    a = train(plain, tr, va, cfg, quiet=True)
    b = train(
        spelled, tr, va, cfg, quiet=True, pieces=TrainPieces(loss_fn=lm_loss_fn(), optimizer_builder=build_optimizer)
    )
    assert [r for r in a["rows"] if r["kind"] == "train"][0].keys() == {
        "kind",
        "step",
        "tokens",
        "loss",
        "ce",
        "lr",
        "grad_norm",
        "tok_s",
        "gflops",
        "util",
        "elapsed",
    }
    timing = ("tok_s", "gflops", "util", "elapsed")
    strip = lambda s: [{k: v for k, v in r.items() if k not in timing} for r in s["rows"]]
    assert strip(a) == strip(b)
    for (n, p), (_, q) in zip(plain.state_dict().items(), spelled.state_dict().items()):
        assert torch.equal(p, q), n


def test_parameter_groups_keep_their_own_rates_under_the_schedule(tmp_path):
    """Two groups at their own base rates: each follows the warm-up + cosine from its own rate (the
    optimizer steps with it), the rows name both, and a resume from the checkpoint keeps them."""
    from drmlab.training.pieces import TrainPieces

    seen = []

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            seen.append([g["lr"] for g in self.param_groups])
            return super().step(closure)

    def two_rates(model, cfg):
        head = [p for n, p in model.named_parameters() if n.startswith("out.")]
        rest = [p for n, p in model.named_parameters() if not n.startswith("out.")]
        return Recording(
            [{"params": rest, "lr": 1e-3, "name": "body"}, {"params": head, "lr": 4e-2, "name": "head"}], lr=cfg.lr
        )

    tr, va = _data()
    cfg = _cfg(tokens=8 * 16 * 8, schedule="cosine", warmup_fraction=0.25)
    summary = train(
        TinyLM(),
        tr,
        va,
        cfg,
        tmp_path / "run",
        quiet=True,
        stop_after_step=5,
        pieces=TrainPieces(optimizer_builder=two_rates),
    )
    expected = [[lr_at(k, cfg, 1e-3), lr_at(k, cfg, 4e-2)] for k in range(1, 9)]
    assert seen == expected[:5] and expected[0][1] == 4e-2 * 1 / 2 and expected[-1][1] == pytest.approx(4e-3)
    rows = [r for r in summary["rows"] if r["kind"] == "train"]
    assert [[r["lr_body"], r["lr_head"]] for r in rows] == expected[:5]
    assert [r["lr"] for r in rows] == [lr_at(k, cfg) for k in range(1, 6)]
    train(
        TinyLM(),
        tr,
        va,
        cfg,
        tmp_path / "run",
        resume=True,
        quiet=True,
        pieces=TrainPieces(optimizer_builder=two_rates),
    )
    assert seen == expected


def test_a_loss_piece_and_evaluation_hooks(tmp_path):
    """A custom loss's entries reach the rows (tensors averaged over micro-batches, other values kept);
    hooks run at their steps (0: before training) on a committed checkpoint, their rows in
    metrics.jsonl; a hook killed after its checkpoint runs again first on resume, once."""
    from drmlab.training.pieces import EvalHook, TrainPieces
    from drmlab.training.trainer import targets_loss

    def loss_fn(model, batch, step):
        loss, ce = targets_loss(model, batch[0], batch[1], step)
        return 2 * loss, {"ce": ce, "half": ce / 2, "parity": step % 2, "rows": int(batch[0].shape[0])}

    calls = []

    def hook(model, step):
        calls.append(step)
        if step == 4 and calls.count(4) == 1:
            raise KeyboardInterrupt  # killed during its evaluation
        return {"checkpoint": RunDir(tmp_path / "run").read_state()["step"] if step else None}

    tr, va = _data()
    cfg = _cfg(grad_accum=2, batch_size=4)
    pieces = TrainPieces(loss_fn=loss_fn, hooks=(EvalHook("probe", {0, 2, 4}, hook),))
    with pytest.raises(KeyboardInterrupt):
        train(TinyLM(), tr, va, cfg, tmp_path / "run", quiet=True, pieces=pieces)
    assert calls == [0, 2, 4] and RunDir(tmp_path / "run").read_state()["step"] == 4
    train(TinyLM(), tr, va, cfg, tmp_path / "run", resume=True, quiet=True, pieces=pieces)
    assert calls == [0, 2, 4, 4]
    rows = read_metrics(tmp_path / "run")
    probes = [r for r in rows if r["kind"] == "probe"]
    assert [(r["step"], r["checkpoint"]) for r in probes] == [(0, None), (2, 2), (4, 4)]
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(
        r["half"] == pytest.approx(r["ce"] / 2) and r["parity"] == r["step"] % 2 and r["rows"] == 4 for r in steps
    )
    assert all(r["loss"] > 2 * r["ce"] for r in steps)  # twice (CE + the model's aux)


def test_resume_accepts_a_model_field_newer_than_the_run_at_its_default(tmp_path):
    """A run written before a model-config field existed (its config.json lacks it) resumes when the field
    is at its default -- a new option that changes nothing -- and is refused, naming that field alone, when not."""
    tr, va = _data()
    train(TinyLM(), tr, va, _cfg(), tmp_path, quiet=True, stop_after_step=2)
    run = RunDir(tmp_path)
    config = json.loads(run.config_path.read_text())
    del config["model_config"]["d"]  # as written by a drmlab that had no field d (default 16)
    run.config_path.write_text(json.dumps(config))
    run.accept_config_edits()
    with pytest.raises(ValueError) as refused:
        train(TinyLM(d=32), tr, va, _cfg(), tmp_path, resume=True, quiet=True)
    message = str(refused.value)
    assert "model_config.d: (absent) in the run, 32 now" in message and "vocab_size" not in message
    reference = TinyLM()
    train(reference, tr, va, _cfg(), tmp_path / "whole", quiet=True)
    model = TinyLM(seed=5)
    assert train(model, tr, va, _cfg(), tmp_path, resume=True, quiet=True)["finished"]
    for (n, p), (_, q) in zip(reference.state_dict().items(), model.state_dict().items()):
        assert torch.equal(p, q), n
