"""Studies as specs: StudySpec and Runtime are frozen values; planning the spec of a committed study's
command records its study.json unchanged, and rerunning it on that study trains nothing."""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from drmlab.experiments.ablate import protocol
from drmlab.experiments.loop.study import LoopSpec, ablation_spec
from drmlab.experiments.mqar.distance import DistanceSpec
from drmlab.experiments.mqar.study import MQARSpec
from drmlab.experiments.spec import Runtime, StudySpec
from drmlab.training.config import resolve_train_config

STUDIES = Path(__file__).resolve().parents[1] / "studies"
COMMITTED = sorted(p.parent for p in STUDIES.glob("**/study.json"))


def spec_of(record: dict) -> StudySpec:
    """The spec of the command that made a study: the train settings that differ from the preset's
    defaults at its budget (the rate is the sweep's own when it has a grid)."""
    train = record["train"]
    defaults = dataclasses.asdict(resolve_train_config(record["preset"], tokens=train["tokens"]))
    given = {k: v for k, v in train.items() if k != "tokens" and v != defaults[k]}
    if record["lr_grid"] is not None:
        given.pop("lr", None)
    return StudySpec(models=record["models"], seeds=record["seeds"], preset=record["preset"], tokens=train["tokens"],
                     train=given, model_settings=record["model_overrides"], data=record["data_source"],
                     tokenizer=record["tokenizer"], lr_grid=record["lr_grid"], tune_tokens=record["tune_tokens"])


def test_specs_and_the_runtime_are_frozen_values():
    spec = StudySpec(models=["J", "GPT2"], seeds=[1, 2], train={"lr": 1e-3})
    assert spec.models == ("J", "GPT2") and spec.seeds == (1, 2)  # lists kept as tuples
    for value, name in ((spec, "preset"), (Runtime(), "device"), (LoopSpec(), "eval_loops"), (MQARSpec(), "steps"),
                        (DistanceSpec(), "lengths")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    settings = {"lr": 1e-3}
    copied = StudySpec(train=settings)
    settings["lr"] = 2.0
    assert copied.train == {"lr": 1e-3}  # the caller's dict is copied
    assert spec.replace(preset="micro").preset == "micro" and spec.preset == "tiny"
    assert Runtime(log=print) == Runtime()  # the log is not part of what a runtime is
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        Runtime(threads=0)


def test_the_loop_spec_is_an_ablation_of_looped_arms():
    spec = ablation_spec(LoopSpec(models=["A", "C"], seeds=[1], model_settings={"C": {"d_state": 8}}))
    assert spec.registry_names == {"A": "LOOPED", "C": "LOOPED"} and spec.tokens == 1_000_000
    assert spec.model_settings == {"A": {"arm": "A"}, "C": {"arm": "C", "d_state": 8}}


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: str(p.relative_to(STUDIES)))
def test_a_committed_study_records_identically(folder, tmp_path):
    saved = (folder / protocol.STUDY_FILE).read_text()
    record = json.loads(saved)
    shutil.copy(folder / protocol.STUDY_FILE, tmp_path / protocol.STUDY_FILE)
    study = protocol.plan_study(spec_of(record))
    protocol.record_study(tmp_path, study, {"content_sha256": record["content_sha256"]})
    assert (tmp_path / protocol.STUDY_FILE).read_text() == saved
    # and from scratch: the same record
    fresh = tmp_path / "fresh"
    protocol.record_study(fresh, study, {"content_sha256": record["content_sha256"]})
    assert json.loads((fresh / protocol.STUDY_FILE).read_text()) == record


def test_rerunning_the_committed_protocol_study_trains_nothing(tmp_path, monkeypatch):
    """The spec of studies/protocol-tiny, run on a copy of it: every sweep and paired run is found
    finished and skipped (no corpus is read: a stand-in with the study's content hash)."""
    from drmlab.training import trainer

    out = tmp_path / "protocol-tiny"
    shutil.copytree(STUDIES / "protocol-tiny", out)
    record = json.loads((out / protocol.STUDY_FILE).read_text())
    tokens = np.zeros(100_000, dtype=np.int64)
    corpus = types.SimpleNamespace(train=tokens, val=tokens, tokenizer=types.SimpleNamespace(name="bytes"),
                                   vocab_size=256, meta={"content_sha256": record["content_sha256"]})
    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("trained a finished run"))
    lines = []
    results = protocol.run_study(spec_of(record), Runtime(log=lines.append), out, corpus=corpus)
    runs = len(record["models"]) * len(record["seeds"]) + len(record["models"]) * len(record["lr_grid"])
    assert len(lines) >= runs and sum("skipped" in line for line in lines) == runs
    assert results["complete"] and json.loads((out / protocol.STUDY_FILE).read_text()) == record
