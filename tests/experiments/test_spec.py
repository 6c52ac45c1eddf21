"""Studies as specs: StudySpec and Runtime are frozen values; planning the spec of a committed study's
command records its study.json unchanged (the record is in docs/studies/NAME/results.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from drmlab.experiments.ablate import protocol
from drmlab.experiments.loop.study import LoopSpec, ablation_spec
from drmlab.experiments.mqar.distance import DistanceSpec
from drmlab.experiments.mqar.study import MQARSpec
from drmlab.experiments.spec import Runtime, StudySpec
from drmlab.training.config import resolve_train_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "studies"


def _committed_records() -> dict[str, dict]:
    """Every ablation-protocol study record committed in docs/studies (a study's or a part's ``study``)."""
    records = {}
    for path in sorted(DOCS.glob("*/results.json")):
        results = json.loads(path.read_text())
        if results.get("protocol") == "zoology":  # the Zoology MQAR record: a plan of its own (mqar.zoology)
            continue
        parts = {"": results, **{f"/{k}": v for k, v in (results.get("parts") or {}).items()}}
        for suffix, part in parts.items():
            study = part.get("study") if isinstance(part, dict) else None
            if isinstance(study, dict) and "lr_grid" in study:
                records[path.parent.name + suffix] = study
    return records


COMMITTED = _committed_records()


def spec_of(record: dict) -> StudySpec:
    """The spec of the command that made a study: the train settings that differ from the preset's
    defaults at its budget (the rate is the sweep's own when it has a grid)."""
    train = record["train"]
    defaults = dataclasses.asdict(resolve_train_config(record["preset"], tokens=train["tokens"]))
    given = {k: v for k, v in train.items() if k != "tokens" and v != defaults[k]}
    if record["lr_grid"] is not None:
        given.pop("lr", None)
    return StudySpec(
        models=record["models"],
        seeds=record["seeds"],
        preset=record["preset"],
        tokens=train["tokens"],
        train=given,
        model_settings=record["model_overrides"],
        data=record["data_source"],
        tokenizer=record["tokenizer"],
        lr_grid=record["lr_grid"],
        tune_tokens=record["tune_tokens"],
        rates=record.get("rates"),  # a study trained at another study's rates (--lr-from)
    )


def test_specs_and_the_runtime_are_frozen_values():
    spec = StudySpec(models=["J", "GPT2"], seeds=[1, 2], train={"lr": 1e-3})
    assert spec.models == ("J", "GPT2") and spec.seeds == (1, 2)  # lists kept as tuples
    for value, name in (
        (spec, "preset"),
        (Runtime(), "device"),
        (LoopSpec(), "eval_loops"),
        (MQARSpec(), "steps"),
        (DistanceSpec(), "lengths"),
    ):
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


def test_every_committed_protocol_study_is_found():
    assert len(COMMITTED) >= 7 and "protocol-tiny" in COMMITTED


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_a_committed_study_records_identically(name, tmp_path):
    record = COMMITTED[name]
    study = protocol.plan_study(spec_of(record))
    protocol.record_study(tmp_path, study, {"content_sha256": record["content_sha256"]})
    assert json.loads((tmp_path / protocol.STUDY_FILE).read_text()) == record
    # and over a study.json already holding the record: left as it is, byte for byte
    saved = (tmp_path / protocol.STUDY_FILE).read_text()
    protocol.record_study(tmp_path, study, {"content_sha256": record["content_sha256"]})
    assert (tmp_path / protocol.STUDY_FILE).read_text() == saved
