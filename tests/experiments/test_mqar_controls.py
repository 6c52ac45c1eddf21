"""The recall controls of the distance MQAR protocol (docs/mqar.md section 8.1,
drmlab.experiments.mqar.controls): the controlled examples' layout, models with known answers (a
binder that reads the pairs from its input, two memorisers that leak the answers), the memory
switches on a micro ASM_CM in float64 against their exact meaning, the verdicts, the first-query
accuracy, bad input, and the study end to end with --controls."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from drmlab.cli import main
from drmlab.cli import mqar as mqar_cli
from drmlab.experiments.mqar import controls as mc
from drmlab.experiments.mqar import distance as md
from drmlab.models import build_model
from drmlab.models.drm.fast_weight import FastWeightState

torch.set_num_threads(1)
N = 2 * md.PAIRS  # tokens of the written pairs


# ---------------------------------------------------------------------------------- the controlled examples
@pytest.mark.parametrize("length", [40, 72])
def test_keys_shuffled_permutes_only_the_written_keys(length):
    rows = range(5, 29)
    plain = md.evaluation_tokens(7, length, rows)
    shuffled, bound = mc.control_tokens("keys_shuffled", plain, 7, rows)
    assert torch.equal(shuffled[:, 1:N:2], plain[:, 1:N:2])  # values, in place
    assert torch.equal(shuffled[:, N:], plain[:, N:])  # filler and the whole query block
    q = length - 3 * md.PAIRS
    for p, s, b in zip(plain.tolist(), shuffled.tolist(), bound.tolist()):
        assert sorted(s[0:N:2]) == sorted(p[0:N:2]) and all(a != c for a, c in zip(s[0:N:2], p[0:N:2]))
        now = dict(zip(s[0:N:2], s[1:N:2]))
        assert b == [now[k] for k in p[q + 1 :: 3]]  # the value each queried key now precedes
    # a row's control is a function of its index and seed alone
    again, _ = mc.control_tokens("keys_shuffled", md.evaluation_tokens(7, length, range(9, 12)), 7, range(9, 12))
    assert torch.equal(again, shuffled[4:7])
    other, _ = mc.control_tokens("keys_shuffled", plain, 8, rows)
    assert not torch.equal(other, shuffled)


def test_queries_shuffled_asks_the_same_questions_elsewhere():
    rows = range(16)
    plain = md.evaluation_tokens(0, 72, rows)
    shuffled, bound = mc.control_tokens("queries_shuffled", plain, 0, rows)
    assert bound is None and torch.equal(shuffled[:, :48], plain[:, :48])
    for p, s in zip(plain.tolist(), shuffled.tolist()):
        triples = [tuple(p[48 + 3 * j : 51 + 3 * j]) for j in range(8)]
        moved = [tuple(s[48 + 3 * j : 51 + 3 * j]) for j in range(8)]
        assert sorted(moved) == sorted(triples) and all(a != b for a, b in zip(moved, triples))
    inputs, targets = md.split_tokens(shuffled)
    pos = md.scored_positions(72)
    lookup = [dict(zip(r[0:N:2], r[1:N:2])) for r in plain.tolist()]
    assert targets[:, pos].tolist() == [[lk[k] for k in row] for lk, row in zip(lookup, inputs[:, pos].tolist())]
    for control in mc.MEMORY_CONTROLS:
        same, none = mc.control_tokens(control, plain, 0, rows)
        assert torch.equal(same, plain) and none is None


def test_a_derangement_is_uniform_and_has_no_fixed_point():
    rng = np.random.default_rng(0)
    draws = np.stack([mc.derangement(rng, 4) for _ in range(9000)])
    assert not np.any(draws == np.arange(4))
    counts = np.unique(draws, axis=0, return_counts=True)[1]
    assert len(counts) == 9 and counts.min() > 850 and counts.max() < 1150  # the 9 derangements of 4, ~1000 each


# ---------------------------------------------------------------------------------- models with known answers
class Reader(nn.Module):
    """Reads tokens[:-1] like a model: one-hot logits at each position from ``answer(row, t)``."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # read_length asks for a device

    def forward(self, tokens, return_state=False):
        logits = torch.zeros(*tokens.shape, md.VOCAB_SIZE)
        for i, row in enumerate(tokens.tolist()):
            for t in range(md.CONTROL_LENGTH - 3 * md.PAIRS, len(row)):
                answer = self.answer(row, t)
                if answer is not None:
                    logits[i, t, answer] = 1.0
        return types.SimpleNamespace(logits=logits, state=None)


class Binder(Reader):
    """Recall by binding: at a queried key, the value that followed that key in the written pairs."""

    def answer(self, row, t):
        if row[t - 1] == md.MARKER:
            return dict(zip(row[0:N:2], row[1:N:2])).get(row[t])


class ByValues(Reader):
    """A leak: the answers of the evaluation rows memorised by (written values, queried key)."""

    def __init__(self, plain):
        super().__init__()
        self.table = {}
        for row in plain.tolist():
            for k, v in zip(row[0:N:2], row[1:N:2]):
                self.table[(tuple(row[1:N:2]), k)] = v

    def answer(self, row, t):
        return self.table.get((tuple(row[1:N:2]), row[t])) if row[t - 1] == md.MARKER else None


class BySlot(Reader):
    """A leak: the answers memorised by (written values, query slot) -- blind to the queried key."""

    def __init__(self, plain):
        super().__init__()
        length = plain.shape[1]
        self.table = {(tuple(r[1:N:2]), j): r[length - 24 + 3 * j + 2] for r in plain.tolist() for j in range(8)}
        self.length = length

    def answer(self, row, t):
        j, rest = divmod(t - (self.length - 24) - 1, 3)
        return self.table.get((tuple(row[1:N:2]), j)) if rest == 0 and 0 <= j < 8 else None


def _read(model, control, n=64, length=72):
    return md.read_length(model, length, n, eval_batch=32, chunk=128, control=control)


def test_a_binder_falls_to_exactly_the_coincidence_level_and_follows_the_shuffled_keys():
    binder, n = Binder(), 64
    plain = _read(binder, None)
    assert plain["acc"] == plain["first_acc"] == 1.0 and plain["first_total"] == n
    shuffled = _read(binder, "keys_shuffled")
    # independently: slot j's value v_j is now bound to the key that carried v_sigma(j); hits where they coincide
    expected = 0
    for r, row in enumerate(md.evaluation_tokens(0, 72, range(n)).tolist()):
        sigma = mc.derangement(np.random.default_rng([0, 0, r, 3]))
        values = row[1:N:2]
        expected += sum(values[j] == values[sigma[j]] for j in range(8))
    assert shuffled["correct"] == expected and shuffled["binder_level"] == expected / (8 * n)
    assert 0 < expected < 8 * n * 0.05  # about 1/64 of the targets
    assert shuffled["bound_correct"] == 8 * n and shuffled["bound_acc"] == 1.0  # it answers the bound value
    assert _read(binder, "queries_shuffled")["acc"] == 1.0
    lengths = {
        "72": dict(plain, controls={"keys_shuffled": shuffled, "queries_shuffled": _read(binder, "queries_shuffled")})
    }
    verdicts = mc.control_verdicts(lengths, ["keys_shuffled", "queries_shuffled"])
    assert verdicts["keys_shuffled"]["verdict"] == "falls" and verdicts["queries_shuffled"]["verdict"] == "keeps"
    with pytest.raises(ValueError, match="control memory_read_off: Binder has no fast-weight memory"):
        _read(binder, "memory_read_off")
    assert mc.applies("memory_write_off", binder) == mc.NO_MEMORY and mc.applies("keys_shuffled", binder) is None


def test_leaks_survive_the_control_that_does_not_address_them_and_are_flagged():
    n = 64
    plain_tokens = md.evaluation_tokens(0, 72, range(n))
    by_values, by_slot = ByValues(plain_tokens), BySlot(plain_tokens)
    for leak in (by_values, by_slot):
        assert _read(leak, None)["acc"] == 1.0
    # memorised by key: keys shuffled leaves the values and queries in place, so the leak keeps 100%
    plain, keys = _read(by_values, None), _read(by_values, "keys_shuffled")
    assert keys["acc"] == 1.0 and keys["bound_acc"] == keys["binder_level"] < 0.05
    v = mc.control_verdicts({"72": dict(plain, controls={"keys_shuffled": keys})}, ["keys_shuffled"])
    assert v["keys_shuffled"]["verdict"] == "does not fall" and "72" in v["keys_shuffled"]["reasons"]
    assert "first query" in v["keys_shuffled"]["reasons"]["72"] and "all queries" in v["keys_shuffled"]["reasons"]["72"]
    # memorised by slot: blind to the key, it survives keys shuffled but not queries shuffled
    plain, keys, queries = (_read(by_slot, c) for c in (None, "keys_shuffled", "queries_shuffled"))
    assert keys["acc"] == 1.0 and queries["acc"] < 0.1
    v = mc.control_verdicts(
        {"72": dict(plain, controls={"keys_shuffled": keys, "queries_shuffled": queries})},
        ["keys_shuffled", "queries_shuffled"],
    )
    assert v["keys_shuffled"]["verdict"] == "does not fall" and v["queries_shuffled"]["verdict"] == "does not keep"


# ---------------------------------------------------------------------------------- the memory switches
def _asm_cm(seed=0, **kw):
    model = build_model("ASM_CM", preset="micro", vocab_size=256, seed=seed, **kw).double().eval()
    with torch.no_grad():  # W_o starts at zero (a no-op memory): give the read something to say
        for m in mc.memory_modules(model):
            m.read_out.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


@pytest.mark.parametrize("kw", [{}, {"fast_weight_epistemic_gates": True}], ids=["ASM_CM", "epistemic"])
def test_read_off_is_exactly_the_model_without_its_read_and_write_off_writes_nothing(kw):
    model = _asm_cm(**kw)
    inputs, _ = md.split_tokens(md.evaluation_tokens(0, 72, range(3)))
    silent = _asm_cm(**kw)
    with torch.no_grad():
        plain = model(inputs, return_state=True)
        for m in mc.memory_modules(silent):
            m.read_out.weight.zero_()  # W_o = 0: the correction is exactly zero
        reference = silent(inputs).logits
        with mc.memory_switched(model, "memory_read_off"):
            read_off = model(inputs, return_state=True)
        with mc.memory_switched(model, "memory_write_off"):
            write_off = model(inputs, return_state=True)
        after = model(inputs).logits
    assert not torch.allclose(plain.logits, reference)  # the memory matters in this model
    assert torch.equal(read_off.logits, reference)
    memories = [s for s in _walk(plain.state) if isinstance(s, FastWeightState)]
    kept = [s for s in _walk(read_off.state) if isinstance(s, FastWeightState)]
    silent_memories = [s for s in _walk(silent(inputs, return_state=True).state) if isinstance(s, FastWeightState)]
    # read off, the memory is still written (as in the model whose read is zero), only not read
    assert kept and all(a.fast.equal(b.fast) and a.slow.equal(b.slow) for a, b in zip(kept, silent_memories))
    written = [s for s in _walk(write_off.state) if isinstance(s, FastWeightState)]
    assert len(written) == len(memories) and memories[0].fast.any() and memories[0].slow.any()
    for s in written:
        assert not s.fast.any() and not s.slow.any()  # nothing entered M or C
    # from an empty memory, nothing written means nothing read: the logits of read off
    assert torch.equal(write_off.logits, reference)
    assert torch.equal(after, plain.logits)  # switched back
    assert all(not m.read_off and not m.write_off for m in mc.memory_modules(model))


def _walk(state):
    import dataclasses

    yield state
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        for f in dataclasses.fields(state):
            yield from _walk(getattr(state, f.name))
    elif isinstance(state, (tuple, list)):
        for s in state:
            yield from _walk(s)


def test_write_off_from_a_full_memory_only_decays_the_fast_matrix_float64():
    """M_t = f_t M_{t-1} with nothing added, C unchanged: the memory module against this closed form."""
    model = _asm_cm()
    memory = mc.memory_modules(model)[0]
    g = torch.Generator().manual_seed(3)
    d_read, d_token, d_state = model.config.d_read, model.config.d_token, model.config.d_state
    z, z_read, e = (torch.randn(2, 9, d, generator=g, dtype=torch.float64) for d in (d_state, d_read, d_token))
    full = memory.init_state(2, z)
    full.fast.normal_(generator=g), full.slow.normal_(generator=g), full.previous_token.normal_(generator=g)
    with mc.memory_switched(model, "memory_write_off"):
        out, after = memory(z, z_read, e, full)
    previous = torch.cat([full.previous_token.unsqueeze(1), e[:, :-1]], dim=1)
    forget = torch.sigmoid(memory.gates(torch.cat([z_read, e, previous], dim=-1)))[..., 2]
    assert torch.allclose(after.fast, forget.prod(dim=1)[:, None, None] * full.fast, rtol=0, atol=1e-12)
    assert torch.allclose(after.slow, full.slow, rtol=0, atol=1e-12)
    plain_out, plain_after = memory(z, z_read, e, full)
    assert not torch.allclose(plain_after.slow, full.slow)  # written when the switch is off
    assert not torch.allclose(out, plain_out)  # the read of a full memory still acts, write off


def test_the_switches_hold_in_the_stepped_read_are_restored_and_refuse_training():
    model = _asm_cm()
    for control in ("memory_read_off", "memory_write_off"):
        parallel = md.read_length(model, 72, 6, eval_batch=3, chunk=128, control=control)
        stepped = md.read_length(model, 72, 6, eval_batch=3, chunk=20, control=control)  # prefill 20, step 51
        assert stepped["mode"] == "prefill 20 + steps" and stepped["by_query"] == parallel["by_query"]
        inputs, _ = md.split_tokens(md.evaluation_tokens(0, 72, range(3)))
        pos = md.scored_positions(72)
        with mc.memory_switched(model, control):
            a, _ = md.read_scored(model, inputs, pos, chunk=128)
            b, _ = md.read_scored(model, inputs, pos, chunk=20)
        assert torch.allclose(a, b, rtol=0, atol=1e-10)
    with pytest.raises(KeyError), mc.memory_switched(model, "memory_read_off"):
        raise KeyError("boom")
    assert not any(m.read_off for m in mc.memory_modules(model))
    model.train()
    with pytest.raises(ValueError, match="an evaluation control"), mc.memory_switched(model, "memory_write_off"):
        pass
    mc.memory_modules(model)[0].read_off = True
    with pytest.raises(RuntimeError, match="not in train mode"):
        model(torch.ones(1, 4, dtype=torch.long))
    mc.memory_modules(model)[0].read_off = False
    assert md.read_length(model, 40, 2)["status"] == "read" and model.training  # read_length restores train mode
    with pytest.raises(ValueError, match="control memory_read_off: SSM_CONTROL has no fast-weight memory"):
        md.read_length(build_model("SSM_CONTROL", preset="micro", vocab_size=256), 40, 2, control="memory_read_off")


# ---------------------------------------------------------------------------------- verdicts and first query
def _rec(correct, total=512, first=None, n=64):
    first = round(correct * n / total) if first is None else first
    return {
        "status": "read",
        "acc": correct / total,
        "ci95": list(md.wilson_interval(correct, total)),
        "first_acc": first / n,
        "first_ci95": list(md.wilson_interval(first, n)),
    }


def test_verdicts_on_synthetic_numbers():
    levels = mc.binding_levels()
    assert levels == {"chance": 1 / 64, "all_queries": md.ELIMINATION_GUESS, "first_query": md.CONTEXT_GUESS}
    assert abs(levels["all_queries"] - 0.350048828125) < 1e-15 and levels["first_query"] == 0.138671875
    plain = _rec(510)
    # 179/512 = 35.0% (lower bound below 35%): falls; 230/512 = 44.9%: does not; a first query at 20/64 alone flags it
    lengths = {
        "40": dict(plain, controls={"memory_read_off": _rec(179, first=8), "queries_shuffled": _rec(505)}),
        "512": dict(plain, controls={"memory_read_off": _rec(230), "queries_shuffled": _rec(400)}),
        "4096": dict(plain, controls={"memory_read_off": _rec(8, first=20)}),
    }
    v = mc.control_verdicts(lengths, ["memory_read_off", "queries_shuffled", "keys_shuffled"])
    assert v["memory_read_off"]["verdict"] == "does not fall" and set(v["memory_read_off"]["reasons"]) == {
        "512",
        "4096",
    }
    assert "first query" in v["memory_read_off"]["reasons"]["4096"]
    assert "all queries" not in v["memory_read_off"]["reasons"]["4096"]
    assert v["queries_shuffled"]["verdict"] == "does not keep" and list(v["queries_shuffled"]["reasons"]) == ["512"]
    assert v["keys_shuffled"] == {"verdict": "not read", "lengths_read": 0, "lengths_recalled": 0, "reasons": {}}
    assert v["memory_read_off"]["lengths_recalled"] == 3
    # a plain read at the no-binding level itself: a fall there rules nothing out
    weak = {"40": dict(_rec(150, first=5), controls={"memory_read_off": _rec(10)})}
    assert mc.control_verdicts(weak, ["memory_read_off"])["memory_read_off"]["verdict"].startswith(
        "falls (uninformative"
    )
    assert mc.recalls(_rec(510)) and not mc.recalls(_rec(150, first=5)) and mc.recalls(_rec(150, first=30))
    na = {"40": dict(plain, controls={"memory_write_off": {"status": "n/a", "why": mc.NO_MEMORY}})}
    assert mc.control_verdicts(na, ["memory_write_off"])["memory_write_off"]["verdict"] == "n/a (no fast-weight memory)"


def test_first_query_accuracy_is_the_first_scored_query_of_each_sequence():
    class FirstOnly(Binder):  # binds, but answers only the first query of each sequence
        def answer(self, row, t):
            return super().answer(row, t) if t == len(row) - 22 else None

    record = _read(FirstOnly(), None, n=40)
    assert record["first_correct"] == record["first_total"] == 40 and record["first_acc"] == 1.0
    assert record["correct"] == 40 and record["acc"] == 1 / 8
    assert record["first_ci95"] == list(md.wilson_interval(40, 40)) and record["by_query"][0] == 1.0


# ---------------------------------------------------------------------------------- bad input, the study
def test_control_names():
    assert mqar_cli.RECALL_CONTROLS == ", ".join(mc.CONTROLS)
    assert mc.parse_controls("keys_shuffled, memory_read_off") == ["keys_shuffled", "memory_read_off"]
    with pytest.raises(ValueError, match="unknown control 'keys_shufled' \\(did you mean 'keys_shuffled'\\?\\)"):
        mc.parse_controls(["keys_shufled"])
    with pytest.raises(ValueError, match="named twice"):
        mc.parse_controls("keys_shuffled,keys_shuffled")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "SSM_CONTROL", "--controls", "keys_shufled"], "unknown control 'keys_shufled'"),
        (
            ["--models", "SSM_CONTROL", "--controls", "memory_read_off"],
            "--controls memory_read_off: none of the study's models has a fast-weight memory",
        ),
    ],
)
def test_bad_controls_are_one_line(argv, message, tmp_path, capsys):
    assert main(["mqar", "--protocol", "distance", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("drmlab mqar: error: ") and message in err, err
    assert main(["mqar", "--controls", "keys_shuffled", "--out", str(tmp_path / "out")]) == 2
    assert "--controls: only with --protocol distance" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


ARGS = [
    "mqar",
    "--protocol",
    "distance",
    "--preset",
    "micro",
    "--steps",
    "1",
    "--batch-size",
    "2",
    "--lengths",
    "64",
    "--n-eval",
    "4",
    "--eval-batch",
    "4",
    "--chunk",
    "64",
    "--read-all",
    "--seeds",
    "1",
]


def test_the_study_reads_the_controls_beside_the_plain_reads_and_reuses_them(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    argv = [*ARGS, "--models", "ASM_CM,SSM_CONTROL", "--out", str(out)]
    assert main([*argv, "--controls", "memory_read_off,keys_shuffled"]) == 0
    printed = capsys.readouterr().out
    assert "| ASM_CM s1 | memory_read_off |" in printed and "| SSM_CONTROL s1 | memory_read_off |" in printed
    assert "n/a (no fast-weight memory)" in printed
    asm, ssm = json.loads((out / "results.json").read_text())["entries"]
    for L in ("40", "64"):
        rec = asm["lengths"][L]
        assert (
            set(rec["controls"]) == {"memory_read_off", "keys_shuffled"}
            and "spec" not in rec["controls"]["keys_shuffled"]
        )
        assert rec["controls"]["memory_read_off"]["control"] == "memory_read_off" and "first_ci95" in rec
        assert "bound_acc" in rec["controls"]["keys_shuffled"] and rec["first_total"] == 4
        assert ssm["lengths"][L]["controls"]["memory_read_off"]["status"] == "n/a"
        assert ssm["lengths"][L]["controls"]["keys_shuffled"]["status"] == "read"
    assert ssm["controls"]["memory_read_off"]["verdict"] == "n/a (no fast-weight memory)"
    assert asm["controls"]["memory_read_off"]["lengths_read"] == 2
    # a rerun reads nothing again; a new control is read alone
    reads = []
    real = md.read_length
    monkeypatch.setattr(md, "read_length", lambda *a, **k: reads.append(k.get("control")) or real(*a, **k))
    assert main([*argv, "--controls", "memory_read_off,keys_shuffled"]) == 0
    assert reads == []
    assert main([*argv, "--controls", "memory_read_off,keys_shuffled,memory_write_off"]) == 0
    assert reads == ["memory_write_off"] * 2  # ASM_CM at 40 and 64; SSM_CONTROL is n/a without a read
    entry = json.loads((out / "results.json").read_text())["entries"][0]
    assert entry["lengths"]["64"]["controls"]["memory_write_off"]["status"] == "read"


def test_pairs_unwritten_is_an_empty_memory_after_the_pairs_and_the_ordinary_read_from_there():
    """Reference: the 16 pair tokens prefilled with the read off (an empty memory reads exactly zero),
    the memory's matrices then emptied, every later token stepped plainly: the same logits bit for bit."""
    model = _asm_cm()
    inputs, targets = md.split_tokens(md.evaluation_tokens(0, 72, range(3)))
    pos = md.scored_positions(72)
    logits, state = mc.read_pairs_unwritten(model, inputs, pos)
    with torch.no_grad():
        with mc.memory_switched(model, "memory_read_off"):
            ref_state = model(inputs[:, :16], return_state=True).state
        for s in _walk(ref_state):
            if isinstance(s, FastWeightState):
                assert s.fast.any()  # written, then emptied by hand
                s.fast.zero_(), s.slow.zero_()
        kept = {}
        for t in range(16, inputs.shape[1]):
            out, ref_state = model.step(inputs[:, t], ref_state)
            kept[t] = out
    reference = torch.stack([kept[int(p)] for p in pos], dim=1)
    assert torch.equal(logits, reference)
    plain = model(inputs).logits[:, pos]
    assert not torch.allclose(logits, plain)  # the pairs' writes mattered
    record = md.read_length(model, 72, 3, control="pairs_unwritten")
    assert record["mode"] == "prefill 16 + steps"
    assert record["correct"] == int((reference.argmax(-1) == targets[:, pos]).sum())
    assert mc.applies("pairs_unwritten", build_model("SSM_CONTROL", preset="micro", vocab_size=256)) == mc.NO_MEMORY
