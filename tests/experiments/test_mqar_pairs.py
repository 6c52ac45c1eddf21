"""The pair count of the distance MQAR task (docs/mqar.md section 8.2): the default 8
draws what the task drew before it was a setting, bit for bit; at 16 and 32 pairs an example has
distinct keys, asks each written key once and is scored at its queries; the no-binding levels follow
their closed forms; the distance study and ``drmlab specialise`` take ``--pairs`` (and the specialisation
``--fast-weight-dim``), record them, report the decoding state's bytes beside recall, and refuse a bad
value or a run under another pair count in one line."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from drmlab.cli import main
from drmlab.cli import mqar as mqar_cli
from drmlab.cli import specialise as specialise_cli
from drmlab.experiments import specialise as recipe
from drmlab.experiments.mqar import controls
from drmlab.experiments.mqar import distance as md
from drmlab.models import build_model

torch.set_num_threads(1)


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------- the task
def test_the_default_eight_pairs_draw_what_the_task_drew_before_the_setting():
    """The digests were computed with the code of commit 3c4ab21 (before ``pairs`` existed, PAIRS = 8
    hard-coded), with exactly these calls: the first 16 hex digits of the sha256 of the tensors' bytes."""
    from drmlab.experiments.specialise import mqar_batch

    rows = md.evaluation_tokens(7, 72, range(16))
    assert _digest(rows) == "e67ec9a6ee216b4e"
    assert _digest(md.training_tokens(5, 3, 1, 4, 136)) == "629eb73903eae3b8"
    assert _digest(md.training_tokens(5, 3, 1, 4)) == "35d7adedb1ffbbcd"  # the control length by default
    assert _digest(*md.split_tokens(rows)) == "8bcff20c00266801"
    assert _digest(*controls.control_tokens("keys_shuffled", rows, 7, range(16))) == "b0ab527c1ccda28a"
    assert _digest(controls.control_tokens("queries_shuffled", rows, 7, range(16))[0]) == "94bf588598561482"
    assert _digest(*mqar_batch(3, 11, 80)) == "7838898eedba7694"
    # and the same with the pair count given
    assert torch.equal(md.evaluation_tokens(7, 72, range(16), pairs=8), rows)
    assert md.scored_positions(72).tolist() == [49, 52, 55, 58, 61, 64, 67, 70]
    assert (md.PAIRS, md.CONTROL_LENGTH, md.control_length(8)) == (8, 40, 40)


@pytest.mark.parametrize("pairs", [16, 32])
def test_examples_of_many_pairs_follow_the_layout(pairs):
    control = 5 * pairs
    length = control + 24
    tokens = md.evaluation_tokens(3, length, range(10), pairs=pairs)
    assert tokens.shape == (10, length) and md.control_length(pairs) == control
    inputs, targets = md.split_tokens(tokens, pairs)
    q = length - 3 * pairs
    for row, tgt in zip(tokens.tolist(), targets.tolist()):
        keys, values = row[0 : 2 * pairs : 2], row[1 : 2 * pairs : 2]
        assert len(set(keys)) == pairs and all(2 <= k <= 33 for k in keys) and all(34 <= v <= 97 for v in values)
        assert all(98 <= f <= 255 for f in row[2 * pairs : q]) and len(row[2 * pairs : q]) == length - control
        assert row[q::3] == [1] * pairs and sorted(row[q + 1 :: 3]) == sorted(keys)  # each key asked once
        lookup = dict(zip(keys, values))
        assert row[q + 2 :: 3] == [lookup[k] for k in row[q + 1 :: 3]]
        scored = [t for t, y in enumerate(tgt) if y != md.IGNORE]
        assert scored == md.scored_positions(length, pairs).tolist() == [q + 3 * j + 1 for j in range(pairs)]
        assert [tgt[t] for t in scored] == [lookup[row[t]] for t in scored]
    # rows ask the same questions at every length; training batches at the control length by default
    longer = md.evaluation_tokens(3, length + 100, range(10), pairs=pairs)
    assert torch.equal(longer[:, : 2 * pairs], tokens[:, : 2 * pairs])
    assert torch.equal(longer[:, -3 * pairs :], tokens[:, -3 * pairs :])
    x, y = md.DistanceBatches(4, pairs=pairs).batch(1, 2, 0)
    assert x.shape == (4, control - 1) and ((y != md.IGNORE).sum(1) == pairs).all()
    if pairs == 32:  # every key id in every example
        assert all(sorted(row[0:64:2]) == list(range(2, 34)) for row in tokens.tolist())


def test_the_no_binding_levels_follow_their_closed_forms():
    for pairs in (1, 2, 8, 16, 32):
        harmonic = sum(Fraction(1, r) for r in range(1, pairs + 1))
        assert md.context_guess(pairs) == pytest.approx(float((1 + Fraction(pairs - 1, 64)) / pairs), rel=1e-15)
        assert md.elimination_guess(pairs) == pytest.approx(
            float((harmonic + (pairs - harmonic) / 64) / pairs), rel=1e-14
        )
        levels = controls.binding_levels(pairs)
        assert levels["all_queries"] == md.elimination_guess(pairs) and levels["chance"] == 1 / 64
    # at 8 pairs: exactly the constants the protocol always had
    assert md.context_guess(8) == md.CONTEXT_GUESS == 0.138671875
    assert md.elimination_guess(8) == md.ELIMINATION_GUESS
    assert controls.binding_levels() == controls.binding_levels(8)
    assert md.levels(16) == {
        "pairs": 16,
        "control_length": 80,
        "chance": 1 / 64,
        "context_guess": md.context_guess(16),
        "elimination_guess": md.elimination_guess(16),
    }


@pytest.mark.parametrize("bad", [0, 33, -1, True, 8.0, "8"])
def test_a_pair_count_outside_the_keys_is_refused_in_one_line(bad):
    with pytest.raises(ValueError) as err:
        md.check_pairs(bad)
    text = str(err.value)
    assert "pairs (--pairs) must be an integer from 1 to 32" in text and "\n" not in text
    with pytest.raises(ValueError, match=">= 80 \\(the 16 pairs"):
        md.evaluation_tokens(0, 79, range(1), pairs=16)


def test_controls_and_reads_at_sixteen_pairs():
    rows = md.evaluation_tokens(2, 100, range(6), pairs=16)
    shuffled, bound = controls.control_tokens("keys_shuffled", rows, 2, range(6), pairs=16)
    assert bound.shape == (6, 16)
    assert torch.equal(shuffled[:, 1:32:2], rows[:, 1:32:2]) and torch.equal(shuffled[:, 32:], rows[:, 32:])
    assert not (shuffled[:, 0:32:2] == rows[:, 0:32:2]).any()  # a derangement: no key keeps its slot
    asked, _ = controls.control_tokens("queries_shuffled", rows, 2, range(6), pairs=16)
    assert sorted(map(tuple, asked[0, 52:].view(16, 3).tolist())) == sorted(
        map(tuple, rows[0, 52:].view(16, 3).tolist())
    )
    with pytest.raises(ValueError, match="need >= 2 pairs"):
        controls.derangement(np.random.default_rng(0), 1)
    model = build_model("ASM_CM", preset="micro", vocab_size=256, seed=0).eval()
    plain = md.read_length(model, 100, 4, eval_batch=2, chunk=48, pairs=16)
    assert plain["total"] == 64 and len(plain["by_query"]) == 16 and plain["mode"] == "prefill 48 + steps"
    assert plain["state_bytes"] > 0
    unwritten = md.read_length(model, 100, 2, control="pairs_unwritten", pairs=16)
    assert unwritten["mode"] == "prefill 32 + steps" and unwritten["total"] == 32


# ---------------------------------------------------------------------------------- the distance study
STUDY = [
    "mqar",
    "--protocol",
    "distance",
    "--preset",
    "micro",
    "--models",
    "SSM_CONTROL",
    "--seeds",
    "1",
    "--steps",
    "1",
    "--batch-size",
    "2",
    "--lengths",
    "96",
    "--n-eval",
    "2",
    "--read-all",
]


def test_the_distance_study_at_sixteen_pairs_records_them(tmp_path, capsys):
    out = tmp_path / "study"
    assert main([*STUDY, "--pairs", "16", "--out", str(out)]) == 0
    summary = json.loads((out / "results.json").read_text())
    protocol, entry = summary["protocol"], summary["entries"][0]
    assert (protocol["pairs"], protocol["control_length"], protocol["lengths"]) == (16, 80, [80, 96])
    assert protocol["elimination_guess"] == md.elimination_guess(16)
    assert protocol["no_binding_levels"]["first_query"] == md.context_guess(16)
    assert entry["lengths"]["96"]["total"] == 32 and entry["gates"]["control"]["length"] == 80
    assert entry["lengths"]["96"]["state_bytes"] > 0
    run = out / "runs" / "SSM_CONTROL_s1"
    assert json.loads((run / "result.json").read_text())["spec"]["pairs"] == 16
    config = json.loads((run / "config.json").read_text())
    assert config["mqar_distance"] == {"train_length": 80, "milestones": [1], "pairs": 16}
    assert config["train"]["seq_len"] == 79
    assert "16 key-value pairs" in capsys.readouterr().out
    # the same OUT under another pair count: refused before anything trains
    assert main([*STUDY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run of 16 pairs; --pairs 8 needs another --out" in err


def test_the_default_lengths_start_above_the_control():
    assert md.default_lengths(8) == (512, 4096, 32768) and md.default_lengths(32) == (512, 4096, 32768)
    study = md.plan_study(md.DistanceSpec(models=["SSM_CONTROL"], preset="micro", pairs=32))
    assert study.lengths == [160, 512, 4096, 32768] and study.control_length == 160
    assert md.plan_study(md.DistanceSpec(models=["SSM_CONTROL"], preset="micro")).lengths == [40, 512, 4096, 32768]
    # a learned position table is widened to the control of the pairs
    _, kw = md.resolve_model("GPT2", "micro", None, {}, pairs=32)
    assert kw["n_positions"] == 160
    assert mqar_cli.DISTANCE_PAIRS == md.PAIRS and mqar_cli.DISTANCE_MAX_PAIRS == md.MAX_PAIRS


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pairs", "33"], "pairs (--pairs) must be an integer from 1 to 32"),
        (["--pairs", "16", "--lengths", "40"], "length must be an integer >= 80 (the 16 pairs"),
        (["--pairs", "1", "--controls", "keys_shuffled"], "a shuffle needs at least 2 pairs"),
    ],
)
def test_bad_pairs_are_one_line_in_the_distance_study(flags, message, tmp_path, capsys):
    assert main(["mqar", "--protocol", "distance", "--models", "ASM_CM", *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_pairs_belong_to_the_distance_protocol(tmp_path, capsys):
    assert main(["mqar", "--pairs", "16", "--out", str(tmp_path / "o")]) == 2
    assert "--pairs: only with --protocol distance" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- the specialisation
def test_the_default_curriculum_fits_the_pairs():
    assert recipe.default_curriculum(8) == list(recipe.DEFAULT_CURRICULUM)
    assert recipe.default_curriculum(16)[:2] == [(80, 1500), (160, 500)]
    assert recipe.default_curriculum(32)[:2] == [(160, 2000), (320, 300)]
    assert recipe.default_curriculum(10)[:2] == [(50, 1000), (80, 500)]
    for pairs in (1, 8, 10, 16, 32):  # the same steps and the same last stage
        stages = recipe.default_curriculum(pairs)
        assert sum(s for _, s in stages) == 2625 and stages[-1] == (4096, 25)
    with pytest.raises(ValueError, match="below 80, the control length of 16 pairs"):
        recipe.parse_curriculum("40:10,80:10", pairs=16)
    assert (specialise_cli.DEFAULT_PAIRS, specialise_cli.MAX_PAIRS) == (md.PAIRS, md.MAX_PAIRS)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("\n\n".join((stdlib / n).read_text() for n in ("textwrap.py", "bisect.py", "colorsys.py")))
    return path


@pytest.fixture(scope="module")
def base_run(corpus_file, cache_dir, tmp_path_factory):
    """A J_NO_DIRECTION micro run trained for 2 steps."""
    out = tmp_path_factory.mktemp("runs") / "base"
    argv = ["train", "--model", "J_NO_DIRECTION", "--preset", "micro", "--tokens", "256", "--batch-size", "4"]
    argv += ["--seq-len", "32", "--eval-tokens", "1000", "--data", str(corpus_file), "--cache-dir", str(cache_dir)]
    assert main([*argv, "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    return out


def test_a_specialisation_at_sixteen_pairs_end_to_end(base_run, specialise_argv, tmp_path, capsys):
    from drmlab.runs import load_run_model

    out = tmp_path / "p16"
    argv = specialise_argv(base_run, out, "--curriculum", "80:2,96:1")
    assert main([*argv, "--pairs", "16", "--fast-weight-dim", "4"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / recipe.RESULT_FILE).read_text())
    settings = result["spec"]["settings"]
    assert (settings["pairs"], settings["fast_weight_dim"], settings["curriculum"]) == (16, 4, [[80, 2], [96, 1]])
    last = result["stages"][-1]["lengths"]
    assert sorted(last, key=int) == ["80", "96"] and all(r["total"] == 4 * 16 for r in last.values())
    assert len(last["96"]["by_query"]) == 16
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "ASM_CM" and config["overrides"] == {"fast_weight_dim": 4}
    assert config["specialise"]["settings"]["pairs"] == 16
    # the decoding state beside recall: what the loaded model carries after 95 inputs, per sequence
    model, _, _ = load_run_model(out)
    assert model.config.fast_weight_dim == 4
    tokens = md.split_tokens(md.evaluation_tokens(0, 96, range(1), pairs=16), 16)[0]
    state_bytes = md.state_nbytes(model.eval()(tokens, return_state=True).state)
    assert last["96"]["state_bytes"] == state_bytes == last["80"]["state_bytes"]
    wider = build_model("ASM_CM", preset="micro", vocab_size=256, seed=0).eval()
    assert md.state_nbytes(wider(tokens, return_state=True).state) > state_bytes  # micro's own 8 is wider
    assert f"task: 16 pairs; decoding state per sequence (fast_weight_dim 4): L = 80: {state_bytes:,} B" in printed
    # reading the run back takes the pair count it was specialised at, and says so
    read = tmp_path / "read"
    argv = ["mqar", "--protocol", "distance", "--ckpt", str(out), "--lengths", "96", "--n-eval", "2"]
    assert main([*argv, "--eval-batch", "2", "--out", str(read)]) == 0
    printed = capsys.readouterr().out
    assert f"pairs 16: the pair count {out} was specialised at" in printed
    assert json.loads((read / "results.json").read_text())["protocol"]["pairs"] == 16


def test_continuing_under_another_pair_count_is_refused(
    base_run, corpus_file, cache_dir, specialise_argv, tmp_path, capsys
):
    from drmlab.data import load_corpus

    out = tmp_path / "killed"
    corpus = load_corpus(source=str(corpus_file), cache_dir=cache_dir)
    recipe.specialise(
        base_run,
        out,
        corpus,
        curriculum=[(80, 2), (96, 1)],
        seed=0,
        pairs=16,
        eval_sequences=4,
        eval_tokens=1000,
        device="cpu",
        checkpoint_every=1,
        stop_after_step=1,
    )
    argv = specialise_argv(base_run, out, "--curriculum", "80:2,96:1")
    assert main(argv) == 2  # --pairs 8 now
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "settings.pairs: 16 in the run, 8 now" in err, err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pairs", "33"], "pairs (--pairs) must be an integer from 1 to 32"),
        (["--pairs", "16", "--curriculum", "40:2,80:1"], "curriculum length 40 is below 80"),
        (["--fast-weight-dim", "0"], "--fast-weight-dim must be a positive integer"),
        (["--recipe", "interleaved", "--fast-weight-dim", "8"], "the student J_NO_DIRECTION has no fast-weight memory"),
    ],
)
def test_bad_specialisation_settings_are_one_line(base_run, tmp_path, capsys, flags, message):
    missing = tmp_path / "no-such-corpus.txt"  # refused before the corpus is read
    argv = ["specialise", "--base", str(base_run), "--out", str(tmp_path / "o"), "--data", str(missing), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_an_asm_cm_base_keeps_its_memory_width():
    config = {"model": "ASM_CM", "preset": "micro", "vocab_size": 256, "overrides": {"fast_weight_dim": 8}}
    assert recipe.student_overrides(config, "distill", 8) == {"fast_weight_dim": 8}
    assert recipe.student_overrides(config, "distill", None) == {"fast_weight_dim": 8}
    with pytest.raises(ValueError, match="the base's ASM_CM memory is 8 wide and is copied whole"):
        recipe.student_overrides(config, "distill", 16)
    jnd = {"model": "J_NO_DIRECTION", "preset": "micro", "vocab_size": 256, "overrides": {}}
    assert recipe.student_overrides(jnd, "distill", 32) == {"fast_weight_dim": 32}


def test_ckpts_specialised_at_different_pair_counts_need_pairs(tmp_path, capsys):
    for name, settings in (("a", {"pairs": 16}), ("b", {}), ("plain", None)):  # b: from before --pairs (8)
        (tmp_path / name).mkdir()
        config = {"model": "ASM_CM"} if settings is None else {"model": "ASM_CM", "specialise": {"settings": settings}}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    argv = ["mqar", "--protocol", "distance", "--out", str(tmp_path / "o")]
    assert main([*argv, "--ckpt", str(tmp_path / "a"), "--ckpt", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different pair counts" in err and "give --pairs" in err
