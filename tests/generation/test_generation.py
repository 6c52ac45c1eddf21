"""drmlab.generate: the parallel prefill ends in exactly the state stepping reaches, so prefill +
decode equals pure stepping for every model; seeds reproduce; sampling rules."""

import dataclasses

import pytest
import torch

from drmlab.data import get_tokenizer
from drmlab.generation import generate, prefill, sample_next
from drmlab.models import build_model, list_models

# every registered model at its defaults, and the settings whose decode state differs from them
PREFILL_CASES = [(name, {}) for name in list_models()] + [
    ("J", dict(block_solver="fixed_point", solver_iters=3)),
    ("J", dict(block_solver="anderson", solver_iters=3, anderson_history=2)),
    ("J", dict(step_mode="candidate")),
    ("A", dict(step_mode="geodesic", block_solver="fixed_point", solver_iters=2)),
    ("B", dict(sequence_mode="recurrent", mixer="none")),
    ("LOOPED", dict(arm="HE")),
    ("LOOPED", dict(arm="MC")),
    ("LOOPED", dict(arm="H4", positions="none")),
    ("LOOPED", dict(arm="HC", ssm_variant="mamba")),
    ("LOOPED", dict(arm="MC4", ssm_variant="mamba")),
    ("RESOLVENT", dict(gate_phase=True)),
    # variable rank (docs/variable-rank.md): a fixed rank, masked and sliced
    ("ASM_VR_S", dict(rank_policy="fixed", rank_fixed=6)),
    ("ASM_VR_R", dict(rank_policy="fixed", rank_fixed=6, rank_compute="sliced")),
    ("ASM_CM_VR", dict(rank_policy="fixed", rank_fixed=5, rank_compute="sliced")),
]


def _case_id(case):
    name, overrides = case
    return name + "".join(f"-{k}={v}" for k, v in overrides.items())


def _leaves(state, path="state"):
    """(path, leaf) for every tensor, number or None in a decoding state, with each container's
    type and length as a leaf of its own (so the two states must have one structure)."""
    if state is None or isinstance(state, (torch.Tensor, int, float, str)):
        yield path, state
    elif dataclasses.is_dataclass(state):
        yield path, type(state).__name__
        for f in dataclasses.fields(state):
            yield from _leaves(getattr(state, f.name), f"{path}.{f.name}")
    elif isinstance(state, (tuple, list)):
        yield path, f"{type(state).__name__}[{len(state)}]"
        for i, item in enumerate(state):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        raise TypeError(f"{path}: unexpected {type(state).__name__} in a decoding state")


def _assert_same_state(got, want, tol):
    got, want = list(_leaves(got)), list(_leaves(want))
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, path
            scale = max(1.0, b[b.isfinite()].abs().max().item()) if b.isfinite().any() else 1.0
            torch.testing.assert_close(a, b, rtol=0, atol=tol * scale, msg=path)
        else:
            assert a == b, path


@pytest.mark.parametrize("length", [5, 16, 22])  # micro blocks are 8 long: mid-block, on an edge, past two
@pytest.mark.parametrize("case", PREFILL_CASES, ids=_case_id)
def test_parallel_prefill_reaches_the_stepped_state(case, length, monkeypatch):
    """One parallel forward (never ``step``) gives the stepped logits and the stepped state, and
    decoding continues identically from both (float64)."""
    name, overrides = case
    model = build_model(name, preset="micro", seed=0, **overrides).double().eval()
    tokens = torch.randint(0, 256, (2, length + 4), generator=torch.Generator().manual_seed(length))
    prompt, continuation = tokens[:, :length], tokens[:, length:]
    tol = 1e-10
    with torch.no_grad():
        stepped = model.init_state(2)
        for t in range(length):
            stepped_logits, stepped = model.step(prompt[:, t], stepped)
        with monkeypatch.context() as patch:
            patch.setattr(model, "step", lambda *a, **k: pytest.fail("prefill stepped through the prompt"))
            logits, state = prefill(model, prompt)
        scale = max(1.0, stepped_logits.abs().max().item())
        assert (logits - stepped_logits).abs().max() <= tol * scale
        _assert_same_state(state, stepped, tol)
        for t in range(continuation.shape[1]):
            a, state = model.step(continuation[:, t], state)
            b, stepped = model.step(continuation[:, t], stepped)
            assert (a - b).abs().max() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("name", list_models())
def test_prefill_then_decode_equals_pure_stepping(name):
    model = build_model(name, preset="micro", seed=0).double().eval()
    tok = get_tokenizer("bytes")
    prompt = "def f(x):\n    return x"  # 22 bytes: crosses micro block edges
    a = generate(model, tok, prompt, max_new_tokens=8, temperature=0.8, seed=3, keep_logits=True)
    b = generate(model, tok, prompt, max_new_tokens=8, temperature=0.8, seed=3, keep_logits=True, use_prefill=False)
    assert a.new_tokens == b.new_tokens
    for x, y in zip(a.logits, b.logits):
        assert (x - y).abs().max() <= 1e-10


@pytest.mark.parametrize("name", ["J", "J_NO_DIRECTION", "SSM_CONTROL", "G"])
def test_fused_step_decodes_the_same_text(name):
    """generate(fused_step=True) decodes by step_fused: the same tokens, logits equal to 1e-12 in float64
    (G has no fused form: there it is the exact step, bit for bit)."""
    model = build_model(name, preset="micro", seed=0).double().eval()
    tok = get_tokenizer("bytes")
    prompt = "def f(x):\n    return x"
    a = generate(model, tok, prompt, max_new_tokens=12, temperature=0.8, seed=3, keep_logits=True)
    b = generate(model, tok, prompt, max_new_tokens=12, temperature=0.8, seed=3, keep_logits=True, fused_step=True)
    assert a.new_tokens == b.new_tokens
    for x, y in zip(a.logits, b.logits):
        assert (x - y).abs().max() <= 1e-12 * max(1.0, x.abs().max().item())
        assert name != "G" or torch.equal(x, y)


def test_fused_step_needs_a_model_with_one():
    model = build_model("GPT2", preset="micro").eval()
    with pytest.raises(ValueError, match="fused_step"):
        generate(model, get_tokenizer("bytes"), "x", max_new_tokens=2, fused_step=True)


def test_prefill_logits_equal_the_parallel_forward():
    model = build_model("J", preset="micro", seed=1).double().eval()
    tokens = torch.randint(0, 256, (2, 21))
    with torch.no_grad():
        logits, _ = prefill(model, tokens)
        assert (logits - model(tokens).logits[:, -1]).abs().max() <= 1e-10


def test_same_seed_same_text_and_streaming():
    model = build_model("J", preset="micro", seed=2).eval()
    tok = get_tokenizer("bytes")
    pieces = []
    a = generate(model, tok, "hello", max_new_tokens=20, seed=7, on_text=pieces.append)
    b = generate(model, tok, "hello", max_new_tokens=20, seed=7)
    c = generate(model, tok, "hello", max_new_tokens=20, seed=8)
    assert a.new_tokens == b.new_tokens and a.new_tokens != c.new_tokens
    assert "".join(pieces) == tok.decode(a.new_tokens)
    assert a.tokens_per_s > 0


def test_sampling_rules():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 5.0, 1.0, -2.0]])
    assert sample_next(logits, gen, temperature=0).item() == 1
    draws = {sample_next(logits, gen, temperature=1.0, top_k=1).item() for _ in range(20)}
    assert draws == {1}
    draws = {sample_next(logits, gen, temperature=5.0, top_p=0.5).item() for _ in range(50)}
    assert draws <= {1, 2} and 1 in draws
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, gen, top_p=0.0)


def test_bad_prompts():
    model = build_model("J", preset="micro").eval()
    with pytest.raises(ValueError, match="no tokens"):
        generate(model, get_tokenizer("bytes"), "")

    class WideTokenizer:
        name = "wide"

        def encode(self, text):
            return [300]

    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, WideTokenizer(), "x")


def test_generate_cli_reproduces_and_refuses_foreign_checkpoints(tmp_path, capsys, monkeypatch):
    from drmlab.cli import main

    monkeypatch.setenv("DRMLAB_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i}" for i in range(400)))
    run = tmp_path / "run"
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
            ]
        )
        == 0
    )
    capsys.readouterr()
    outputs = []
    for _ in range(2):
        assert main(["generate", "--ckpt", str(run), "--prompt", "def f(", "--max-tokens", "16", "--seed", "4"]) == 0
        captured = capsys.readouterr()
        outputs.append(captured.out)
        assert "tok/s" in captured.err
    assert outputs[0] == outputs[1] and outputs[0].startswith("def f(")
    fused = ["generate", "--ckpt", str(run), "--prompt", "def f(", "--max-tokens", "16", "--seed", "4", "--fused-step"]
    assert main(fused) == 0
    assert capsys.readouterr().out == outputs[0]  # round-off does not move a draw here
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "pytorch_model.bin").write_bytes(b"not ours")
    assert main(["generate", "--ckpt", str(foreign), "--prompt", "x"]) == 2
    assert "not a run directory" in capsys.readouterr().err
