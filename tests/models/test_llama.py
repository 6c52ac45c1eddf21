"""The LLAMA baseline (Llama-style "Transformer++"): parameter counts against the closed form and DRM J,
the Hugging Face architecture, stepping past the training window, seeding and bad settings."""

from __future__ import annotations

import pytest
import torch

from drmlab.models import build_model, count_parameters
from drmlab.models.llama import PRESET_DIMS, LlamaSettings, closed_form_parameter_count
from drmlab.presets import PRESETS


def _stepped(model, tokens, state=None):
    state = model.init_state(tokens.shape[0]) if state is None else state
    logits = []
    for t in range(tokens.shape[1]):
        logits_t, state = model.step(tokens[:, t], state)
        logits.append(logits_t)
    return torch.stack(logits, 1), state


@pytest.mark.parametrize("preset", PRESETS)
def test_closed_form_count_equals_the_built_model(preset):
    with torch.device("meta"):
        model = build_model("LLAMA", preset, vocab_size=256)
    assert count_parameters(model) == closed_form_parameter_count(model.config)
    assert closed_form_parameter_count(LlamaSettings(**PRESET_DIMS[preset])) == count_parameters(model)
    if preset == "125m":
        assert count_parameters(model) == 126_145_152
        c = model.config
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (13, 896, 14, 2408)
        assert c.head_dim == 64 and c.max_seq_len == 512 and c.tie_word_embeddings


@pytest.mark.parametrize("preset", ["micro", "tiny", "small"])
def test_presets_match_j_within_1_percent(preset):
    with torch.device("meta"):
        j = count_parameters(build_model("J", preset, vocab_size=256))
        llama = count_parameters(build_model("LLAMA", preset, vocab_size=256))
    assert abs(llama / j - 1) <= 0.01, (preset, llama, j)


def test_the_hugging_face_architecture():
    """LlamaForCausalLM: RMSNorm, no biases, rotary (no position table), SwiGLU with silu, tied head,
    as many key/value heads as query heads, no dropout."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    model = build_model("LLAMA", "micro", seed=0)
    hf = model.hf
    assert isinstance(hf, LlamaForCausalLM) and model.has_position_limit is False
    names = [name for name, _ in hf.named_parameters()]
    assert not [name for name in names if name.endswith("bias")]
    assert not [name for name in names if "position" in name or "wpe" in name]  # rotary: no table
    assert hf.lm_head.weight is hf.model.embed_tokens.weight  # tied
    assert isinstance(hf.model.norm, LlamaRMSNorm) and hf.model.norm.variance_epsilon == 1e-5
    assert not any(isinstance(m, (torch.nn.LayerNorm, torch.nn.Dropout)) for m in hf.modules())
    config = hf.config
    assert config.num_key_value_heads == config.num_attention_heads == 2 and config.attention_dropout == 0.0
    assert config.hidden_act == "silu" and config.max_position_embeddings == 32
    rotary = hf.model.rotary_emb
    assert isinstance(rotary, LlamaRotaryEmbedding) and rotary.rope_type == "default"
    head_dim = 14
    want = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    torch.testing.assert_close(rotary.inv_freq, want)
    for layer in hf.model.layers:
        assert all(isinstance(n, LlamaRMSNorm) for n in (layer.input_layernorm, layer.post_attention_layernorm))
        mlp = layer.mlp
        assert (mlp.gate_proj.out_features, mlp.up_proj.out_features, mlp.down_proj.in_features) == (64, 64, 64)
        x = torch.randn(3, 28)
        swiglu = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(mlp(x), swiglu)
    assert hf.config._attn_implementation == "sdpa"
    assert build_model("LLAMA", "micro", attn_implementation="eager").hf.config._attn_implementation == "eager"


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_step_equals_forward_past_the_training_window(dtype, tol):
    """Rotary extrapolates: 2 * max_seq_len + 5 tokens, stepped one at a time from the empty state and
    from a prefilled one, give the parallel forward's logits."""
    model = build_model("LLAMA", "micro", seed=1).to(dtype).eval()
    length = 2 * model.config.max_seq_len + 5
    tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens).logits
        stepped, state = _stepped(model, tokens)
        torch.testing.assert_close(stepped, full, atol=tol, rtol=tol)
        assert state.length == length and state.layers[0][0].shape == (2, 2, length, 14)
        prefill = model(tokens[:, :40], return_state=True)
        torch.testing.assert_close(prefill.logits, full[:, :40], atol=tol, rtol=tol)
        rest, _ = _stepped(model, tokens[:, 40:], prefill.state)
        torch.testing.assert_close(rest, full[:, 40:], atol=tol, rtol=tol)
        # eager attention computes the same function (its softmax runs in float32 at any dtype)
        eager = build_model("LLAMA", "micro", seed=1, attn_implementation="eager").to(dtype).eval()
        torch.testing.assert_close(eager(tokens).logits, full, atol=1e-5, rtol=1e-5)


def test_a_step_leaves_the_state_it_was_given_alone():
    model = build_model("LLAMA", "micro", seed=0).eval()
    tokens = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        state = model(tokens, return_state=True).state
        keys = state.layers[0][0].clone()
        a, _ = model.step(tokens[:, 0], state)
        b, _ = model.step(tokens[:, 0], state)
    assert torch.equal(a, b) and torch.equal(state.layers[0][0], keys) and state.length == 6


def test_seeded_init_leaves_the_global_rng_alone():
    before = torch.get_rng_state()
    a = build_model("LLAMA", "micro", seed=3)
    b = build_model("LLAMA", "micro", seed=3)
    c = build_model("LLAMA", "micro", seed=4)
    assert torch.equal(before, torch.get_rng_state())  # building leaves the global RNG alone
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.hf.model.embed_tokens.weight, c.hf.model.embed_tokens.weight)
    assert a.model_name == "LLAMA" and a.preset == "micro" and a.config.vocab_size == 256
    assert build_model("LLAMA", "micro", vocab_size=65).hf.lm_head.out_features == 65


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="did you mean 'num_hidden_layers'"):
        build_model("LLAMA", "micro", num_hidden_layer=3)
    with pytest.raises(ValueError, match="did you mean 'rope_theta'"):
        build_model("LLAMA", "micro", rope_thetta=500.0)
    with pytest.raises(ValueError, match="divisible"):
        build_model("LLAMA", "micro", num_attention_heads=3)
    with pytest.raises(ValueError, match="must be even"):
        build_model("LLAMA", "micro", hidden_size=30, num_attention_heads=2)
    with pytest.raises(ValueError, match="attn_implementation"):
        build_model("LLAMA", "micro", attn_implementation="flash")
    with pytest.raises(ValueError, match="intermediate_size"):
        build_model("LLAMA", "micro", intermediate_size=0)
    model = build_model("LLAMA", "micro", num_hidden_layers=1, max_seq_len=8)
    assert len(model.hf.model.layers) == 1 and model(torch.zeros(1, 20, dtype=torch.long)).logits.shape == (1, 20, 256)
