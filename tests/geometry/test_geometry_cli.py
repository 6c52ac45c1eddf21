"""``drmlab geometry`` end to end on a micro run trained for a few steps, and the model adapter."""

from __future__ import annotations

import json

import pytest
import torch

from drmlab.geometry.topology import have_gudhi


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    from drmlab.cli import main

    root = tmp_path_factory.mktemp("geometry")
    text = root / "corpus.txt"
    text.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i} + {i % 7}" for i in range(400)))
    run = root / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("DRMLAB_CACHE", str(root / "cache"))
    try:
        assert (
            main(
                [
                    "train",
                    "--model",
                    "J",
                    "--preset",
                    "micro",
                    "--tokens",
                    "1024",
                    "--data",
                    str(text),
                    "--out",
                    str(run),
                    "--quiet",
                    "--eval-tokens",
                    "256",
                    "--threads",
                    "1",
                ]
            )
            == 0
        )
        yield run, text, mp
    finally:
        mp.undo()


def test_the_verb_writes_json_tables_and_plots(micro_run, capsys):
    from drmlab.cli import main

    run, text, _ = micro_run
    assert main(["geometry", "--ckpt", str(run), "--tokens", "64", "--threads", "1", "--data", str(text)]) == 0
    out = capsys.readouterr().out
    folder = run / "geometry"
    record = json.loads((folder / "geometry.json").read_text())
    expected = {"metric", "pullback", "strata", "agreement", "connection", "geodesics"} | (
        {"topology"} if have_gudhi() else set()
    )
    assert set(record["instruments"]) == expected
    assert all(r["seconds"] >= 0 for r in record["instruments"].values())
    assert record["instruments"]["metric"]["exact_rank"] == [16]  # positive floor: full rank
    assert record["instruments"]["metric"]["pinv_vs_woodbury_max_rel"] < 1e-12
    assert record["instruments"]["pullback"]["how"].startswith("exact")
    geo = record["instruments"]["geodesics"]["blocks"][0]
    assert (geo["action_ratio"] is None) == (not geo["geodesic"]["converged"])
    assert geo["action_ratio"] is None or geo["action_ratio"] >= 1.0
    tables = (folder / "tables.md").read_text()
    assert "## Decoder pullback metric" in tables and "(approx.)" in tables
    assert (folder / "spectra.png").stat().st_size > 0 and (folder / "energies.png").is_file()
    assert "written to" in out


def test_a_model_without_a_metric_gets_one_line_naming_what_does_not_apply():
    from drmlab.geometry.run import GeometryBudget, geometry_of_model
    from drmlab.models import build_model

    model = build_model("SSM_CONTROL", preset="micro").to(torch.float64).requires_grad_(False).eval()
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    record = geometry_of_model(model, tokens, GeometryBudget(topology_resamples=2))
    assert {"metric", "agreement", "connection", "geodesics"} <= set(record["not_applicable"])
    assert "pullback" in record["instruments"] and "strata" in record["instruments"]
    assert len(record["notes"]) == 1 and record["notes"][0].startswith(
        "not applicable: metric (SSM_CONTROL has no learned metric)"
    )


def test_a_large_vocabulary_uses_the_estimator_and_the_record_says_so():
    from drmlab.geometry.run import GeometryBudget, geometry_of_model
    from drmlab.models import build_model

    model = build_model("J", preset="micro").to(torch.float64).requires_grad_(False).eval()
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    record = geometry_of_model(
        model, tokens, GeometryBudget(max_exact_vocab=100, estimator_samples=8), only=("pullback",)
    )
    assert record["instruments"]["pullback"]["how"].startswith("estimated: the vocabulary (256) is above 100")
    assert any(note.startswith("estimated") for note in record["notes"])


def test_a_model_outside_the_family_is_refused_in_one_line():
    from drmlab.geometry.model_adapter import model_view

    with pytest.raises(ValueError, match="Linear is not a DRM-family model: .* none of metric, strata"):
        model_view(torch.nn.Linear(2, 2), torch.zeros(1, 4, dtype=torch.long))


def test_a_missing_run_is_one_line(tmp_path, capsys):
    from drmlab.cli import main

    assert main(["geometry", "--ckpt", str(tmp_path / "nothing"), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drmlab geometry: error:") and len(err.splitlines()) == 1


def test_the_adapter_reproduces_the_model_forward():
    from drmlab.geometry.model_adapter import model_view
    from drmlab.models import build_model

    model = build_model("J", preset="micro").to(torch.float64).eval()
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    view = model_view(model, tokens)
    logits = model(tokens).logits
    assert torch.allclose(view.logits_fn(view.states), logits, atol=1e-12)
    # block starts: z_0, then the last state of each block; the record's metric is the callable's at the starts
    states, record = model.states(tokens)
    assert torch.equal(view.block_starts[:, 1], states[:, model.config.block_size - 1])
    gamma, u = view.metric_fn(view.block_starts[0, 1])
    assert torch.allclose(gamma, record[1].gamma[0], atol=1e-14) and torch.allclose(
        u, record[1].u_factor[0], atol=1e-14
    )


def test_the_geodesic_budget_is_a_setting(micro_run, tmp_path, capsys):
    """--geodesic-hvp bounds the solve's Hessian-vector products; a budget below 1 is one line."""
    from drmlab.cli import main

    run, text, _ = micro_run
    argv = ["geometry", "--ckpt", str(run), "--tokens", "64", "--threads", "1", "--data", str(text)]
    assert main([*argv, "--geodesic-hvp", "3", "--out", str(tmp_path / "g")]) == 0
    geo = json.loads((tmp_path / "g" / "geometry.json").read_text())["instruments"]["geodesics"]["blocks"][0]
    assert geo["geodesic"]["hessian_vector_products"] <= 3
    capsys.readouterr()
    assert main([*argv, "--geodesic-hvp", "0", "--out", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--geodesic-hvp must be at least 1" in err and len(err.splitlines()) == 1
