"""drmlab.generate: prefill + decode equals pure stepping; seeds reproduce; sampling rules."""

import pytest
import torch

from drmlab.data import get_tokenizer
from drmlab.generation import generate, prefill, sample_next
from drmlab.models import build_model, list_models


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
    assert main(["train", "--model", "J", "--preset", "micro", "--tokens", "1024", "--data", str(text),
                 "--out", str(run), "--quiet", "--eval-tokens", "256"]) == 0
    capsys.readouterr()
    outputs = []
    for _ in range(2):
        assert main(["generate", "--ckpt", str(run), "--prompt", "def f(", "--max-tokens", "16", "--seed", "4"]) == 0
        captured = capsys.readouterr()
        outputs.append(captured.out)
        assert "tok/s" in captured.err
    assert outputs[0] == outputs[1] and outputs[0].startswith("def f(")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "pytorch_model.bin").write_bytes(b"not ours")
    assert main(["generate", "--ckpt", str(foreign), "--prompt", "x"]) == 2
    assert "not a run directory" in capsys.readouterr().err
