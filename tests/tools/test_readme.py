"""The generated tables of the README (its headline), docs/results.md (a table per study) and
docs/results-in-full.md (every study table), and the figure, are the committed results in docs/studies,
rendered by the repository's own tool (tools/readme.py, not part of the installed package), each page
holding exactly its tables; the committed records name their command, commit and date and nothing of the
machine or of who ran them.

The claims the pages' prose makes about the studies are tested in tests/studies/.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_tool():
    spec = importlib.util.spec_from_file_location("drmlab_readme_tool", ROOT / "tools" / "readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rt = _load_tool()


@pytest.fixture(scope="module")
def studies() -> dict[str, dict]:
    return rt.load_studies(ROOT)


def _copy_repo_files(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs" / "studies", tmp_path / "docs" / "studies")
    for page in rt.PAGES:
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(ROOT / "docs" / "figures", tmp_path / "docs" / "figures")
    return tmp_path


def test_the_pages_tables_and_figure_are_current():
    assert rt.check(ROOT) == []


def test_the_tool_runs_from_any_folder(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "readme.py"), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "match docs/studies" in done.stdout


def test_every_page_holds_exactly_its_tables_and_every_table_has_a_page(studies):
    for page, names in rt.PAGES.items():
        assert sorted(rt.find_blocks((ROOT / page).read_text())) == sorted(names), page
    assert {name for names in rt.PAGES.values() for name in names} == set(rt.render_blocks(studies))
    assert rt.PAGES[rt.README_PATH] == ("headline",)  # the README: one results table


def test_derived_numbers_come_from_the_raw_values(studies):
    import math

    blocks = rt.render_blocks(studies)
    # tokens/s ratio at 125m: 35 / 23 = 1.52 (the hand-written README had 1.58)
    assert "| 125m (batch 1 x 512) | 35 | - | 23 | 1.52 |" in blocks["bench-models"]
    # bits per byte = CE / ln 2, mean and population std from the per-seed CE
    ce = list(studies["ablate-tiny"]["models"]["J"]["ce_per_seed"].values())
    mean = sum(ce) / len(ce)
    std = math.sqrt(sum((c - mean) ** 2 for c in ce) / len(ce))
    assert f"| J | 1,008,208 | {mean / math.log(2):.4f} +- {std / math.log(2):.4f} |" in blocks["compare-tiny"]
    # RESOLVENT's MQAR mean and std from its three per-seed accuracies
    assert "59.0% +- 30.2 (50.8 / 26.8 / 99.5)" in blocks["compare-tiny"]
    # the decode ratio of the longest to the shortest context: 80.0 / 6.04
    assert "| GPT2 (key/value cache) | 6.04 | 9.25 | 80.0 | 13.2 | 60 MiB |" in blocks["bench-decode"]
    # the protocol's tokens/s: the mean of the three runs' own figures
    runs = [r["tokens_per_s"] for r in studies["protocol-tiny"]["runs"] if r["model"] == "MAMBA"]
    assert f"| {sum(runs) / 3:,.0f} |" in blocks["protocol-tiny"]


FIGURE_NAMES = ["compare-tiny", "protocol-scales", "zoology-l64", "zoology-l64-curves", "long-context-tiny"]


@pytest.mark.parametrize("name", FIGURE_NAMES)
def test_each_figure_was_drawn_from_the_committed_values_and_redraws_identically(studies, tmp_path, name):
    assert set(rt.FIGURES) == set(FIGURE_NAMES)
    assert rt.figure_is_current(studies, ROOT / rt.FIGURES[name][0], name)
    first, second = rt.render_figure(studies, name), rt.render_figure(studies, name)
    assert first == second and first[:8] == b"\x89PNG\r\n\x1a\n"
    path = tmp_path / "figure.png"
    path.write_bytes(first)
    assert rt.figures.png_text(path)[rt.figures.FIGURE_KEY] == "sha256:" + rt.figures.figure_source(studies, name)


@pytest.mark.parametrize("name", FIGURE_NAMES)
def test_a_change_to_a_figures_drawing_makes_its_png_stale(studies, monkeypatch, name):
    """The tag covers the drawing's source as well as its values: a PNG drawn by other code is not current."""
    path = ROOT / rt.FIGURES[name][0]
    assert rt.figure_is_current(studies, path, name)
    source = rt.figures.drawing_source(name)
    drmlab_function = rt.FIGURES[name][3].split(":")[1]
    assert f"def {drmlab_function}(" in source and "def _draw_" in source  # this tool's function and drmlab's
    monkeypatch.setattr(rt.figures, "drawing_source", lambda n: source.replace("(", "( ", 1))
    assert not rt.figure_is_current(studies, path, name)


def test_the_scales_figure_draws_every_preset_with_a_finished_model(studies):
    from drmlab.experiments.ablate.scales import finished_models

    points = rt.figures.figure_inputs(studies, "protocol-scales")["points"]
    assert {p["scale"] for pts in points.values() for p in pts} == {
        preset for preset, record in rt.tables.protocol_records(studies).items() if finished_models(record)
    }
    assert [p["scale"] for p in points["J"]] == ["micro", "tiny", "small"]  # smallest first, as the x axis
    assert points["J"][1] == {
        "scale": "tiny",
        "params": 1008208,
        "bpb_mean": studies["protocol-tiny"]["models"]["J"]["bpb_mean"],
        "bpb_std": studies["protocol-tiny"]["models"]["J"]["bpb_std"],
    }


def test_a_protocol_still_running_names_the_models_it_has_not_finished(studies):
    record = json.loads(json.dumps(studies["protocol-tiny"]))
    del record["models"]["GPT2"], record["models"]["MAMBA"]
    table = rt.tables._protocol_table({"protocol-tiny": record})
    assert "| still training: MAMBA, GPT2 |" in table and "| J |" in table


def test_check_names_a_hand_edited_table_number_and_write_restores_it(tmp_path):
    root = _copy_repo_files(tmp_path)
    results = (root / rt.RESULTS_PATH).read_text()
    edited = results.replace("| 35 | - | 23 | 1.52 |", "| 35 | - | 23 | 1.58 |")
    assert edited != results
    (root / rt.RESULTS_PATH).write_text(edited)
    problems = rt.check(root)
    assert len(problems) == 1 and problems[0].startswith("docs/results.md block bench-models:")
    assert rt.write(root) == ["docs/results.md: bench-models"]
    assert (root / rt.RESULTS_PATH).read_text() == results
    assert rt.check(root) == []


def test_a_table_on_the_wrong_page_is_named_and_not_written(tmp_path):
    root = _copy_repo_files(tmp_path)
    readme = (root / "README.md").read_text()
    (root / "README.md").write_text(readme + "\n<!-- generated: bench-decode -->\n<!-- end generated -->\n")
    assert rt.check(root) == ["README.md block bench-decode: not a table of this page"]
    with pytest.raises(ValueError, match="README.md must hold the tables headline; it holds bench-decode"):
        rt.write(root)


def test_a_changed_study_value_flows_into_table_and_figure(tmp_path):
    root = _copy_repo_files(tmp_path)
    path = root / "docs" / "studies" / "mqar-tiny" / "results.json"
    study = json.loads(path.read_text())
    study["models"]["GPT2"]["acc_mean"] = 26.5
    path.write_text(json.dumps(study))
    problems = rt.check(root)
    assert any(p.startswith("docs/results.md block compare-tiny:") for p in problems)
    assert any(p.startswith("docs/results-in-full.md block compare-tiny:") for p in problems)
    assert any(p.startswith("figure ") for p in problems)
    assert sorted(rt.write(root)) == sorted(
        ["docs/results.md: compare-tiny", "docs/results-in-full.md: compare-tiny", str(rt.figures.FIGURE_PATH)]
    )
    assert rt.check(root) == []
    assert "| 26.5% +- 0.3 |" in (root / rt.RESULTS_PATH).read_text()


def test_a_changed_per_seed_value_flows_into_the_protocol_table(tmp_path):
    root = _copy_repo_files(tmp_path)
    path = root / "docs" / "studies" / "protocol-tiny" / "results.json"
    study = json.loads(path.read_text())
    study["models"]["GPT2"]["per_seed"]["1"] += 0.01
    path.write_text(json.dumps(study))
    assert [p.split(":")[0] for p in rt.check(root)] == [
        "README.md block headline",
        "docs/results.md block protocol-tiny",
        "docs/results-in-full.md block protocol-tiny",
    ]


def test_check_reports_a_record_without_provenance(tmp_path):
    root = _copy_repo_files(tmp_path)
    path = root / "docs" / "studies" / "bench-decode" / "results.json"
    study = json.loads(path.read_text())
    del study["provenance"]["commit"]
    path.write_text(json.dumps(study))
    assert rt.check(root) == ["docs/studies/bench-decode/results.json: missing provenance.commit"]


def test_every_record_names_its_command_commit_and_date(studies):
    assert len(studies) >= 20
    for name, study in studies.items():
        assert rt.missing_fields(study) == [], name
        prov = study["provenance"]
        assert isinstance(prov["command"], str) and prov["command"].strip(), name
        assert re.fullmatch(r"[0-9a-f]{7,40}", prov["commit"]), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", prov["date"]), name


def test_no_record_names_a_machine_path_or_who_ran_it():
    words = re.compile(r"/work|/root|/home|/tmp|/Users|session|agent|claude|helper|engineer", re.IGNORECASE)
    for path in sorted((ROOT / "docs" / "studies").rglob("*")):
        if path.is_file():
            found = words.findall(path.read_text())
            assert not found, f"{path.relative_to(ROOT)}: {sorted(set(found))}"


# bytes; 310 KiB in use before the studies at preset small (protocol, capacity, Zoology), 551 KiB with
# them and micro at 256-byte windows (a protocol record with its curves is about 60 KiB): room for the
# Zoology record at length 64 and a few protocol records more; 804 KiB with the field recipe's protocol
# complete (24 runs, about 140 KiB) and the long-context study (about 40 KiB): room for the token axis and
# the field recipe at small
STUDY_DATA_BUDGET = 960 * 1024


def test_the_committed_study_data_stays_small():
    """studies/ is the untracked working area; the committed results are docs/studies, under
    :data:`STUDY_DATA_BUDGET` in all (a size, not a line count: a line count would reward writing the same
    numbers on fewer lines)."""
    listed = subprocess.run(
        ["git", "ls-files", "studies", "docs/studies"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = listed.stdout.split()
    assert files and not [f for f in files if f.startswith("studies/")]
    size = sum((ROOT / f).stat().st_size for f in files if (ROOT / f).is_file())
    assert size < STUDY_DATA_BUDGET, f"{size:,} bytes of committed study data (budget {STUDY_DATA_BUDGET:,})"


def test_the_tool_is_not_part_of_the_package():
    from drmlab.cli import VERBS

    assert "readme" not in VERBS
    assert not (ROOT / "src" / "drmlab" / "cli" / "readme.py").exists()
    assert not (ROOT / "src" / "drmlab" / "experiments" / "readme_tables.py").exists()


def test_the_float32_check_sets_each_model_beside_its_fast_run_at_the_same_seed_and_rate(studies):
    without = {name: record for name, record in studies.items() if name != "protocol-small-fp32"}
    assert "| not run yet |" in rt.tables._precision_table(without)  # before a float32 record is committed
    fast = studies["protocol-small"]
    j = next(r for r in fast["runs"] if r["model"] == "J" and r["seed"] == 1)
    plain = {
        "study": {"models": ["J", "GPT2"], "seeds": [1]},
        "models": {"J": {"lr": fast["models"]["J"]["lr"]}},
        "runs": [dict(j, val_bpb=j["val_bpb"] + 0.0125, tokens_per_s=1234.0)],
    }
    table = rt.tables._precision_table({"protocol-small": fast, "protocol-small-fp32": plain})
    assert (
        f"| J | 4e-3 | 1 | {j['val_bpb']:.4f} | {j['val_bpb'] + 0.0125:.4f} | -0.0125 | "
        f"{j['tokens_per_s']:,.0f} / 1,234 |" in table
    )
    assert "| GPT2 | - | 1 | - | - | - | - |" in table  # not run in both yet
    plain["models"]["J"]["lr"] = 1e-3  # a float32 run at another rate is no check of precision
    with pytest.raises(ValueError, match="J ran at another rate"):
        rt.tables._precision_table({"protocol-small": fast, "protocol-small-fp32": plain})


def test_the_window_table_reads_each_turned_pair_against_the_preset_it_sides_with(studies):
    """Known answers from the committed records: a 'longer window' record equal to tiny's gives tiny's verdict
    on every pair the two presets judge differently (the window), one equal to micro's keeps micro's (not the
    window); the pairs the presets agree on read the same either way."""
    without = {name: record for name, record in studies.items() if name != "protocol-micro-ctx256"}
    assert "| not run yet: protocol-micro-ctx256 |" in rt.tables._window_table(without)
    assert "| not run yet |" in rt.tables._protocol_table(without, name="protocol-micro-ctx256")
    assert "| not run yet |" in rt.tables._protocol_sweep_table(without, name="protocol-micro-ctx256")
    scales = rt.tables._scales_table({k: v for k, v in studies.items() if k in ("protocol-micro", "protocol-tiny")})
    across = {
        line.split(" | ")[0].strip("| "): line.rsplit(" | ", 1)[1].strip(" |") for line in scales.splitlines()[2:]
    }
    from drmlab.experiments.ablate.scales import WINDOW_READINGS

    for stand_in, turned in (("protocol-tiny", "window"), ("protocol-micro", "not the window")):
        table = rt.tables._window_table(dict(without, **{"protocol-micro-ctx256": studies[stand_in]}))
        reading = {
            line.split(" | ")[0].strip("| "): line.rsplit(" | ", 1)[1].strip(" |") for line in table.splitlines()[2:]
        }
        assert set(reading) == set(across) and len(reading) == 15
        for pair in reading:
            assert reading[pair] == WINDOW_READINGS[turned if across[pair] != "holds" else "same"], pair


def test_the_zoology_table_names_the_protocol_and_the_epochs_each_cell_trained(studies):
    import copy

    without = {name: record for name, record in studies.items() if name != "zoology-l64"}
    assert "| not run yet |" in rt.tables._zoology_table(without, name="zoology-l64")
    record = copy.deepcopy(studies["zoology-cpu"])
    record["cells"]["ATTENTION w64 L64"]["epochs"] = 8
    table = rt.tables._zoology_table({"zoology-l64": record}, name="zoology-l64")
    assert table.splitlines()[0].startswith("| model (Zoology protocol at CPU budget) |")  # 16 of Zoology's 64 epochs
    assert "| ATTENTION | 99.2% (lr 0.01, 8 epochs); 2 of 4 rates |" in table
    assert "| Zoology Fig. 2, attention (by eye) | 0.97-0.99 |" in table  # the paper's value above every row
    cell = record["cells"]["ATTENTION w64 L64"]
    for status, scores, acc, shown in (  # a study still running: the probe's progress, not a verdict
        ("incomplete", {"0.01": 0.23, "0.002": 0.26}, None, "probing: 2 of 4 rates"),
        ("incomplete", dict.fromkeys(("a", "b", "c", "d"), 0.2), None, "probed, lr 0.01 training on"),
        ("done", dict.fromkeys(("a", "b", "c", "d"), 0.2), None, "diverged"),  # the chosen rate, after its probe
        ("incomplete", {"0.01": None}, None, "diverged; 1 of 4 rates"),
    ):
        cell.update(status=status, scores=scores, acc=acc)
        assert f"| ATTENTION | {shown} |" in rt.tables._zoology_table({"zoology-l64": record}, name="zoology-l64")
    record["study"]["recipe"]["epochs"] = 64  # Zoology's own budget, no probe: the protocol as published
    assert rt.tables._zoology_table({"zoology-l64": record}, name="zoology-l64").startswith(
        "| model (Zoology protocol) |"
    )
