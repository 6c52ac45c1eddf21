"""The README's study numbers are the committed results in docs/studies, rendered by the generator.

A hand edit of a generated table, of a number the prose quotes, or of the figure fails here; so does
a study file without its command and provenance. The generator is drmlab.experiments.readme_tables,
the verb ``drmlab readme``.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drmlab.cli import main
from drmlab.experiments import readme_tables as rt

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def studies() -> dict[str, dict]:
    return rt.load_studies(ROOT)


@pytest.fixture(scope="module")
def readme() -> str:
    return (ROOT / "README.md").read_text()


def _copy_repo_files(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs" / "studies", tmp_path / "docs" / "studies")
    shutil.copytree(ROOT / "docs" / "figures", tmp_path / "docs" / "figures")
    return tmp_path


def test_generated_blocks_equal_the_rendering_of_the_committed_studies(studies, readme):
    present = rt.find_blocks(readme)
    rendered = rt.render_blocks(studies)
    assert sorted(present) == sorted(rendered)
    for name, text in rendered.items():
        assert present[name] == text, f"README block {name} was edited by hand; run `drmlab readme --write`"


def test_every_number_the_prose_quotes_is_computed_from_the_studies_and_true(studies, readme):
    prose = " ".join(readme.split())
    for claim in rt.claims(studies):
        assert claim.holds, f"{claim.study}: no longer true: {claim.text}"
        assert " ".join(claim.text.split()) in prose, f"{claim.study}: README should say {claim.text!r}"


def test_every_study_file_names_its_command_measurement_and_provenance(studies):
    assert len(studies) >= 15
    for name, study in studies.items():
        assert rt.missing_fields(study) == [], name
        assert isinstance(study["command"], str) and study["command"].strip(), name
        assert isinstance(study["command_recorded"], bool), name
        assert study["measured_at"]["date"] and study["measured_at"]["commit"], name
        assert len(study["provenance"]) > 40, name


def test_the_figure_was_drawn_from_the_committed_values_and_redraws_identically(studies):
    figure = ROOT / rt.FIGURE_PATH
    assert rt.figure_is_current(studies, figure)
    first, second = rt.render_figure(studies), rt.render_figure(studies)
    assert first == second
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert rt.png_text(first)[rt.FIGURE_KEY] == b"sha256:" + rt.figure_source(studies).encode()


def test_derived_numbers_come_from_the_raw_values(studies):
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


def test_study_values_agree_with_the_code_and_with_each_other(studies):
    from drmlab.experiments.ablate.protocol import DEFAULT_TOKENS
    from drmlab.experiments.mqar.models import ANCHOR_ACC
    from drmlab.experiments.mqar.task import MQARTask
    from drmlab.presets import PRESET_DEFAULTS

    tiny = PRESET_DEFAULTS["tiny"]
    protocol = studies["ablate-tiny"]["protocol"]
    assert protocol["tokens_per_step"] == tiny["batch_size"] * tiny["grad_accum"] * tiny["seq_len"]
    assert float(protocol["lr"]) == tiny["lr"]
    assert protocol["full_budget"] == DEFAULT_TOKENS
    # the MQAR no-binding levels are the task's own
    p = studies["mqar-tiny"]["protocol"]
    task = MQARTask(kv=p["kv"], vocab_kv=p["vocab_kv"])
    levels = studies["mqar-tiny"]["levels"]
    assert levels == {"chance": task.chance, "context_guess": task.context_guess,
                      "elimination_guess": task.elimination_guess}
    reference = studies["mqar-anchor"]["study_reference"]
    assert reference == {"L4_ds64": ANCHOR_ACC[("L4_ds64", 4)], "L4u_ds64": ANCHOR_ACC[("L4u_ds64", 4)]}
    # the learning-rate probe's run at the preset's lr is GPT2's seed-1 run of the ablation
    probe = {r["lr"]: r["ce"] for r in studies["gpt2-lr-probe-tiny"]["runs"]}
    assert probe[tiny["lr"]] == studies["ablate-tiny"]["models"]["GPT2"]["ce_per_seed"]["1"]


def test_the_committed_proof5_table_is_what_the_proof_computes(studies):
    from drmlab.experiments.loop.proofs import proof5

    result = proof5()
    committed = studies["loop-proofs"]["proof5"]["rows"]
    # float64 to 1e-12, not bit for bit: numpy's vectorised exp and the BLAS differ in the last bit
    # between CPUs (AVX-512 or not); the committed digits came from one of them.
    assert [r["n"] for r in result.rows] == [r["n"] for r in committed]
    for got, want in zip(result.rows, committed):
        assert got == pytest.approx(want, rel=1e-12, abs=0), got["n"]
    assert result.verdict == studies["loop-proofs"]["verdicts"]["defaults"]["5"]


def test_check_names_a_hand_edited_table_number_and_write_restores_it(tmp_path):
    root = _copy_repo_files(tmp_path)
    readme = (root / "README.md").read_text()
    edited = readme.replace("| 35 | - | 23 | 1.52 |", "| 35 | - | 23 | 1.58 |")
    assert edited != readme
    (root / "README.md").write_text(edited)
    problems = rt.check(root)
    assert len(problems) == 1 and problems[0].startswith("block bench-models:")
    assert rt.write(root) == ["bench-models"]
    assert (root / "README.md").read_text() == readme
    assert rt.check(root) == []


def test_check_names_a_hand_edited_prose_number(tmp_path):
    root = _copy_repo_files(tmp_path)
    readme = (root / "README.md").read_text()
    (root / "README.md").write_text(readme.replace("(by 0.037, all 3 seeds", "(by 0.040, all 3 seeds"))
    problems = rt.check(root)
    assert len(problems) == 1 and "(by 0.037, all 3 seeds, promoted by the gate)" in problems[0]


def test_a_changed_study_value_flows_into_table_and_figure(tmp_path):
    root = _copy_repo_files(tmp_path)
    path = root / "docs" / "studies" / "mqar-tiny" / "results.json"
    study = json.loads(path.read_text())
    study["models"]["GPT2"]["acc_mean"] = 26.5
    path.write_text(json.dumps(study))
    problems = rt.check(root)
    assert any(p.startswith("block compare-tiny:") for p in problems)
    assert any(p.startswith("figure ") for p in problems)
    assert sorted(rt.write(root)) == sorted(["compare-tiny", str(rt.FIGURE_PATH)])
    assert rt.check(root) == []
    assert "| 26.5% +- 0.3 |" in (root / "README.md").read_text()


def test_check_reports_a_study_file_without_provenance(tmp_path):
    root = _copy_repo_files(tmp_path)
    path = root / "docs" / "studies" / "bench-decode" / "results.json"
    study = json.loads(path.read_text())
    del study["provenance"]
    path.write_text(json.dumps(study))
    assert rt.check(root) == ["docs/studies/bench-decode/results.json: missing provenance"]


def test_the_verb_checks_the_repository(capsys):
    assert main(["readme", "--check", "--root", str(ROOT)]) == 0
    assert "match docs/studies" in capsys.readouterr().out


def test_the_verb_module_imports_nothing_heavy_and_the_generator_not_the_cli():
    verb = ("import sys, drmlab.cli.readme; heavy = {'torch', 'numpy', 'matplotlib'} & set(sys.modules); "
            "assert not heavy, heavy")
    generator = ("import sys, drmlab.experiments.readme_tables; "
                 "assert not [m for m in sys.modules if m.startswith('drmlab.cli')]")
    for code in (verb, generator):
        subprocess.run([sys.executable, "-c", code], check=True)
