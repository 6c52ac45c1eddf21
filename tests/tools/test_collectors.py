"""The study collectors (tools/collect_geometry.py, tools/collect_pmcs.py): each turns a run folder of
the shape its commands write into the committed entry, keeping the entries already committed, and
writes the studies' one layout."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"


def _tool(name: str):
    sys.path.insert(0, str(TOOLS))
    try:
        spec = importlib.util.spec_from_file_location(f"drmlab_tool_{name}", TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # a dataclass looks its module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(TOOLS))


@pytest.mark.parametrize("name", ["geometry-tiny", "pmcs-tiny"])
def test_the_collected_records_are_in_the_studies_layout(name):
    """The collectors write through drmlab.experiments.results.write, the committed files' own layout:
    collecting again rewrites a record only where its numbers change."""
    from drmlab.experiments.results import dumps

    text = (ROOT / "docs" / "studies" / name / "results.json").read_text()
    assert dumps(json.loads(text)) == text


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_geometry_collector_keeps_the_scalars_and_the_committed_runs(tmp_path):
    collect = _tool("collect_geometry")
    run = tmp_path / "J-seed2"
    _write(run / "summary.json", {"model": "J", "seed": 2, "val_ce": 1.61, "steps": 611})
    instruments = {
        "metric": {"exact_rank": [128], "eigenvalue_min": 1e-4, "_spectrum_first": [1.0], "seconds": 0.1},
        "pullback": {"how": "exact", "trace_mean": 3.0, "seconds": 0.2},
        "strata": {"rtol": 1e-4, "seconds": 0.3},
        "agreement": {"energy_log_pearson": -0.1, "principal_angles_mean_rad": [1.0], "seconds": 0.4},
        "connection": {
            "holonomy": [{"block": 0, "curvature": 5.0, "consistent": True, "substeps": 9}],
            "transport": [{"block": 0, "completed": False, "transport_failed": "cap", "schild": {}}],
            "seconds": 0.5,
        },
        "geodesics": {
            "blocks": [
                {"block": 0, "path_action": 9.0, "geodesic": {"converged": False, "residual": 0.5, "length": 1}}
            ],
            "note": "n",
            "seconds": 0.6,
        },
        "topology": {"longest_h1": 1.5, "bootstrap_top_persistence": [1], "seconds": 0.7},
    }
    _write(
        run / "geometry-v2" / "geometry.json", {"tokens": 512, "windows": 2, "instruments": instruments, "notes": []}
    )
    record = collect.collect(tmp_path, {"runs": {"J-seed1": {"model": "J", "seed": 1}}})
    assert sorted(record["runs"]) == ["J-seed1", "J-seed2"] and record["runs"]["J-seed1"] == {"model": "J", "seed": 1}
    entry = record["runs"]["J-seed2"]
    assert entry["metric"] == {"exact_rank": [128], "eigenvalue_min": 1e-4}  # spectra and timings stay out
    assert entry["agreement"] == {"energy_log_pearson": -0.1}
    assert entry["connection"]["holonomy"] == [{"block": 0, "curvature": 5.0, "consistent": True}]
    assert entry["connection"]["transport"] == [{"block": 0, "completed": False, "transport_failed": "cap"}]
    assert entry["geodesics"] == [{"block": 0, "path_action": 9.0, "converged": False, "residual": 0.5}]
    assert entry["seconds"]["topology"] == 0.7 and entry["tokens_measured"] == 512 and entry["val_ce"] == 1.61


def _read(acc: float, status: str = "read") -> dict:
    return {"status": status, "acc": acc, "ci95": [0.0, 1.0], "first_acc": acc, "state_bytes": 100, "by_query": [acc]}


def test_the_pmcs_collector_adds_a_seed_and_says_when_its_base_was_trained_again(tmp_path):
    collect = _tool("collect_pmcs")
    record = {
        "arms": [
            {
                "arm": "J_NO_DIRECTION",
                "model": "J_NO_DIRECTION",
                "overrides": {},
                "language": {"per_seed": {"29": 2.2}},
            },
            {"arm": "VR-S fixed", "model": "ASM_VR_S", "overrides": {"rank_policy": "fixed"}, "language": {}},
        ]
    }
    spec = tmp_path / "spec" / "J_NO_DIRECTION-seed29"
    stages = [{"lengths": {"40": {"acc": 0.5}}}, {"lengths": {"40": {"acc": 0.08}, "512": {"acc": 0.1}}}]
    _write(spec / "specialise.json", {"before": {"ce": 2.25}, "after": {"ce": 2.1}, "stages": stages})
    lengths = {"40": _read(0.08), "512": _read(0.05)}
    _write(spec / "reads" / "results.json", {"entries": [{"label": "x", "lengths": lengths}]})
    assert collect.collect(tmp_path, record) == ["J_NO_DIRECTION seed 29"]
    entry = record["arms"][0]["specialised"]["29"]
    assert entry["stage_control_40"] == 0.08  # the recipe's last read of the control
    assert entry["reads"]["512"] == {"acc": 0.05, "ci95": [0.0, 1.0], "first_acc": 0.05, "state_bytes": 100}
    assert entry["base_retrained"] == {"ce": 2.25, "language_leg_ce": 2.2, "difference": pytest.approx(0.05)}
    assert "specialised" not in record["arms"][1]  # a fixed-rank arm is not the model's full-rank arm

    lengths["512"] = {"status": "not read", "why": "the control did not pass"}
    _write(spec / "reads" / "results.json", {"entries": [{"label": "x", "lengths": lengths}]})
    with pytest.raises(ValueError, match="read with --read-all"):
        collect.collect(tmp_path, record)


def test_the_ablation_collector_gives_a_restored_study_its_numbers_and_the_stated_provenance(tmp_path):
    """tools/collect_ablate.py over protocol-tiny restored from its committed record (drmlab ablate
    --restore): the same study, runs, statistics and gates, with the command, machine and how given."""
    from drmlab.experiments.ablate.restore import restore_study

    committed = json.loads((ROOT / "docs" / "studies" / "protocol-tiny" / "results.json").read_text())
    restore_study(committed, tmp_path / "protocol-tiny")
    record = _tool("collect_ablate").record(tmp_path / "protocol-tiny", "protocol-tiny", "drmlab ablate X", "M", "H")
    same = ("study", "models", "runs", "gate", "gate_rule", "complete", "lr_sweep")
    assert json.loads(json.dumps({k: record[k] for k in same})) == {k: committed[k] for k in same}
    made = record["provenance"]
    assert (made["command"], made["machine"], made["how"], made["settings"]) == (
        "drmlab ablate X",
        "M",
        "H",
        committed["study"],
    )
    assert str(tmp_path) not in json.dumps(record)


def test_the_zoology_collector_writes_the_provenance_out_and_says_whether_every_cell_is_done(tmp_path, capsys):
    collect = _tool("collect_zoology")
    made = {"command": "drmlab mqar ... --collect", "commit": "abc123", "date": "2026-12-07", "settings": {"k": 1}}
    cells = {"ATTENTION w64 L64": {"status": "done"}, "GPT2 w64 L64": {"status": "n/a"}}
    study = {"protocol": "zoology", "provenance": made, "cells": cells, "finished": [], "runs": []}
    _write(tmp_path / "study" / "results.json", study)
    got = collect.record(tmp_path / "study", "zoology-x", "drmlab mqar ... (two processes)", "a CPU", "restarts")
    p = got["provenance"]
    assert p["command"] == "drmlab mqar ... (two processes)" and (p["commit"], p["date"]) == ("abc123", "2026-12-07")
    assert p["complete"] is True and p["settings"] == {"k": 1} and "studies/zoology-x" in p["source"]
    assert (p["machine"], p["how"]) == ("a CPU", "restarts") and got["cells"] == cells
    cells["MAMBA w64 L64"] = {"status": "incomplete"}  # a cell whose chosen rate trains on
    _write(tmp_path / "study" / "results.json", study)
    assert collect.record(tmp_path / "study", "zoology-x", "c", "m", "h")["provenance"]["complete"] is False
    # no record yet, or another study's: one line naming the file, nothing written
    args = ["--name", "zoology-x", "--command", "c", "--machine", "m", "--how", "h"]
    assert collect.main(["--study", str(tmp_path / "none"), *args]) == 2
    assert "none/results.json: no readable study record" in capsys.readouterr().err
    _write(tmp_path / "other" / "results.json", {"protocol": "fixed"})
    assert collect.main(["--study", str(tmp_path / "other"), *args]) == 2
    assert "not a Zoology study's record" in capsys.readouterr().err
    assert not (collect.ROOT / "docs" / "studies" / "zoology-x").exists()


def test_the_recipe_parts_collector_keeps_each_arms_scores_and_checks_what_it_puts_back(tmp_path):
    """tools/collect_recipe_parts.py over three arm studies restored from a record (here protocol-tiny's sweep
    under each arm's settings): per arm its scores as the sweep has them, the settings it puts back, its
    command; an arm whose study does not put back what the arm says is refused naming the setting."""
    from drmlab.experiments.ablate.restore import restore_study
    from drmlab.training.recipes import recipe_settings

    tool = _tool("collect_recipe_parts")
    committed = json.loads((ROOT / "docs" / "studies" / "protocol-tiny" / "results.json").read_text())
    for folder, settings, _ in tool.ARMS.values():
        arm = json.loads(json.dumps(committed))
        arm["study"]["train"].update(recipe_settings("field"), recipe="field", **settings)
        restore_study(arm, tmp_path / folder)
    record = tool.record(tmp_path, "M", "H")
    assert set(record["arms"]) == {"betas", "schedule", "decay"} and record["complete"]
    scores = {m: s["scores"] for m, s in committed["lr_sweep"].items()}
    assert all(a["scores"] == scores for a in record["arms"].values())
    assert record["arms"]["decay"]["puts_back"] == {"weight_decay": 0.01, "decay_all_params": True}
    assert "--set weight_decay=0.01 --set decay_all_params=true" in record["arms"]["decay"]["command"]
    assert (record["provenance"]["machine"], record["provenance"]["how"]) == ("M", "H")
    assert str(tmp_path) not in json.dumps(record)
    wrong = tmp_path / "recipe-parts-betas" / "study.json"
    study = json.loads(wrong.read_text())
    study["train"]["beta2"] = 0.95
    wrong.write_text(json.dumps(study))
    with pytest.raises(ValueError, match="recipe-parts-betas: beta2 is 0.95, the arm puts back 0.999"):
        tool.record(tmp_path, "M", "H")
