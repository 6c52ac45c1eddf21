"""Looped models at another loop count (docs/looped.md section 4.1): ``LoopedLM.set_loop_count`` and
``drmlab loop-study --eval-loops``."""

from __future__ import annotations

import json

import pytest
import torch

from drmlab.cli import main
from drmlab.experiments.loop.study import parse_loop_counts
from drmlab.models import build_model


def _tokens(length=12):
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))


def _stepped(model, tokens):
    state, outputs = model.init_state(tokens.shape[0]), []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("arm", ["C", "H", "HE", "D"])
def test_trained_loop_count_with_frozen_eps_is_the_same_model_bitwise(arm):
    model = build_model("LOOPED", "micro", seed=1, arm=arm).eval()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    tokens = _tokens()
    with torch.no_grad():
        trained = model(tokens).logits
        n = model.config.n_loop
        assert model.set_loop_count(4, "1/N") is model and model.eps == 0.25
        assert not torch.equal(model(tokens).logits, trained)
        model.set_loop_count(n, "frozen")
        assert torch.equal(model(tokens).logits, trained)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(p, before[name]) for name, p in model.state_dict().items())


def test_another_loop_count_is_the_model_built_at_that_count_with_the_same_weights():
    trained = build_model("LOOPED", "micro", seed=2, arm="C").double().eval()  # L = 6, N = 2, eps = 1/2
    tokens = _tokens()
    for eps, value in (("frozen", 0.5), ("1/N", 0.125), (0.3, 0.3)):
        reference = build_model("LOOPED", "micro", seed=0, arm="C", n_loop=8, eps=value).double().eval()
        reference.load_state_dict(trained.state_dict())
        trained.set_loop_count(8, eps)
        assert trained.eps == value and len(trained.order) == 6 * 8
        with torch.no_grad():
            out = trained(tokens).logits
            assert torch.equal(out, reference(tokens).logits)
            assert (_stepped(trained, tokens) - out).abs().max() <= 1e-12  # decoding follows the new count
    # the learnable per-block scales are parameters: they keep their trained values at any count
    learnable = build_model("LOOPED", "micro", seed=3, arm="H")
    with torch.no_grad():
        for block in learnable.blocks:
            block.lam.fill_(1.7)
    learnable.set_loop_count(5, "1/N")
    assert learnable.config.has_learnable_scale and learnable.eps == 0.2
    assert all(
        block.lam.item() == pytest.approx(1.7) and block.scale(learnable.eps).item() == pytest.approx(0.34)
        for block in learnable.blocks
    )


def test_frozen_means_the_trained_eps_and_bad_counts_are_refused():
    model = build_model("LOOPED", "micro", arm="E2")  # 3 x 4, eps = 1/sqrt(N) = 0.5
    model.set_loop_count(16, "1/sqrt(N)")
    assert model.eps == 0.25
    model.set_loop_count(2, "frozen")
    assert model.eps == 0.5  # the trained value, not the last one set
    with pytest.raises(ValueError, match="vanilla stack"):
        build_model("LOOPED", "micro", arm="A").set_loop_count(2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive integer"):
            model.set_loop_count(bad)
    with pytest.raises(ValueError, match="eps must be"):
        model.set_loop_count(2, "1/M")
    assert parse_loop_counts("2, 4,16") == [2, 4, 16] and parse_loop_counts([1, 3]) == [1, 3]
    for bad in ("2,x", "0", "2,2", "", "2,-4"):
        with pytest.raises(ValueError, match="eval_loops"):
            parse_loop_counts(bad)


def test_loop_study_eval_loops_rescores_every_arm_at_every_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"for i in range({i}):\n    total += i * {i}" for i in range(300)))
    out = tmp_path / "study"
    args = [
        "loop-study",
        "--arms",
        "C,A",
        "--seeds",
        "1",
        "--preset",
        "micro",
        "--tokens",
        "512",
        "--data",
        str(text),
        "--out",
        str(out),
        "--quiet",
        "--eval-tokens",
        "256",
        "--eval-loops",
        "2,4",
    ]
    assert main(args) == 0
    printed = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    loops = results["eval_loops"]
    assert loops["loop_counts"] == [2, 4] and loops["eps_modes"] == ["frozen", "1/N'"]
    assert loops["arms"]["A"]["applicable"] is False and "vanilla" in loops["arms"]["A"]["reason"]
    c = loops["arms"]["C"]
    assert c["n_loop"] == 2 and c["eps_trained"] == 0.5
    cells = {(cell["n_loop"], cell["eps_mode"]): cell for cell in c["cells"]}
    assert set(cells) == {(2, "frozen"), (2, "1/N'"), (4, "frozen"), (4, "1/N'")}
    assert [cells[k]["eps"] for k in sorted(cells)] == [0.5, 0.5, 0.25, 0.5]  # (2, 1/N'), (2, fr), (4, 1/N'), (4, fr)
    # at the trained count with eps frozen the rescoring is exactly each run's own final evaluation
    assert (
        cells[(2, "frozen")]["per_seed"]["1"] == results["models"]["C"]["per_seed"]["1"] == c["trained_per_seed"]["1"]
    )
    assert c["run_val_ce_per_seed"]["1"] == c["trained_per_seed"]["1"] and cells[(2, "frozen")]["ce_std"] == 0.0
    assert cells[(4, "frozen")]["ce_mean"] != cells[(4, "1/N'")]["ce_mean"]
    for report in ((out / "loop.md").read_text(), (out / "results.md").read_text(), printed.out):
        assert "## Loop count at evaluation" in report and "| C | 2 | 0.5 | frozen (trained) |" in report
        assert "| A | 1 | 1.0 | not applicable" in report
    assert (out / "eval_loops.png").stat().st_size > 0
    assert "eval-loops C seed 1: N' in 2, 4, 4 cells and the trained N = 2: 3 rescored" in printed.err
    # a rerun reads every score from the per-run cache
    assert main(args) == 0
    assert "the trained N = 2: 0 rescored" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["eval_loops"] == loops
