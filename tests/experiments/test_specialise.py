"""The specialisation recipe (drmlab.experiments.specialise, ``drmlab specialise``): the student equals
its base at step 0, the two learning-rate groups, the frozen teacher, the distillation and MQAR losses,
the output run directory, exact continuation after an interruption (a stage read lost with it is read
again), and refused bases. The steps are the trainer's (drmlab.training.train with the recipe's pieces)."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from drmlab.experiments import specialise as recipe
from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.experiments.specialise import continuing
from drmlab.training.run_info import DataInfo, RunInfo

CURRICULUM = [(40, 3), (72, 2)]
EVAL_SEQUENCES = 8
EVAL_TOKENS = 2000


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(
        "\n\n".join((stdlib / n).read_text() for n in ("textwrap.py", "bisect.py", "colorsys.py", "keyword.py"))
    )
    return path


@pytest.fixture(scope="module")
def corpus(corpus_file, cache_dir):
    from drmlab.data import load_corpus

    return load_corpus(source=str(corpus_file), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def base_run(corpus, tmp_path_factory):
    """A J_NO_DIRECTION micro run trained for 4 steps."""
    from drmlab.evaluation import rescorer
    from drmlab.models import build_model
    from drmlab.training import TrainConfig, train

    out = tmp_path_factory.mktemp("runs") / "base"
    cfg = TrainConfig(batch_size=4, seq_len=32, lr=3e-3, eval_every=0, eval_windows=0, eval_tokens=EVAL_TOKENS)
    cfg.tokens = 4 * cfg.tokens_per_step
    model = build_model("J_NO_DIRECTION", "micro", vocab_size=256, seed=0)
    train(
        model,
        corpus.train,
        None,
        cfg.validate(),
        out,
        run_info=RunInfo("J_NO_DIRECTION", "micro", data=DataInfo.of(corpus, str(corpus.meta["source"]))),
        evaluate=rescorer(corpus.val, cfg.seq_len, batch_size=cfg.eval_batch_size, max_targets=EVAL_TOKENS),
        device="cpu",
        quiet=True,
    )
    return out


def settings(**kw) -> recipe.Settings:
    return recipe.Settings(curriculum=[list(s) for s in CURRICULUM], seed=0, eval_sequences=EVAL_SEQUENCES, **kw)


def job(base_run, corpus, out, **kw) -> recipe.Specialisation:
    return recipe.Specialisation(
        base_run,
        out,
        settings(),
        corpus,
        eval_tokens=EVAL_TOKENS,
        device="cpu",
        checkpoint_every=kw.pop("checkpoint_every", 0),
        **kw,
    )


@pytest.fixture(scope="module")
def finished(base_run, corpus, tmp_path_factory):
    """An uninterrupted specialisation (the class, so its teacher and student can be inspected)."""
    out = tmp_path_factory.mktemp("runs") / "specialised"
    run = job(base_run, corpus, out)
    before = {k: v.clone() for k, v in run.student.state_dict().items()}
    result = run.run()
    return run, out, result, before


def test_student_equals_the_base_at_step_zero(base_run):
    from drmlab.runs import load_run_model

    teacher, config, _ = recipe.load_base(base_run, "cpu")
    student = recipe.build_student(config, teacher, seed=0)
    assert student.model_name == "ASM_CM" and student.training and not teacher.training
    base, _, _ = load_run_model(base_run)
    tokens = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(student(tokens).logits, base(tokens).logits)  # bit for bit: W_o = 0
        # the trainable student and the frozen teacher too (so the distillation term starts at 0)
        assert torch.equal(student(tokens).logits, teacher(tokens).logits)
        student.fast_weight_memory.read_out.weight.fill_(0.01)
        assert not torch.equal(student(tokens).logits, teacher(tokens).logits)
    base_weights = teacher.state_dict()
    for name, tensor in student.state_dict().items():
        if not name.startswith(recipe.MEMORY_PREFIX):
            assert torch.equal(tensor, base_weights[name]), name


def test_only_the_memory_gets_the_memory_rate(base_run):
    teacher, config, _ = recipe.load_base(base_run, "cpu")
    student = recipe.build_student(config, teacher, seed=0)
    optimizer = recipe.build_optimizer(student, backbone_lr=2e-5, memory_lr=3e-4)
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"backbone", "memory"}
    assert groups["backbone"]["lr"] == 2e-5 and groups["memory"]["lr"] == 3e-4
    assert groups["backbone"]["weight_decay"] == groups["memory"]["weight_decay"] == 0.01
    named = dict(student.named_parameters())
    memory = {id(p) for n, p in named.items() if n.startswith("fast_weight_memory.")}
    assert memory and {id(p) for p in groups["memory"]["params"]} == memory
    assert {id(p) for p in groups["backbone"]["params"]} == {id(p) for p in named.values()} - memory
    assert len(groups["backbone"]["params"]) + len(groups["memory"]["params"]) == len(named)


def test_distillation_term_against_a_hand_written_kl():
    gen = torch.Generator().manual_seed(2)
    student = torch.randn(2, 5, 256, dtype=torch.float64, generator=gen) * 3
    teacher = torch.randn(2, 5, 256, dtype=torch.float64, generator=gen) * 3
    targets = torch.randint(0, 256, (2, 5), generator=gen)
    assert recipe.distillation_kl(student, student).item() == 0.0
    assert recipe.distillation_kl(student.float(), student.float()).item() == 0.0
    T = 2.0
    p_t = torch.softmax(teacher / T, -1)
    hand = (p_t * (torch.log(p_t) - torch.log_softmax(student / T, -1))).sum() / 10
    kl = recipe.distillation_kl(student, teacher, T)
    assert kl.item() > 0 and kl.item() == pytest.approx(hand.item(), rel=1e-12)
    assert recipe.distillation_kl(student.float(), teacher.float(), T).item() == pytest.approx(hand.item(), rel=1e-5)
    total, ce, kd = recipe.language_loss(student, teacher, targets)
    hand_ce = -torch.log_softmax(student, -1).gather(-1, targets.unsqueeze(-1)).mean()
    assert ce.item() == pytest.approx(hand_ce.item(), rel=1e-12)
    assert kd.item() == pytest.approx(hand.item(), rel=1e-12)
    assert total.item() == pytest.approx(hand_ce.item() + 0.5 * T * T * hand.item(), rel=1e-12)
    same = recipe.language_loss(student, student, targets)
    assert same[2].item() == 0.0 and same[0].item() == same[1].item()


def test_mqar_loss_scores_only_the_eight_queries():
    inputs, targets = recipe.mqar_batch(seed=5, step=3, length=72)
    assert inputs.shape == targets.shape == (4, 71)
    scored = targets != mqar_distance.IGNORE
    positions = mqar_distance.scored_positions(72)
    assert scored.sum(1).tolist() == [8] * 4 and scored[:, positions].all()
    logits = torch.randn(
        4, 71, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True
    )
    loss = recipe.mqar_loss(logits, targets)
    loss.backward()
    touched = logits.grad.abs().sum(-1) != 0
    assert torch.equal(touched, scored)
    hand = -torch.log_softmax(logits.detach(), -1)[:, positions].gather(-1, targets[:, positions].unsqueeze(-1)).mean()
    assert loss.item() == pytest.approx(hand.item(), rel=1e-12)
    assert [recipe.mqar_batch_size(L) for L in (40, 511, 512, 1023, 1024, 4096)] == [4, 4, 2, 2, 1, 1]


def test_batches_are_functions_of_the_step_on_three_streams(corpus):
    coins = [recipe.uses_language(0, k) for k in range(1, 2001)]
    assert 0.77 < np.mean(coins) < 0.83
    assert coins == [recipe.uses_language(0, k) for k in range(1, 2001)]
    a, b = recipe.language_batch(corpus.train, 0, 7)
    assert a.shape == b.shape == (1, 128) and torch.equal(a[:, 1:], b[:, :-1])
    assert torch.equal(a, recipe.language_batch(corpus.train, 0, 7)[0])
    assert not torch.equal(a, recipe.language_batch(corpus.train, 1, 7)[0])
    assert torch.equal(recipe.mqar_batch(0, 7, 40)[0], recipe.mqar_batch(0, 7, 40)[0])


def test_curriculum_flags():
    from drmlab.cli import specialise as verb

    assert recipe.parse_curriculum(verb.DEFAULT_CURRICULUM) == list(recipe.DEFAULT_CURRICULUM)
    assert sum(s for _, s in recipe.DEFAULT_CURRICULUM) == 2625
    assert recipe.scale_curriculum(recipe.DEFAULT_CURRICULUM, 0.1)[-1] == (4096, 2)
    assert recipe.scale_curriculum([(40, 3)], 0.01) == [(40, 1)]
    for bad in ("40", "40:0", "80:1,40:1", "39:5", "a:b", ""):
        with pytest.raises(ValueError):
            recipe.parse_curriculum(bad)
    with pytest.raises(ValueError, match="steps-scale"):
        recipe.scale_curriculum(recipe.DEFAULT_CURRICULUM, 0)


def test_specialised_run_is_an_ordinary_run(finished, base_run):
    from drmlab.runs import RunDir, load_run_model

    run, out, result, before = finished
    # the teacher is the base, frozen, unchanged; the base run's files too
    base_model, _, _ = RunDir(base_run).load_model("cpu")
    assert not run.teacher.training and not any(p.requires_grad for p in run.teacher.parameters())
    for name, tensor in base_model.state_dict().items():
        assert torch.equal(run.teacher.state_dict()[name], tensor), name
    # both groups trained
    after = run.student.state_dict()
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert any(n.startswith(recipe.MEMORY_PREFIX) for n in changed)
    assert any(not n.startswith(recipe.MEMORY_PREFIX) for n in changed)
    # the output loads as ASM_CM with the trained student's weights
    model, config, state = load_run_model(out)
    assert config["model"] == "ASM_CM" and config["preset"] == "micro" and int(state["step"]) == 5
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, after[name]), name
    tokens = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(4))
    run.student.eval()
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, run.student(tokens).logits)
    # results: stages, verdicts, the language CE before equals the base's
    saved = json.loads((out / recipe.RESULT_FILE).read_text())
    assert saved == json.loads(json.dumps(result))
    assert [s["length"] for s in saved["stages"]] == [40, 72]
    assert list(saved["stages"][1]["lengths"]) == ["40", "72"] and saved["stages"][0]["lengths"]["40"]["total"] == 64
    assert (
        saved["before"]["ce"] == json.loads((base_run / "summary.json").read_text())["val_ce"]
    )  # the student is the base
    assert saved["language"]["regression"] == pytest.approx(saved["after"]["ce"] - saved["before"]["ce"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["val_ce"] == saved["after"]["ce"]
    all_rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in all_rows if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and [r["stage"] for r in rows] == [40, 40, 40, 72, 72]
    # the trainer's rows carry the recipe's entries: both batch kinds, each group's own constant rate
    assert {r["batch"] for r in rows} == {"language", "mqar"}
    assert all((r["kd"] is None) == (r["batch"] == "mqar") for r in rows)
    assert all(r["lr_backbone"] == 1e-5 and r["lr_memory"] == 1e-4 for r in rows)
    assert [r["batch_tokens"] for r in rows if r["batch"] == "language"] == [128] * sum(
        r["batch"] == "language" for r in rows
    )
    # the hooks' rows: the CE before at step 0, each stage's reads after its last step (as in specialise.json)
    assert [(r["kind"], r["step"]) for r in all_rows if r["kind"] != "train"] == [
        ("rescore", 0),
        ("stage", 3),
        ("stage", 5),
    ]
    assert [r["lengths"] for r in all_rows if r["kind"] == "stage"] == [st["lengths"] for st in saved["stages"]]
    # an ASM_CM base is copied whole
    teacher, config, _ = recipe.load_base(out, "cpu")
    student = recipe.build_student(config, teacher, seed=9)
    for name, tensor in student.state_dict().items():
        assert torch.equal(tensor, after[name]), name


def test_a_killed_run_continues_to_the_same_weights(
    finished, base_run, corpus, specialise_argv, tmp_path, monkeypatch, capsys
):
    from drmlab.cli import main
    from drmlab.runs import load_run_model

    reference, _, reference_result, _ = finished
    out = tmp_path / "killed"
    real_batch = recipe.MixedBatches.global_batch

    def dies_at_five(self, seed, step, micro):
        if step == 5:
            raise KeyboardInterrupt  # a kill: the last checkpoint is the end of stage 40 (step 3)
        return real_batch(self, seed, step, micro)

    monkeypatch.setattr(recipe.MixedBatches, "global_batch", dies_at_five)
    with pytest.raises(KeyboardInterrupt):
        job(base_run, corpus, out).run()
    assert json.loads((out / "checkpoint.json").read_text())["step"] == 3
    monkeypatch.setattr(recipe.MixedBatches, "global_batch", real_batch)
    argv = specialise_argv(
        base_run, out, "--curriculum", "40:3,72:2", eval_sequences=EVAL_SEQUENCES, eval_tokens=EVAL_TOKENS
    )
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "continuing" in captured.err and "| after stage |" in captured.out
    model, _, _ = load_run_model(out)
    for name, tensor in reference.student.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    result = json.loads((out / recipe.RESULT_FILE).read_text())
    for a, b in zip(result["stages"], reference_result["stages"]):
        assert {L: r["correct"] for L, r in a["lengths"].items()} == {L: r["correct"] for L, r in b["lengths"].items()}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in rows if r["kind"] == "stage"] == [3, 5]
    # finished: refused without --overwrite, in one line
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "finished specialisation" in err and err.count("\n") == 1


def test_bad_bases_are_refused_in_one_line(base_run, tmp_path, capsys):
    from drmlab.cli import main

    other = tmp_path / "other"
    shutil.copytree(base_run, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, model="SSM_CONTROL")))
    (other / "config.seal.json").unlink()  # as a run of that model written before config.json was sealed
    for base, words in ((other, "a SSM_CONTROL run"), (tmp_path / "nothing", "not a drmlab run directory")):
        assert main(["specialise", "--base", str(base), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_non_finite_gradient_stops_before_the_update(base_run, corpus, tmp_path):
    from drmlab.training.trainer import NonFiniteLossError

    run = job(base_run, corpus, tmp_path / "nan")
    trainer = run.trainer()
    try:
        trainer.start(resume=False)
        weights = {k: v.clone() for k, v in run.student.state_dict().items()}
        run.student.embedding.weight.register_hook(lambda g: g * float("nan"))
        with pytest.raises(NonFiniteLossError, match="non-finite gradient norm .* at step 1 .*--memory-lr"):
            trainer.train_step(1)
        for name, tensor in run.student.state_dict().items():
            assert torch.equal(tensor, weights[name]), name
    finally:
        trainer.close()


def test_a_stage_read_lost_to_a_kill_is_read_again(finished, base_run, corpus, tmp_path, monkeypatch):
    """Killed while reading stage 40 (its checkpoint committed): continuing reads it again first, once."""
    _, _, reference_result, _ = finished
    out = tmp_path / "lost-read"
    real_evaluate = recipe.Specialisation.evaluate_stage

    def dies_reading(self, length, first, last, model=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe.Specialisation, "evaluate_stage", dies_reading)
    with pytest.raises(KeyboardInterrupt):
        job(base_run, corpus, out).run()
    assert json.loads((out / "checkpoint.json").read_text())["step"] == 3
    assert json.loads((out / recipe.RESULT_FILE).read_text())["stages"] == []
    monkeypatch.setattr(recipe.Specialisation, "evaluate_stage", real_evaluate)
    result = job(base_run, corpus, out).run()
    assert [st["length"] for st in result["stages"]] == [40, 72]

    def reads(stages):
        return [{L: (r["correct"], r["by_query"]) for L, r in st["lengths"].items()} for st in stages]

    assert reads(result["stages"]) == reads(reference_result["stages"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] in ("stage", "resume")] == [
        ("resume", 3),
        ("stage", 3),
        ("stage", 5),
    ]


# ---------------------------------------------------------------------------------- the interleaved recipe
def test_interleaved_order_is_upstreams_pmcs_schedule():
    """2,625 MQAR batches with a language step after every 4th: 3,281 updates (upstream-asm-vr.md section 9);
    each stage holds its own MQAR batches, the stages tile the steps."""
    s = recipe.Settings.interleaved([list(st) for st in recipe.DEFAULT_CURRICULUM], seed=0).validate()
    assert s.total_steps == 3281
    language = [k for k in range(1, s.total_steps + 1) if s.is_language_step(k)]
    assert len(language) == 656 and language[:3] == [5, 10, 15]
    bounds = s.stage_bounds()
    assert bounds[0][1] == 1 and bounds[-1][2] == s.total_steps
    assert all(b[1] == a[2] + 1 for a, b in zip(bounds, bounds[1:]))
    for (length, batches), (bound_length, first, last) in zip(recipe.DEFAULT_CURRICULUM, bounds):
        mqar = [k for k in range(first, last + 1) if not s.is_language_step(k)]
        assert bound_length == length and len(mqar) == batches
        assert all(s.stage_of(k) == length for k in range(first, last + 1))
    batches = recipe.MixedBatches(np.arange(10_000) % 256, s)
    assert [batches.is_language(0, k) for k in range(1, 11)] == [False] * 4 + [True] + [False] * 4 + [True]
    inputs, targets = batches.global_batch(0, 5, 0)
    assert inputs.shape == (4, 256) and torch.equal(inputs[:, 1:], targets[:, :-1])


def test_interleaved_recipe_trains_the_base_model_as_it_is(base_run, corpus, tmp_path):
    from drmlab.runs import load_run_model

    s = recipe.Settings.interleaved([list(st) for st in CURRICULUM], seed=0, eval_sequences=EVAL_SEQUENCES)
    run = recipe.Specialisation(
        base_run, tmp_path / "pmcs", s, corpus, eval_tokens=EVAL_TOKENS, device="cpu", checkpoint_every=0
    )
    assert run.student_name == "J_NO_DIRECTION"
    base, _, _ = load_run_model(base_run)
    for name, tensor in base.state_dict().items():
        assert torch.equal(run.student.state_dict()[name], tensor), name
    result = run.run()
    model, config, state = load_run_model(tmp_path / "pmcs")
    assert config["model"] == "J_NO_DIRECTION" and int(state["step"]) == 6  # 5 MQAR batches + 1 language step
    rows = [json.loads(line) for line in (tmp_path / "pmcs" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["batch"] for r in train_rows] == ["mqar"] * 4 + ["language", "mqar"]
    assert [r["stage"] for r in train_rows] == [40, 40, 40, 72, 72, 72]
    assert all(r["kd"] is None for r in train_rows)  # no teacher
    assert [r["batch_tokens"] for r in train_rows if r["batch"] == "language"] == [4 * 256]
    assert all(r["lr_all"] == 3e-4 for r in train_rows)
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] == "stage"] == [("stage", 3), ("stage", 6)]
    assert [st["length"] for st in result["stages"]] == [40, 72] and "language" in result
    optimizer = recipe.build_single_rate_optimizer(run.student, 3e-4)
    assert [g["name"] for g in optimizer.param_groups] == ["all"]
    assert len(optimizer.param_groups[0]["params"]) == len(list(run.student.parameters()))


def test_a_run_written_before_the_recipes_continues_as_distill(finished):
    run, _, _, _ = finished
    spec = run.spec()
    old = json.loads(json.dumps(spec))
    for key in ("recipe", "language_rows", "language_every", "lr"):
        del old["settings"][key]
    assert continuing.differences(continuing.with_new_defaults(old), spec) == []
    old["settings"]["memory_lr"] = 1.0
    assert continuing.differences(continuing.with_new_defaults(old), spec) != []


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--lr", "1e-3"], "--lr is the interleaved recipe's rate"),
        (["--recipe", "interleaved", "--memory-lr", "1e-3"], "--recipe interleaved trains every parameter at --lr"),
    ],
)
def test_rates_of_the_other_recipe_are_refused_in_one_line(
    base_run, cache_dir, corpus_file, tmp_path, capsys, flags, words
):
    from drmlab.cli import main

    argv = ["specialise", "--base", str(base_run), "--out", str(tmp_path / "out"), "--device", "cpu"]
    argv += ["--cache-dir", str(cache_dir), "--data", str(corpus_file), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_rate_conflict_is_refused_before_the_corpus_is_read(base_run, tmp_path, capsys):
    """The rates are checked first: with a corpus that does not exist, the refusal still names the rate."""
    from drmlab.cli import main

    missing = tmp_path / "no-such-corpus.txt"
    argv = ["specialise", "--base", str(base_run), "--out", str(tmp_path / "out"), "--device", "cpu"]
    argv += ["--data", str(missing), "--recipe", "interleaved", "--backbone-lr", "1e-5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--recipe interleaved trains every parameter at --lr" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_bf16_runs_both_forwards_in_bf16_within_its_round_off_of_float32(base_run, corpus):
    """settings.bf16 (``--fast``): the teacher's and the student's matrix products run in bf16, the losses
    stay float32 and within bf16's round-off of the float32 losses on a language and an MQAR batch."""
    plain = job(base_run, corpus, "unused-plain")
    fast = recipe.Specialisation(
        base_run, "unused-fast", settings(bf16=True), corpus, eval_tokens=EVAL_TOKENS, device="cpu"
    )
    with torch.no_grad():  # a memory that reads something, so the student differs from the teacher
        for run in (plain, fast):
            run.student.fast_weight_memory.read_out.weight.fill_(0.01)
    seen = []  # (run, model, dtype) of every linear layer's output
    for name, run in (("plain", plain), ("fast", fast)):
        for role, model in (("student", run.student), ("teacher", run.teacher)):
            for layer in (m for m in model.modules() if isinstance(m, torch.nn.Linear)):
                layer.register_forward_hook(lambda m, i, o, key=(name, role): seen.append((*key, o.dtype)))
    steps = {plain.batches.is_language(0, s): s for s in range(1, 6)}
    assert set(steps) == {True, False}  # a language step and an MQAR step
    for language, step in steps.items():
        batch = plain.batches.global_batch(0, step, 0)
        seen.clear()
        with torch.no_grad():
            loss32, row32 = plain.loss(plain.student, batch, step)
            loss16, row16 = fast.loss(fast.student, batch, step)
        roles = {"student", "teacher"} if language else {"student"}  # the teacher reads language batches only
        assert {(run, role, dtype) for run, role, dtype in seen} == {
            *(("plain", role, torch.float32) for role in roles),
            *(("fast", role, torch.bfloat16) for role in roles),
        }
        assert loss16.dtype == loss32.dtype == torch.float32 and row16["batch"] == row32["batch"]
        # bf16 keeps 8 bits: the CE of a 4-step micro model moves by well under 1%, but it moves
        assert loss16.item() != loss32.item()
        assert abs(loss16.item() - loss32.item()) < 1e-2 * loss32.item()


def test_bf16_is_recorded_and_a_run_continued_without_it_is_refused(finished, specialise_argv, base_run, tmp_path):
    run, _, _, _ = finished
    spec = run.spec()
    assert spec["settings"]["bf16"] is False
    old = json.loads(json.dumps(spec))
    del old["settings"]["bf16"]  # a run from before --fast: float32
    assert continuing.differences(continuing.with_new_defaults(old), spec) == []
    changed = dict(old, settings=dict(old["settings"], bf16=True))
    assert continuing.differences(changed, spec) == ["settings.bf16: True in the run, False now"]
    assert run.train_config().bf16 is False


def test_fast_specialises_in_bf16_where_the_cpu_has_bf16_units_and_says_when_not(monkeypatch, capsys):
    import argparse

    from drmlab.cli import specialise as verb
    from drmlab.training import fast

    args = argparse.Namespace(fast=True, bf16=None, device="cpu")
    monkeypatch.setattr(fast, "bf16_unavailable", lambda device: None)
    assert verb.fast_bf16(args) is True and capsys.readouterr().err == ""
    monkeypatch.setattr(fast, "bf16_unavailable", lambda device: "this CPU has no bf16 matrix units")
    assert verb.fast_bf16(args) is False
    err = capsys.readouterr().err
    assert err == "drmlab: --fast: this CPU has no bf16 matrix units: specialising in float32 with the fused kernels\n"
    assert verb.fast_bf16(argparse.Namespace(fast=None, bf16=True, device="cpu")) is True
    assert verb.fast_bf16(argparse.Namespace(fast=None, bf16=None, device="cpu")) is False


def test_fast_puts_the_selective_memory_s_products_in_bf16_in_both_models(base_run, corpus, tmp_path, monkeypatch):
    """settings.bf16_memory_products (on under ``--fast``, docs/drm.md A.4.7): the teacher's memory is switched
    by the job, the student's by the trainer while it trains, and the run records it; without bf16 it is
    refused."""
    import argparse

    from drmlab.cli import specialise as verb

    switches = lambda model: [m.products_in_autocast for m in model.modules() if hasattr(m, "products_in_autocast")]  # noqa: E731
    plain = recipe.Specialisation(
        base_run, "unused", settings(bf16=True), corpus, eval_tokens=EVAL_TOKENS, device="cpu"
    )
    assert switches(plain.teacher) == [False] and plain.train_config().bf16_memory_products is False
    run = recipe.Specialisation(
        base_run,
        tmp_path / "products",
        settings(bf16=True, bf16_memory_products=True),
        corpus,
        eval_tokens=EVAL_TOKENS,
        device="cpu",
        checkpoint_every=1,
    )
    assert switches(run.teacher) == [True] and switches(run.student) == [False]  # the student: when trained
    real_batch = recipe.MixedBatches.global_batch

    def dies_at_two(self, seed, step, micro):
        if step == 2:
            raise KeyboardInterrupt
        return real_batch(self, seed, step, micro)

    monkeypatch.setattr(recipe.MixedBatches, "global_batch", dies_at_two)
    seen = set()  # the student's switches at each of its forwards while it trains
    run.student.register_forward_pre_hook(lambda *_: seen.update(switches(run.student)))
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert seen == {True} and switches(run.student) == [False]  # on while trained, off again after
    config = json.loads((tmp_path / "products" / "config.json").read_text())
    assert config["train"]["bf16_memory_products"] is True
    assert config["specialise"]["settings"]["bf16_memory_products"] is True
    with pytest.raises(ValueError, match="bf16_memory_products needs bf16"):
        settings(bf16_memory_products=True).validate()
    # the verb: --fast where it chose bf16, never --bf16 alone
    assert verb.fast_memory_products(argparse.Namespace(fast=True), True) is True
    assert verb.fast_memory_products(argparse.Namespace(fast=True), False) is False
    assert verb.fast_memory_products(argparse.Namespace(fast=None), True) is False


def test_a_fast_run_from_before_the_memory_products_decision_is_refused_with_the_way_to_continue_it(finished):
    run, _, _, _ = finished
    old = json.loads(json.dumps(run.spec()))
    del old["settings"]["bf16_memory_products"]  # written before the setting existed
    now = dict(old, settings=dict(old["settings"], bf16=True, bf16_memory_products=True))
    old["settings"]["bf16"] = True
    refusal = continuing.why_not_continue(run.run_dir, {"spec": old}, None, now)
    assert refusal.startswith("a specialisation under other settings (settings.bf16_memory_products: False in the run")
    assert refusal.endswith("--bf16 without --fast continues the run as it ran)")
    # the other way round (a run with the products in bf16, continued with --bf16 alone): no such hint
    back = continuing.why_not_continue(
        run.run_dir, {"spec": now}, None, old | {"settings": dict(old["settings"], bf16_memory_products=False)}
    )
    assert "--bf16 without --fast" not in back and "True in the run, False now" in back
