"""Training recipes (drmlab.training.recipes): what each one sets, how they layer with the preset and the
flags, the optimizer and schedule they give, and the refusals on the command line and in a study."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from tests.cli.cli_runs import CORPUS, one_line, train_argv

from drmlab.cli import main
from drmlab.training.config import TRAIN_KEYS, TrainConfig, resolve_train_config
from drmlab.training.optim import build_optimizer, lr_at
from drmlab.training.recipes import DEFAULT_RECIPE, RECIPE_KEYS, RECIPES, departures, describe, recipe_settings


def test_the_train_config_defaults_are_the_reference_recipe():
    # so a config.json or study.json written before recipes had names records a reference run
    defaults = TrainConfig()
    assert DEFAULT_RECIPE == "reference" and defaults.recipe == "reference"
    assert {key: getattr(defaults, key) for key in RECIPE_KEYS} == RECIPES["reference"]
    assert departures(defaults) == {}


def test_every_recipe_sets_the_same_train_settings():
    for name, settings in RECIPES.items():
        assert tuple(settings) == RECIPE_KEYS and set(settings) <= set(TRAIN_KEYS), name
        TrainConfig(recipe=name, **settings).validate()


def test_the_field_recipe_is_the_one_the_guide_describes():
    cfg = resolve_train_config("tiny", recipe="field", tokens=5_005_312)
    assert (cfg.beta1, cfg.beta2, cfg.weight_decay, cfg.decay_all_params, cfg.grad_clip) == (0.9, 0.95, 0.1, False, 1.0)
    assert (cfg.schedule, cfg.warmup_fraction, cfg.min_lr_ratio) == ("cosine", 0.05, 0.1)
    assert cfg.total_steps == 611 and cfg.warmup_steps == 31
    # the preset still sizes the run and sets the rate
    assert (cfg.batch_size, cfg.seq_len, cfg.lr) == (32, 256, 2e-3)


def test_a_flag_or_set_changes_one_setting_of_the_recipe_and_the_change_is_said():
    cfg = resolve_train_config("micro", recipe="field", weight_decay=0.05, lr=1e-3)
    assert cfg.weight_decay == 0.05 and cfg.beta2 == 0.95 and cfg.recipe == "field"
    assert departures(cfg) == {"weight_decay": 0.05}
    assert describe(cfg).endswith("changed: weight_decay=0.05")
    assert "changed" not in describe(resolve_train_config("micro", recipe="field"))


def test_an_unknown_recipe_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown recipe 'feild' \(did you mean 'field'\?\); known: field, reference"):
        recipe_settings("feild")
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        resolve_train_config("micro", recipe="nope")
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        TrainConfig(recipe="nope").validate()


def test_the_field_optimizer_decays_matrices_only_with_its_betas():
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))
    field = build_optimizer(model, resolve_train_config("micro", recipe="field"))
    decayed = {id(p) for g in field.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    plain = {id(p) for g in field.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed == {id(p) for p in model.parameters() if p.dim() >= 2}
    assert plain == {id(p) for p in model.parameters() if p.dim() < 2}
    assert all(g["betas"] == (0.9, 0.95) for g in field.param_groups)
    reference = build_optimizer(model, resolve_train_config("micro"))
    assert [(g["weight_decay"], g["betas"]) for g in reference.param_groups] == [(0.01, (0.9, 0.999))]
    assert len(reference.param_groups[0]["params"]) == len(list(model.parameters()))


def test_the_field_schedule_warms_up_then_decays_to_a_tenth():
    cfg = resolve_train_config("tiny", recipe="field", tokens=5_005_312)
    peak, warm, last = cfg.lr, cfg.warmup_steps, cfg.total_steps
    assert [lr_at(k, cfg) for k in (1, warm)] == pytest.approx([peak / warm, peak])
    assert lr_at(last, cfg) == pytest.approx(0.1 * peak)
    middle = warm + (last - warm) / 2  # half-way through the decay: half-way between the peak and the floor
    assert lr_at(math.ceil(middle), cfg) == pytest.approx(0.55 * peak, rel=0.01)
    rates = [lr_at(k, cfg) for k in range(warm, last + 1)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    reference = resolve_train_config("tiny", tokens=5_005_312)
    assert {lr_at(k, reference) for k in (1, 300, 611)} == {reference.lr}


def test_train_records_the_recipe_and_a_resume_under_another_is_refused(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    out = tmp_path / "run"
    assert main(train_argv(out, corpus, "--recipe", "field")) == 0
    train = json.loads((out / "config.json").read_text())["train"]
    assert train["recipe"] == "field" and {k: train[k] for k in RECIPE_KEYS} == RECIPES["field"]
    capsys.readouterr()
    resume = ["train", "--resume", "--out", str(out), "--tokens", "4k", "--threads", "1", "--quiet"]
    assert main([*resume, "--recipe", "reference"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "trained with recipe 'field', not 'reference'" in line
    # --set recipe=... reaches the trainer's own resume check, which names both too
    assert main([*resume, "--set", "recipe=reference"]) == 2
    assert "recipe: 'field' in the run, 'reference' now" in one_line(capsys.readouterr().err)


def test_train_refuses_an_unknown_recipe_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    assert main(train_argv(tmp_path / "run", corpus, "--recipe", "feild")) == 2
    assert "unknown recipe 'feild' (did you mean 'field'?); known: field, reference" in one_line(
        capsys.readouterr().err
    )
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_study_refuses_another_recipe_and_names_it_first(tmp_path):
    from drmlab.experiments.ablate.plan import plan_study, record_study
    from drmlab.experiments.spec import StudySpec

    spec = StudySpec(models=("J",), seeds=(1,), preset="micro", tokens="4k", train={"recipe": "field"})
    record_study(tmp_path, plan_study(spec), {"content_sha256": "x"})
    recorded = json.loads((tmp_path / "study.json").read_text())["train"]
    assert recorded["recipe"] == "field" and recorded["beta2"] == 0.95
    record_study(tmp_path, plan_study(spec), {"content_sha256": "x"})  # the same study again: accepted
    with pytest.raises(ValueError) as refused:
        record_study(tmp_path, plan_study(dataclasses.replace(spec, train={})), {"content_sha256": "x"})
    problems = str(refused.value).split(": ", 1)[1]
    assert problems.startswith("recipe: 'field' in the study, 'reference' now;")
    assert "beta2: 0.95 in the study, 0.999 now" in problems


def test_a_reference_study_records_no_recipe_so_the_earlier_records_compare_equal(tmp_path):
    from drmlab.experiments.ablate.plan import plan_study, record_study
    from drmlab.experiments.spec import StudySpec

    spec = StudySpec(models=("J",), seeds=(1,), preset="micro", tokens="4k")
    assert "recipe" not in plan_study(spec).train
    record_study(tmp_path, plan_study(spec), {"content_sha256": "x"})
    # asking for the reference recipe by name is the same study
    record_study(
        tmp_path, plan_study(dataclasses.replace(spec, train={"recipe": "reference"})), {"content_sha256": "x"}
    )
