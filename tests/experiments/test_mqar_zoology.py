"""The Zoology MQAR protocol (docs/mqar.md section 10, drmlab.experiments.mqar.zoology): the task
generator's properties (disjoint halves, bound answers, the power law of the query slots, labels on
query positions only, seeds), the settings and recipe, the epoch batches, the models at the
protocol's width, n/a, the unknown protocol, and a micro study end to end (reuse, resume, locks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from drmlab.experiments.mqar import zoology as zm
from drmlab.experiments.mqar.zoology_probe import probe_score
from drmlab.experiments.mqar.zoology_summary import (
    own_settings,
    probe_rows,
    run_settings,
    shared_settings,
    with_whole_spec,
)
from drmlab.training.trainer import targets_loss

torch.set_num_threads(1)


def _rows(seq_len, kv, n, seed=0):
    x, y = zm.generate(seq_len, kv, n, seed)
    return x.numpy(), y.numpy()


# ---------------------------------------------------------------------------------- the task
@pytest.mark.parametrize("seq_len, kv", zm.SETTINGS)
def test_keys_and_values_come_from_disjoint_halves_without_repeats(seq_len, kv):
    x, y = _rows(seq_len, kv, 400)
    assert x.shape == y.shape == (400, seq_len) and x.dtype == np.int64
    keys, values = x[:, 0 : 2 * kv : 2], x[:, 1 : 2 * kv : 2]
    assert keys.min() >= 1 and keys.max() <= 4095 and values.min() >= 4096 and values.max() <= 8191
    for k, v in zip(keys, values):
        assert len(set(k)) == kv and len(set(v)) == kv


@pytest.mark.parametrize("seq_len, kv", zm.SETTINGS)
def test_every_query_is_a_context_key_and_its_target_is_that_keys_value(seq_len, kv):
    x, y = _rows(seq_len, kv, 300, seed=5)
    for row, tgt in zip(x, y):
        lookup = dict(zip(row[0 : 2 * kv : 2].tolist(), row[1 : 2 * kv : 2].tolist()))
        scored = np.flatnonzero(tgt != zm.IGNORE)
        assert len(scored) == kv and scored.min() >= 2 * kv  # one query per key, after the pairs
        assert sorted(row[scored].tolist()) == sorted(lookup)  # every key queried exactly once
        assert all(tgt[t] == lookup[row[t]] for t in scored)


@pytest.mark.parametrize("seq_len, kv", [(64, 4), (256, 16)])
def test_labels_only_on_query_positions_and_the_rest_is_fill(seq_len, kv):
    x, y = _rows(seq_len, kv, 200, seed=3)
    query = np.zeros_like(x, dtype=bool)
    query[:, 2 * kv :] = x[:, 2 * kv :] != zm.FILL
    assert np.array_equal(y != zm.IGNORE, query)  # a label exactly where a query stands
    assert ((query.sum(1)) == kv).all()
    assert (x[:, 2 * kv :][~query[:, 2 * kv :]] == zm.FILL).all()
    assert (x[:, 2 * kv + 1 :: 2] == zm.FILL).all()  # queries sit on even positions only
    assert (y[:, : 2 * kv] == zm.IGNORE).all()


def _slot_of_each_key(x, kv):
    """[n, kv] slot pair of key j's query."""
    out = np.empty((x.shape[0], kv), dtype=np.int64)
    for i, row in enumerate(x):
        pos = {k: t for t, k in enumerate(row[2 * kv :].tolist()) if k != zm.FILL}
        out[i] = [pos[k] // 2 for k in row[0 : 2 * kv : 2].tolist()]
    return out


def test_the_first_keys_slot_follows_the_power_law():
    """Key 1's slot pair is the first draw: P(s) = (s + 1)^(a - 1) / sum. Chi-square over the 28 slot
    pairs of (64, 4) on 20,000 examples; the tolerance is the 0.999 quantile (p = 0.001), and the
    same counts reject the uniform law (the test can fail)."""
    x, _ = _rows(64, 4, 20_000, seed=11)
    slots = _slot_of_each_key(x, 4)
    space = (64 - 8) // 2
    counts = np.bincount(slots[:, 0], minlength=space)
    p = zm.slot_weights(space)
    chi2 = (((counts - len(slots) * p) ** 2) / (len(slots) * p)).sum()
    assert chi2 < stats.chi2.ppf(0.999, space - 1), chi2
    uniform = (((counts - len(slots) / space) ** 2) / (len(slots) / space)).sum()
    assert uniform > 100 * stats.chi2.ppf(0.999, space - 1)
    assert abs(p[0] - 1 / sum((s + 1) ** -0.99 for s in range(space))) < 1e-12


def test_the_slots_are_drawn_one_after_another_without_replacement():
    """The ordered pair (g1, g2) of a (10, 2) example has law p_a p_b / (1 - p_a), a != b (numpy's
    weighted choice without replacement). Chi-square over the 6 ordered pairs, 60,000 examples,
    tolerance the 0.999 quantile."""
    x, _ = _rows(10, 2, 60_000, seed=2)
    slots = _slot_of_each_key(x, 2)
    assert (slots[:, 0] != slots[:, 1]).all()
    p = zm.slot_weights(3)
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    expected = np.array([p[a] * p[b] / (1 - p[a]) for a, b in pairs]) * len(slots)
    observed = np.array([((slots[:, 0] == a) & (slots[:, 1] == b)).sum() for a, b in pairs])
    assert abs(expected.sum() - len(slots)) < 1e-6
    chi2 = (((observed - expected) ** 2) / expected).sum()
    assert chi2 < stats.chi2.ppf(0.999, len(pairs) - 1), (observed, expected)


def test_reproducible_by_seed_and_dtype():
    a = zm.generate(128, 8, 500, [0, 128, 8, 0])
    b = zm.generate(128, 8, 500, [0, 128, 8, 0])
    c = zm.generate(128, 8, 500, [0, 128, 8, 1])
    small = zm.generate(128, 8, 500, [0, 128, 8, 0], dtype=torch.int16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert small[0].dtype == torch.int16 and torch.equal(small[0].long(), a[0]) and torch.equal(small[1].long(), a[1])
    x, _, xt, _ = zm.data_sets(64, 4, n_train=50, n_test=20)
    assert torch.equal(x.long(), zm.generate(64, 4, 50, [0, 64, 4, 0])[0])
    assert torch.equal(xt.long(), zm.generate(64, 4, 20, [0, 64, 4, 1])[0])


@pytest.mark.parametrize("seq_len, kv, why", [(63, 4, "even"), (64, 17, "seq_len >= 4 kv"), (64, 0, "positive")])
def test_bad_settings_are_one_line(seq_len, kv, why):
    with pytest.raises(ValueError, match=why):
        zm.generate(seq_len, kv, 10, 0)


# ---------------------------------------------------------------------------------- settings and recipe
def test_the_settings_table_and_recipe_are_zoologys():
    assert zm.SETTINGS == ((64, 4), (128, 8), (256, 16), (512, 64))
    assert zm.BATCH_SIZES == {64: 512, 128: 512, 256: 256, 512: 128}
    assert zm.WIDTHS == (64, 128, 256, 512)
    assert np.allclose(zm.LR_GRID, [1e-4, 10 ** (-4 + 2 / 3), 10 ** (-4 + 4 / 3), 1e-2])
    r = zm.RECIPE
    assert (r.vocab_size, r.power_a, r.n_train, r.n_test, r.epochs, r.weight_decay, r.early_stop) == (
        8192,
        0.01,
        100_000,
        3_000,
        64,
        0.1,
        0.99,
    )
    assert (r.n_layer, r.n_head, r.dropout, r.seed, r.data_seed) == (2, 1, 0.1, 123, 0)
    assert [r.steps_per_epoch(L) for L, _ in zm.SETTINGS] == [196, 196, 391, 782]
    with pytest.raises(dataclasses_frozen_error()):
        r.epochs = 3
    study = zm.plan_study(["ATTENTION"], [64], [256])
    cfg = study.train_config(256, 1e-3)
    assert (
        cfg.batch_size,
        cfg.seq_len,
        cfg.schedule,
        cfg.warmup_steps,
        cfg.min_lr_ratio,
        cfg.weight_decay,
        cfg.decay_all_params,
        cfg.grad_clip,
        cfg.seed,
    ) == (256, 256, "cosine", 0, 0.0, 0.1, True, 0.0, 123)
    assert cfg.total_steps == 64 * 391


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_epoch_batches_shuffle_each_epoch_and_keep_the_remainder():
    x = torch.arange(10).view(10, 1).repeat(1, 4)
    b = zm.EpochBatches(x, x.clone(), batch_size=4)
    assert b.per_epoch == 3
    for epoch in range(2):
        rows = [b.global_batch(7, epoch * 3 + i + 1, 0)[0][:, 0].tolist() for i in range(3)]
        assert [len(r) for r in rows] == [4, 4, 2]
        assert sorted(r for batch in rows for r in batch) == list(range(10))
    first = b.global_batch(7, 1, 0)[0][:, 0].tolist()
    assert b.global_batch(7, 4, 0)[0][:, 0].tolist() != first  # another order in the next epoch
    assert b.global_batch(7, 1, 0)[0][:, 0].tolist() == first  # a pure function of (seed, step)


def test_loss_and_accuracy_count_the_query_positions_only():
    x, y = zm.generate(64, 4, 6, 0)
    model, _, _ = zm.protocol_model("ATTENTION", "micro", 16, 64, seed=0)
    model.eval()
    _, ce = targets_loss(model, x, y)
    logits = model(x).logits
    scored = y != zm.IGNORE
    assert torch.allclose(ce, F.cross_entropy(logits[scored], y[scored]))
    acc = zm.query_accuracy(model, x, y)  # the head at the queries only (logits_at)
    assert acc["total"] == 24 and acc["correct"] == int((logits.argmax(-1)[scored] == y[scored]).sum())
    assert acc["ce"] == pytest.approx(float(ce.detach()), rel=1e-5)  # the test queries' mean CE, as the loss's
    _, ce_scored = targets_loss(model, x, y, scored_only=True)
    torch.testing.assert_close(ce_scored, ce, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------- models
def test_the_attention_baseline_is_zoologys_construction():
    d, L, V = 64, 64, 8192
    model, registry, kw = zm.protocol_model("ATTENTION", "tiny", d, L, seed=0)
    assert registry == "GPT2" and kw == {"n_embd": d, "n_layer": 2, "n_head": 1, "n_positions": L}
    # Zoology's count: tied embeddings V d, positions L d, per layer 2 LayerNorms, QKV and output
    # projections with bias (4 d^2 + 8 d), final LayerNorm 2 d
    assert sum(p.numel() for p in model.parameters()) == V * d + L * d + 2 * (4 * d * d + 8 * d) + 2 * d == 562_304
    for block in model.hf.transformer.h:
        assert isinstance(block.mlp, torch.nn.Identity) and block.attn.attn_dropout.p == 0.1
    assert model.hf.transformer.drop.p == 0.1
    # without the MLP the block adds its second LayerNorm's output: r + a, then (r + a) + LN2(r + a)
    block = model.hf.transformer.h[0].eval()
    r = torch.randn(2, 8, d)
    a = block.attn(block.ln_1(r))[0]
    out = block(r)[0] if isinstance(block(r), tuple) else block(r)
    assert torch.allclose(out, (r + a) + block.ln_2(r + a), atol=1e-5)


def test_models_at_the_protocols_width():
    def kw(name, width=128, seq_len=256):
        _, kw, why = zm.protocol_overrides(name, "tiny", width, seq_len)
        assert why is None
        return kw

    assert kw("GPT2") == {"n_embd": 128, "n_layer": 2, "n_head": 1, "n_positions": 256}
    assert kw("MAMBA") == {"d_model": 128, "n_layer": 2, "dt_rank": 8, "max_seq_len": 256}
    assert kw("RESOLVENT") == {"d_model": 128, "n_layer": 2, "n_head": 1, "max_seq_len": 256}
    for name in ("SSM_CONTROL", "J_NO_DIRECTION", "ASM_CM"):
        assert kw(name) == {"d_token": 128, "d_state": 128, "max_seq_len": 256}
    assert kw("LOOPED:A")["n_stored"] == 2 and kw("LOOPED:C")["n_stored"] == 1


def test_a_drm_row_keeps_the_preset_s_emitter_and_most_of_its_parameters_are_there():
    """docs/mqar.md 10.4: at W = 64 the emitter's second layer (hidden_size 384 -> 8,192) is 3,145,728 of
    J_NO_DIRECTION's 4,126,784 parameters, several times the attention row's 562,304."""
    model, _, _ = zm.protocol_model("J_NO_DIRECTION", "tiny", 64, 64, 0, None, zm.RECIPE)
    total = sum(p.numel() for p in model.parameters())
    assert (model.config.hidden_size, model.emitter.fc2.weight.numel(), total) == (384, 3_145_728, 4_126_784)
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "mqar.md").read_text().split())
    assert "3,145,728 of J_NO_DIRECTION's 4,126,784 parameters" in text


def test_a_setting_the_model_cannot_hold_is_na_with_the_reason(tmp_path):
    _, _, why = zm.protocol_overrides("GPT2", "tiny", 64, 256, {"n_positions": 128})
    assert why == "attention past its positions: n_positions=128 is shorter than the sequence length 256"
    assert zm.protocol_overrides("GPT2", "tiny", 64, 128, {"n_positions": 128})[2] is None
    _, _, why = zm.protocol_overrides("LOOPED:E1", "tiny", 64, 64)
    assert "loops 4 times" in why
    _, _, why = zm.protocol_overrides("RESOLVENT", "tiny", 64, 64, {"n_head": 3})
    assert "divisible" in why
    with pytest.raises(ValueError, match="n/a"):
        zm.protocol_model("LOOPED:E1", "tiny", 64, 64, seed=0)


def test_unknown_protocol_and_model_name_the_known_ones():
    assert zm.check_protocol("zoology") == "zoology"
    with pytest.raises(ValueError, match="unknown MQAR protocol 'zoo'.*known: fixed, distance, zoology"):
        zm.check_protocol("zoo")
    with pytest.raises(ValueError, match="unknown model 'GPT3'.*did you mean 'GPT2'"):
        zm.plan_study(["GPT3"], [64], [64])
    with pytest.raises(ValueError, match="not one of the protocol's lengths"):
        zm.plan_study(["GPT2"], [64], [96])
    with pytest.raises(ValueError, match="protocol's own"):
        zm.plan_study(["GPT2"], [64], [64], settings={"lr": 1e-3})
    with pytest.raises(ValueError, match="unknown setting"):
        zm.plan_study(["GPT2"], [64], [64], settings={"n_heads": 2})


# ---------------------------------------------------------------------------------- end to end
MICRO = dict(preset="micro", lr_grid=[1e-3, 1e-2], epochs=2, n_train=48, n_test=16, batch_size=16, device="cpu")


def test_a_micro_study_end_to_end_reuses_and_reports_na(tmp_path):
    summary = zm.run_zoology_study(["ATTENTION", "J_NO_DIRECTION", "LOOPED:E1"], [16], [64], out=tmp_path, **MICRO)
    cells = summary["cells"]
    for name in ("ATTENTION", "J_NO_DIRECTION"):
        c = cells[f"{name} w16 L64"]
        assert c["status"] == "done" and set(c["scores"]) == {"0.001", "0.01"} and c["lr"] in (1e-3, 1e-2)
        assert c["acc"] == max(v for v in c["scores"].values() if v is not None)
    assert cells["LOOPED:E1 w16 L64"]["status"] == "n/a"
    run = json.loads((tmp_path / "runs" / "ATTENTION_w16_L64_lr0.001" / "result.json").read_text())
    assert run["status"] == "done" and [e["epoch"] for e in run["epochs"]] == [1, 2] and run["steps"] == 6
    assert run["test_queries"] == 16 * 4 and run["wall_seconds"] > 0
    text = (tmp_path / "zoology.md").read_text()
    assert "n/a (LOOPED:E1 loops 4 times" in text and "| ATTENTION |" in text
    # the frontier's x axis: attention's cache of 64 tokens, J's constant state
    attention, jnd = cells["ATTENTION w16 L64"], cells["J_NO_DIRECTION w16 L64"]
    assert attention["state_bytes"] == 2 * 2 * 64 * 16 * 4  # 2 layers x (keys, values) x 64 x width x float32
    assert jnd["state_bytes"] == zm.decode_state_bytes("J_NO_DIRECTION", "micro", 16, 16)  # constant in length
    assert f"| ATTENTION | {attention['state_bytes']:,} |" in text
    assert (tmp_path / "frontier.png").stat().st_size > 1000
    # the committed results.json continues the study in another folder: its finished runs are reused
    committed = json.loads((tmp_path / "results.json").read_text())
    assert committed["provenance"]["settings"] == summary["study"] and committed["cells"] == summary["cells"]
    other = tmp_path / "elsewhere"
    restored = zm.restore_runs(tmp_path / "results.json", other)
    assert sorted(restored) == sorted(f"ATTENTION_w16_L64_lr{r}" for r in ("0.001", "0.01")) + sorted(
        f"J_NO_DIRECTION_w16_L64_lr{r}" for r in ("0.001", "0.01")
    )
    moved = zm.run_zoology_study(["ATTENTION", "J_NO_DIRECTION"], [16], [64], out=other, **MICRO)
    assert all(r.get("reused") for r in moved["runs"])
    assert moved["cells"] == {k: v for k, v in summary["cells"].items() if not k.startswith("LOOPED")}
    assert zm.restore_runs(tmp_path / "results.json", other) == []  # nothing overwritten
    with pytest.raises(ValueError, match="not a Zoology results.json"):
        zm.restore_runs(tmp_path / "zoology.md", other)
    again = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, **MICRO)
    assert all(r.get("reused") for r in again["runs"])


def test_the_runs_settings_are_kept_once_and_each_run_rebuilds_exactly():
    attention = {"model": "ATTENTION", "zoology_attention": True, "train": {"lr": 1e-3, "seed": 123, "steps": None}}
    drm = {"model": "J_NO_DIRECTION", "train": {"lr": 1e-2, "seed": 123, "steps": None}, "task": {"seq_len": 64}}
    other = {"model": "J_NO_DIRECTION", "train": {"lr": 1e-2, "seed": 123, "steps": 7}, "task": 64}
    specs = [attention, drm, other]
    shared = shared_settings(specs)
    assert shared == {"train": {"seed": 123}}  # a key some spec lacks, or holds as another kind, is its own
    for spec in specs:
        own = own_settings(shared, spec)
        assert run_settings(shared, own) == spec
    assert own_settings(shared, drm) == {
        "model": "J_NO_DIRECTION",
        "train": {"lr": 1e-2, "steps": None},
        "task": {"seq_len": 64},
    }
    assert shared_settings([drm]) == drm and own_settings(drm, drm) == {} and shared_settings([]) == {}


def test_a_record_written_with_whole_specs_is_restored_too(tmp_path):
    summary = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path / "study", **MICRO)
    shared = summary["spec_shared"]
    assert shared and all("spec" not in r and r["spec_own"]["train"]["lr"] == r["lr"] for r in summary["finished"])
    older = dict(summary, finished=[with_whole_spec(r, shared) for r in summary["finished"]])
    del older["spec_shared"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert len(zm.restore_runs(tmp_path / "older.json", tmp_path / "elsewhere")) == 2
    moved = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path / "elsewhere", **MICRO)
    assert all(r.get("reused") for r in moved["runs"]) and moved["cells"] == summary["cells"]


def _die_on_evaluation(monkeypatch, n: int):
    """The process dies at the ``n``-th test evaluation: after that epoch has trained (its checkpoint
    committed), before result.json records it; returns the real evaluation."""
    real, calls = zm.query_accuracy, []

    def dies_on_the_nth(*args):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(zm, "query_accuracy", dies_on_the_nth)
    return real


def _die_on_the_second_evaluation(monkeypatch):
    return _die_on_evaluation(monkeypatch, 2)


def test_early_stop_and_a_killed_run_continues(tmp_path, monkeypatch):
    study = zm.plan_study(
        ["ATTENTION"], [16], [64], preset="micro", lr_grid=[1e-3], epochs=3, n_train=48, n_test=16, batch_size=16
    )
    whole = zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path / "whole", device="cpu")
    _die_on_the_second_evaluation(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path / "cut", device="cpu")
    cut = json.loads((tmp_path / "cut" / "runs" / "ATTENTION_w16_L64_lr0.001" / "result.json").read_text())
    assert cut["status"] == "training" and len(cut["epochs"]) == 1
    continued = zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path / "cut", device="cpu")
    assert [e["epoch"] for e in continued["epochs"]] == [1, 2, 3]
    assert [e["loss"] for e in continued["epochs"]] == [e["loss"] for e in whole["epochs"]]  # bit-identical
    assert continued["test_correct"] == whole["test_correct"]

    monkeypatch.setattr(
        zm, "query_accuracy", lambda *a: {"acc": 1.0, "correct": 64, "total": 64, "by_query": [], "ce": 0.01}
    )
    early = zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path / "early", device="cpu")
    assert early["early_stopped"] and early["epochs_run"] == 1 and early["steps"] == 3


def test_an_epoch_resumed_from_its_checkpoint_counts_the_training_an_earlier_process_did(tmp_path, monkeypatch):
    """A process stopped after the trainer committed an epoch's steps but before result.json recorded the
    epoch: the next process trains none of them again, and the epoch's train_seconds (and the run's
    wall_seconds) count the time the checkpoint holds for them, the trainer's seconds in the checkpoint less
    those at the last recorded epoch. Before, they counted only the resuming process's own clock."""
    from types import SimpleNamespace

    from drmlab.runs import RunDir

    study = zm.plan_study(
        ["ATTENTION"], [16], [64], preset="micro", lr_grid=[1e-3], epochs=2, n_train=48, n_test=16, batch_size=16
    )
    real = _die_on_the_second_evaluation(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")
    run_dir = tmp_path / "runs" / "ATTENTION_w16_L64_lr0.001"
    cut = json.loads((run_dir / "result.json").read_text())
    state = RunDir(run_dir).read_state()
    assert len(cut["epochs"]) == 1 and state["step"] == 6  # the second epoch's 3 steps are in the checkpoint
    held = state["train_seconds"] - cut["epochs"][0]["trainer_seconds"]
    assert held > 0
    assert zm.carried_seconds(RunDir(run_dir), cut["epochs"]) == held
    assert zm.carried_seconds(RunDir(run_dir), [{"epoch": 1}]) == 0.0  # an epoch recorded without the counter

    monkeypatch.setattr(zm, "query_accuracy", real)
    monkeypatch.setattr(zm, "pauses", SimpleNamespace(now=lambda: 100.0))  # the resuming process's clock: 0 s
    continued = zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")
    second = continued["epochs"][1]
    assert second["train_seconds"] == pytest.approx(held) and second["trainer_seconds"] == state["train_seconds"]
    assert continued["wall_seconds"] == pytest.approx(cut["wall_seconds"] + held)


def test_a_run_held_by_another_process_is_left_to_it(tmp_path):
    from drmlab.runs import RunLock

    study = zm.plan_study(
        ["ATTENTION"], [16], [64], preset="micro", lr_grid=[1e-3], epochs=1, n_train=16, n_test=8, batch_size=16
    )
    lock = RunLock(tmp_path / "locks" / "ATTENTION_w16_L64_lr0.001.lock").acquire()
    try:
        assert zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")["status"] == "locked"
    finally:
        lock.release()
    assert zm.run_cell(study, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")["status"] == "done"


def test_the_cli_runs_the_zoology_protocol_and_refuses_other_protocols_flags(tmp_path, capsys):
    from drmlab.cli import main

    out = tmp_path / "zoo"
    assert (
        main(
            [
                "mqar",
                "--protocol",
                "zoology",
                "--models",
                "ATTENTION",
                "--widths",
                "16",
                "--seq-lens",
                "64",
                "--epochs",
                "1",
                "--n-train",
                "64",
                "--n-test",
                "32",
                "--lr-grid",
                "1e-3",
                "--preset",
                "micro",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert "ATTENTION w16 L64 lr 0.001" in capsys.readouterr().out and (out / "zoology.json").is_file()
    for flags, words in (
        (["--kv", "8"], "--kv: not a setting of --protocol zoology"),
        (["--steps", "5"], "--steps (zoology trains --epochs)"),
        (["--seeds", "1,2"], "give --seeds S"),
    ):
        assert main(["mqar", "--protocol", "zoology", "--out", str(out), *flags]) == 2
        assert words in capsys.readouterr().err
    assert main(["mqar", "--widths", "64", "--out", str(out)]) == 2
    assert "--widths: only with --protocol zoology" in capsys.readouterr().err
    assert main(["mqar", "--leave-held", "--out", str(out)]) == 2
    assert "--leave-held: only with --protocol zoology" in capsys.readouterr().err
    assert main(["mqar", "--protocol", "distance", "--fast", "--out", str(out)]) == 2
    assert "--fast: only with --protocol zoology" in capsys.readouterr().err


def test_collect_reports_what_has_finished_and_trains_nothing(tmp_path):
    summary = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, collect_only=True, **MICRO)
    cell = summary["cells"]["ATTENTION w16 L64"]
    assert cell["status"] == "incomplete" and cell["acc"] is None and cell["scores"] == {}
    assert {r["status"] for r in summary["runs"]} == {"pending"}
    assert not (tmp_path / "runs").exists() and (tmp_path / "results.json").is_file()
    assert "| ATTENTION | no finished rate (0 of 2) |" in (tmp_path / "zoology.md").read_text()


def test_the_rate_probe_trains_every_rate_its_first_epochs_and_only_the_best_on(tmp_path):
    probe = dict(MICRO, epochs=3, probe_epochs=1)
    summary = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, **probe)
    cell = summary["cells"]["ATTENTION w16 L64"]
    runs = {r["lr"]: r for r in summary["finished"]}  # the finished runs, with their epochs
    assert cell["status"] == "done" and cell["lr"] in runs
    assert [r["lr"] for r in summary["runs"]] == list(runs) and not any("epochs" in r for r in summary["runs"])
    for lr, run in runs.items():  # every rate scored at the end of its first epoch
        assert cell["scores"][zm.lr_sweep.lr_label(lr)] == run["epochs"][0]["test_acc"]
    assert cell["lr"] == zm.lr_sweep.choose({lr: r["epochs"][0]["test_acc"] for lr, r in runs.items()}, False)["lr"]
    chosen, other = runs[cell["lr"]], next(r for lr, r in runs.items() if lr != cell["lr"])
    assert chosen["status"] == "done" and [e["epoch"] for e in chosen["epochs"]] == [1, 2, 3]
    assert other["status"] == "probed" and [e["epoch"] for e in other["epochs"]] == [1] and other["steps"] == 3
    assert cell["acc"] == chosen["test_acc"] and cell["epochs"] == 3
    # every epoch keeps the test queries' CE; the cell shows what each rate's probe ended with
    assert all(0 < e["test_ce"] < 12 for r in runs.values() for e in r["epochs"])
    assert cell["probe"]["rates"] == {
        zm.lr_sweep.lr_label(lr): {
            "acc": r["epochs"][0]["test_acc"],
            "test_ce": r["epochs"][0]["test_ce"],
            "train_loss": r["epochs"][0]["loss"],
        }
        for lr, r in runs.items()
    }
    assert cell["probe"]["by_test_ce"] == min(runs, key=lambda lr: runs[lr]["epochs"][0]["test_ce"])
    # the probe is the start of the same run: going on from it is the run an unprobed study trains
    whole = zm.plan_study(
        ["ATTENTION"], [16], [64], **{k: v for k, v in probe.items() if k not in ("device", "probe_epochs")}
    )
    full = zm.run_cell(whole, "ATTENTION", 16, 64, 4, cell["lr"], tmp_path / "whole", device="cpu")
    assert [e["loss"] for e in full["epochs"]] == [e["loss"] for e in chosen["epochs"]]
    # said everywhere a number is shown; a moved study reuses its probed and finished runs
    text = (tmp_path / "zoology.md").read_text()
    assert text.startswith("# MQAR, the Zoology protocol at CPU budget") and "probed for its first 1 epochs" in text
    assert "3 ep" in text and "| probed |" in text and "## The probe, rate by rate" in text
    # the curves: the chosen run only (the other stopped at its probe), its accuracy after each epoch
    from drmlab.experiments.mqar.zoology_report import curves

    assert curves(summary) == {
        (64, 16): [
            {
                "model": "ATTENTION",
                "lr": cell["lr"],
                "chosen": True,
                "epochs": [(e["epoch"], e["test_acc"]) for e in chosen["epochs"]],
            }
        ]
    }
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert "Zoology protocol at CPU budget" in json.loads((tmp_path / "results.json").read_text())["title"]
    other_folder = tmp_path / "elsewhere"
    assert len(zm.restore_runs(tmp_path / "results.json", other_folder)) == 2
    moved = zm.run_zoology_study(["ATTENTION"], [16], [64], out=other_folder, **probe)
    assert all(r.get("reused") for r in moved["runs"]) and moved["cells"] == summary["cells"]


def test_a_cells_chosen_rate_goes_on_before_the_next_cells_probes(tmp_path, monkeypatch):
    calls = []
    real = zm.run_cell
    monkeypatch.setattr(zm, "run_cell", lambda *a, **k: calls.append((a[1], a[5], k["until"])) or real(*a, **k))
    probe = dict(MICRO, epochs=2, probe_epochs=1)
    summary = zm.run_zoology_study(["ATTENTION", "J_NO_DIRECTION"], [16], [64], out=tmp_path, **probe)
    chosen = {name: summary["cells"][f"{name} w16 L64"]["lr"] for name in ("ATTENTION", "J_NO_DIRECTION")}
    assert calls == [
        ("ATTENTION", 1e-3, 1),
        ("ATTENTION", 1e-2, 1),
        ("ATTENTION", chosen["ATTENTION"], None),
        ("J_NO_DIRECTION", 1e-3, 1),
        ("J_NO_DIRECTION", 1e-2, 1),
        ("J_NO_DIRECTION", chosen["J_NO_DIRECTION"], None),
    ]


def test_a_cell_whose_last_probe_another_process_trained_goes_on_after_this_process_next_trains(tmp_path, monkeypatch):
    """Another "process" trains ATTENTION's second probe (held when this one passes it): once this process has
    trained a run, it looks at the held run again, finds it finished and sends ATTENTION's chosen rate on
    before J_NO_DIRECTION's second probe. Before, the continuation waited for this process's next pass."""
    calls, real = [], zm.run_cell

    def another_process_holds_the_first_look(*a, **k):
        key = (a[1], a[5], k["until"])
        if key == ("ATTENTION", 1e-2, 1) and key not in [c[:3] for c in calls]:
            real(*a, **k)  # trained elsewhere; this process was told it is held
            calls.append((*key, "locked"))
            return {"model": a[1], "width": a[2], "seq_len": a[3], "kv": a[4], "lr": a[5], "status": "locked"}
        r = real(*a, **k)
        calls.append((*key, "reused" if r.get("reused") else r["status"]))
        return r

    monkeypatch.setattr(zm, "run_cell", another_process_holds_the_first_look)
    probe = dict(MICRO, epochs=2, probe_epochs=1)
    summary = zm.run_zoology_study(["ATTENTION", "J_NO_DIRECTION"], [16], [64], out=tmp_path, **probe)
    chosen = summary["cells"]["ATTENTION w16 L64"]["lr"]
    assert [c[:3] for c in calls][:5] == [
        ("ATTENTION", 1e-3, 1),
        ("ATTENTION", 1e-2, 1),  # held
        ("J_NO_DIRECTION", 1e-3, 1),  # trained: the held run is looked at again
        ("ATTENTION", 1e-2, 1),  # finished meanwhile
        ("ATTENTION", chosen, None),  # the continuation, before J_NO_DIRECTION's second probe
    ]
    assert calls[1][3] == "locked" and calls[3][3] == "reused" and calls[5][:3] == ("J_NO_DIRECTION", 1e-2, 1)


def test_leave_held_exits_when_the_rest_is_held_and_writes_no_report(tmp_path):
    from drmlab.runs import RunLock

    probe = dict(MICRO, epochs=2, probe_epochs=1)
    lines = []
    lock = RunLock(tmp_path / "locks" / "ATTENTION_w16_L64_lr0.01.lock").acquire()
    try:
        left = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, leave_held=True, log=lines.append, **probe)
        assert left is None and not (tmp_path / "results.json").exists()
        assert "1 run left, each held by another process" in lines[-1]
        done = json.loads((tmp_path / "runs" / "ATTENTION_w16_L64_lr0.001" / "result.json").read_text())
        assert done["status"] == "probed"  # the run not held trained its probe
    finally:
        lock.release()
    summary = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, leave_held=True, **probe)
    assert summary["cells"]["ATTENTION w16 L64"]["status"] == "done" and (tmp_path / "results.json").is_file()


def test_a_chosen_rate_stopped_while_training_on_keeps_its_probe_in_a_report_and_a_rerun(tmp_path, monkeypatch):
    """A report made while a cell's chosen rate trains past its probe (status ``training`` on disk) counts
    that rate's probe score and keeps its probe in the restorable record, rather than dropping the rate."""
    probe = dict(MICRO, epochs=3, probe_epochs=1)
    real = _die_on_evaluation(monkeypatch, 4)  # the two probes, the continuation's epoch 2, then its epoch 3
    with pytest.raises(KeyboardInterrupt):
        zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, **probe)
    monkeypatch.setattr(zm, "query_accuracy", real)
    collected = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, collect_only=True, **probe)
    cell = collected["cells"]["ATTENTION w16 L64"]
    going = next(r for r in collected["finished"] if r.get("going_on"))
    on_disk = json.loads(
        (tmp_path / "runs" / zm.run_name("ATTENTION", 16, 64, going["lr"]) / "result.json").read_text()
    )
    assert on_disk["status"] == "training" and [e["epoch"] for e in on_disk["epochs"]] == [1, 2]
    assert going["status"] == "probed" and [e["epoch"] for e in going["epochs"]] == [1]
    assert going["test_acc"] == on_disk["epochs"][0]["test_acc"] and going["epochs_run"] == 1
    assert going["wall_seconds"] == pytest.approx(
        on_disk["epochs"][0]["train_seconds"] + on_disk["epochs"][0]["eval_seconds"]
    )
    assert cell["status"] == "incomplete" and cell["acc"] is None and len(cell["scores"]) == 2
    assert cell["lr"] == going["lr"]  # the probe's choice, as the training process made it
    assert any(r.get("going_on") for r in collected["finished"])
    text = (tmp_path / "zoology.md").read_text()
    assert "| probed (training on) |" in text and f"| ATTENTION | probed, lr {going['lr']:.3g} training on |" in text
    # the same command goes on with that rate from its checkpoint; before, its probe pass saw a run
    # "training", scored it as missing and sent the cell's other rate on instead
    finished = zm.run_zoology_study(["ATTENTION"], [16], [64], out=tmp_path, **probe)
    done = finished["cells"]["ATTENTION w16 L64"]
    assert done["status"] == "done" and done["lr"] == going["lr"] and done["scores"] == cell["scores"]
    runs = {r["lr"]: r for r in finished["finished"]}
    assert [e["epoch"] for e in runs[going["lr"]]["epochs"]] == [1, 2, 3]
    assert [r["status"] for lr, r in runs.items() if lr != going["lr"]] == ["probed"]
    assert not any(r.get("going_on") for r in finished["runs"])


def test_a_run_of_a_study_without_the_probe_stopped_past_its_epochs_is_probed_for_a_study_with_it(
    tmp_path, monkeypatch
):
    plain = zm.plan_study(
        ["ATTENTION"], [16], [64], preset="micro", lr_grid=[1e-3], epochs=3, n_train=48, n_test=16, batch_size=16
    )
    real = _die_on_evaluation(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        zm.run_cell(plain, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")
    monkeypatch.setattr(zm, "query_accuracy", real)
    path = tmp_path / "runs" / "ATTENTION_w16_L64_lr0.001" / "result.json"
    saved = json.loads(path.read_text())
    assert saved["status"] == "training" and "epochs_run" not in saved and len(saved["epochs"]) == 2
    probed = zm.run_cell(plain, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu", until=2)
    second = saved["epochs"][1]
    assert probed["status"] == "probed" and probed["epochs_run"] == 2 and probed["going_on"]
    assert probed["test_acc"] == second["test_acc"] and probed["steps"] == second["step"] == 6
    assert probed["test_correct"] / probed["test_queries"] == second["test_acc"] and probed["test_queries"] == 16 * 4
    assert probe_score(probed, 2) == second["test_acc"]
    assert json.loads(path.read_text()) == saved  # nothing trained or written
    whole = zm.run_cell(plain, "ATTENTION", 16, 64, 4, 1e-3, tmp_path, device="cpu")  # the run goes on
    assert whole["status"] == "done" and [e["epoch"] for e in whole["epochs"]] == [1, 2, 3]


def test_a_probe_score_is_missing_where_the_run_diverged_within_it():
    epochs = [{"epoch": 1, "test_acc": 0.2}, {"epoch": 2, "test_acc": 0.5}, {"epoch": 3, "test_acc": 0.9}]
    assert probe_score({"status": "done", "epochs": epochs, "epochs_run": 3}, 2) == 0.5
    assert probe_score({"status": "probed", "epochs": epochs[:2], "epochs_run": 2}, 2) == 0.5
    assert probe_score({"status": "diverged", "epochs": epochs[:1]}, 2) is None  # in the probe's second epoch
    assert probe_score({"status": "diverged", "epochs": epochs[:2]}, 2) == 0.5  # after the probe
    early = {"status": "done", "early_stopped": True, "epochs_run": 1, "epochs": [{"epoch": 1, "test_acc": 0.995}]}
    assert probe_score(early, 2) == 0.995
    assert probe_score({"status": "training", "epochs": epochs}, 2) is None
    with pytest.raises(ValueError, match="probe_epochs must be a whole number of epochs below epochs"):
        zm.plan_study(["ATTENTION"], [16], [64], epochs=2, probe_epochs=2)
    from drmlab.experiments.mqar.zoology_report import at_cpu_budget

    assert not at_cpu_budget({"epochs": 64, "probe_epochs": None}) and not at_cpu_budget({"epochs": 64})
    assert at_cpu_budget({"epochs": 16}) and at_cpu_budget({"epochs": 64, "probe_epochs": 2})


def _ended(status: str, acc: float, loss: float, test_ce: float | None = None, epochs: int = 2) -> dict:
    last = {"epoch": 2, "test_acc": acc, "loss": loss, **({} if test_ce is None else {"test_ce": test_ce})}
    first = {"epoch": 1, "test_acc": 0.0, "loss": 9.0, "test_ce": 9.0}
    run = {"status": status, "epochs": [first, last][:epochs], "epochs_run": epochs}
    return run


def test_the_probe_rows_name_the_rate_each_loss_would_choose_and_none_where_a_loss_is_missing():
    runs = [
        dict(_ended("probed", 0.27, 7.6, 5.0), lr=1e-4),  # the best accuracy
        dict(_ended("done", 0.26, 2.4, 4.0), lr=1e-3),  # the lowest last-batch loss
        dict(_ended("probed", 0.20, 3.0, 3.0), lr=1e-2),  # the lowest test CE
        dict(_ended("diverged", 0.0, 9.0, epochs=1), lr=1e-1),  # diverged in the probe: passed over
    ]
    rows = probe_rows(runs, 2)
    assert rows["by_test_ce"] == 1e-2 and rows["by_train_loss"] == 1e-3
    assert rows["rates"]["0.1"] == {"acc": None, "test_ce": None, "train_loss": None}
    assert rows["rates"]["0.001"] == {"acc": 0.26, "test_ce": 4.0, "train_loss": 2.4}  # its probe's end, not later
    del runs[2]["epochs"][1]["test_ce"]  # a run recorded before the test CE was kept
    assert probe_rows(runs, 2)["by_test_ce"] is None and probe_rows(runs, 2)["by_train_loss"] == 1e-3


def test_the_report_shows_the_probe_rate_by_rate():
    from drmlab.experiments.mqar.zoology_report import probe_section

    study = {"lr_grid": [1e-4, 1e-2], "recipe": {"probe_epochs": 2}}
    rates = {"0.0001": {"acc": 0.25, "test_ce": None, "train_loss": 7.5}, "0.01": {"acc": None}}
    cell = {"model": "M", "width": 64, "seq_len": 64, "lr": 1e-4}
    probe = {"rates": rates, "by_test_ce": None, "by_train_loss": 1e-4}
    lines = probe_section({"study": study, "cells": {"M w64 L64": {**cell, "probe": probe}}})
    assert "| cell | lr 0.0001 | lr 0.01 | by accuracy | by test CE | by last batch |" in lines
    assert "| M w64 L64 | 25.00% / -- / 7.500 | diverged | 0.0001 | -- | 0.0001 |" in lines
    assert probe_section({"study": study, "cells": {"M w64 L64": cell}}) == []  # no cell has ended its probe
