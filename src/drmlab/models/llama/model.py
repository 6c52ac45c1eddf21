"""The Llama-style transformer baseline: Hugging Face ``LlamaForCausalLM`` behind the common model interface.

Registered as ``LLAMA``: the "Transformer++" of the Mamba, GLA, DeltaNet and Zoology papers, i.e.
Llama's block (Touvron et al. 2023) -- pre-norm RMSNorm (Zhang & Sennrich 2019), causal attention
with rotary positions on queries and keys (Su et al. 2021), a SwiGLU MLP ``down(silu(gate x) * up x)``
(Shazeer 2020) -- with no biases, no dropout, no grouped-query attention and the head tied to the
token embedding. The drmlab interface (the forward, never passing labels, decoding through the key/value
cache) is :class:`drmlab.models.layers.hf_causal_lm.HFCausalLM`'s.

Presets (:mod:`.config`, vocab 256) are matched in parameter count to DRM J at the same preset
(within 1%). Rotary positions have no table, so ``max_seq_len`` is only the training window:
the model runs and steps past it (``has_position_limit`` is False). ``transformers`` is imported
lazily (the ``hf`` extra).

Decoding keeps Hugging Face's key/value cache (:class:`LlamaDecodeState`), keys already rotated, with no
length limit.
"""

from __future__ import annotations

import torch

from drmlab.models.layers.hf_causal_lm import HFCausalLM, KeyValueState, import_transformers

from .config import LlamaSettings


def hf_llama_config(config: LlamaSettings):
    """The ``transformers.LlamaConfig`` of ``config``: no biases, no dropout, as many key/value heads
    as query heads, silu (SwiGLU), default rope at ``rope_theta``, no special tokens, no cache."""
    tf = import_transformers("LLAMA")
    hf = tf.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,  # no grouped-query attention
        hidden_act="silu",
        max_position_embeddings=config.max_seq_len,  # only rope scaling reads it (none here)
        rope_theta=config.rope_theta,  # transformers 5 moves it into rope_parameters
        rms_norm_eps=config.rms_norm_eps,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=False,
    )
    hf._attn_implementation = config.attn_implementation
    return hf


class LlamaDecodeState(KeyValueState):
    """LLAMA's decode state: per layer (keys, values) [B, H, S, head_dim], keys already rotated to their
    positions; S grows without limit."""


class Llama(HFCausalLM):
    """``LlamaForCausalLM`` with the drmlab forward signature ``(tokens, step=None) -> ModelOutput``."""

    has_position_limit = False  # rotary positions: no table, the model runs past max_seq_len
    state_type = LlamaDecodeState

    def __init__(self, config: LlamaSettings, seed: int = 0, model_name: str = "LLAMA", preset: str = "custom"):
        super().__init__()
        config.validate()
        tf = import_transformers(model_name)
        settings = hf_llama_config(config)
        # Seeded init that leaves the caller's global RNG untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.hf = tf.LlamaForCausalLM(settings)
        self.config = config
        self.model_name = model_name
        self.preset = preset
