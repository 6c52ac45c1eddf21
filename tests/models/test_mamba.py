"""The MAMBA family: equality with Hugging Face's MambaForCausalLM, causality, parameter counts, seeding and bad input.

(Stepping equals the parallel forward for every registered model: tests/models/test_step_equivalence.py.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drmlab.models import build_model
from drmlab.models.mamba import (
    PRESET_DIMS,
    MambaConfig,
    MambaLM,
    closed_form_parameter_count,
    config_from_hf,
    load_hf_state_dict,
)

# Pinned parameter counts at vocab 256 (module docstring of drmlab.models.mamba).
COUNTS = {"micro": 24_368, "tiny": 1_008_520, "small": 10_215_040, "125m": 126_941_184}
J_COUNTS = {"micro": 24_184, "tiny": 1_008_208, "small": 10_203_504, "125m": 126_080_896}


def _params(model):
    return sum(p.numel() for p in model.parameters())


def _hf_pair(tie=True, seed=0):
    """A small random MambaForCausalLM (every parameter perturbed away from its init, so D,
    the conv bias and A_log are all exercised) and our model holding the same weights."""
    import transformers

    cfg = transformers.MambaConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        state_size=8,
        conv_kernel=4,
        expand=2,
        use_cache=False,
        tie_word_embeddings=tie,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = transformers.MambaForCausalLM(cfg)
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(0.1 * torch.randn_like(p))
    ours = load_hf_state_dict(MambaLM(config_from_hf(cfg, scan_chunk=5)), hf.state_dict())
    return hf, ours


@pytest.mark.parametrize("tie", [True, False])
def test_logits_equal_hugging_face(tie):
    hf, ours = _hf_pair(tie=tie)
    hf.eval(), ours.eval()
    tokens = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=tokens, use_cache=False).logits
        got = ours(tokens).logits
    assert got.shape == ref.shape == (2, 37, 256)
    assert (got - ref).abs().max() <= 1e-5 * max(1.0, ref.abs().max().item())
    assert (ours.lm_head is None) == tie


def test_gradients_equal_hugging_face():
    hf, ours = _hf_pair(seed=1)
    hf.train(), ours.train()
    tokens = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(2))
    loss_ref = torch.nn.functional.cross_entropy(
        hf(input_ids=tokens[:, :-1], use_cache=False).logits.reshape(-1, 256), tokens[:, 1:].reshape(-1)
    )
    loss = torch.nn.functional.cross_entropy(ours(tokens[:, :-1]).logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
    loss_ref.backward()
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    ref = {k.removeprefix("backbone."): p.grad for k, p in hf.named_parameters()}
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_recompute_and_chunk_do_not_change_training():
    tokens = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(3))
    grads = []
    for overrides in ({}, {"scan_chunk": 3, "scan_recompute": True}, {"scan_chunk": 4}):
        model = build_model("MAMBA", "micro", seed=1, **overrides).double()
        model(tokens).logits.square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_prefix_causality_and_any_length():
    model = build_model("MAMBA", "micro", seed=0).eval()
    tokens = torch.randint(0, 256, (2, 3 * model.config.max_seq_len + 1), generator=torch.Generator().manual_seed(4))
    changed = tokens.clone()
    changed[:, 40] = (changed[:, 40] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens).logits, model(changed).logits
    assert a.shape == (2, tokens.shape[1], 256)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


@pytest.mark.parametrize("preset", list(PRESET_DIMS))
def test_parameter_counts(preset):
    with torch.device("meta"):
        model = build_model("MAMBA", preset, vocab_size=256)
    assert _params(model) == COUNTS[preset] == closed_form_parameter_count(model.config)
    assert abs(COUNTS[preset] / J_COUNTS[preset] - 1) <= 0.05
    assert model.config.max_seq_len == {"micro": 32, "tiny": 256, "small": 512, "125m": 512}[preset]
    if preset != "125m":  # the pinned J counts are still J's
        with torch.device("meta"):
            assert _params(build_model("J", preset, vocab_size=256)) == J_COUNTS[preset]


def test_seeded_init_and_interface():
    state = torch.get_rng_state()
    a = build_model("MAMBA", "micro", seed=3)
    b = build_model("MAMBA", "micro", seed=3)
    c = build_model("MAMBA", "micro", seed=4)
    assert torch.equal(state, torch.get_rng_state())  # building leaves the global RNG alone
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embeddings.weight, c.embeddings.weight)
    assert a.model_name == "MAMBA" and a.preset == "micro" and a.config.vocab_size == 256
    assert a.lm_head is None  # tied to the embedding
    out = a(torch.randint(0, 256, (3, 9)), step=7)
    assert out.logits.shape == (3, 9, 256) and out.aux == {}
    assert build_model("MAMBA", "micro", vocab_size=65).config.vocab_size == 65


def test_step_leaves_the_state_alone():
    model = build_model("MAMBA", "micro", seed=0).eval()
    with torch.no_grad():
        _, s1 = model.step(torch.tensor([3, 4]), model.init_state(2))
        saved = [t.clone() for t in s1.conv + s1.ssm]
        a, _ = model.step(torch.tensor([5, 6]), s1)
        b, _ = model.step(torch.tensor([5, 6]), s1)
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(saved, s1.conv + s1.ssm))


def test_bad_input():
    with pytest.raises(ValueError, match="did you mean 'd_state'"):
        build_model("MAMBA", "micro", d_stat=4)
    for field in ("d_model", "n_layer", "d_state", "d_conv", "expand", "max_seq_len"):
        with pytest.raises(ValueError, match=field):
            build_model("MAMBA", "micro", **{field: 0})
    with pytest.raises(ValueError, match="scan_chunk"):
        build_model("MAMBA", "micro", scan_chunk=-1)
    with pytest.raises(ValueError, match="dt_rank"):
        build_model("MAMBA", "micro", dt_rank=-1)
    with pytest.raises(ValueError, match="dt_min"):
        build_model("MAMBA", "micro", dt_min=0.5, dt_max=0.1)
    model = build_model("MAMBA", "micro", n_layer=1)
    assert model.config.n_layer == 1 and model.config.dt_rank == 1  # auto: ceil(16 / 16)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[1, 256]]))
    with pytest.raises(ValueError, match="rank 2"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\[batch\]"):
        model.step(torch.zeros(1, 1, dtype=torch.long), model.init_state(1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.step(torch.tensor([-1]), model.init_state(1))
    assert dataclasses.replace(MambaConfig(), dt_rank=0).validate().dt_rank == 10  # ceil(152 / 16)
