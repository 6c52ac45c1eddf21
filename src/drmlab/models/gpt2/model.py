"""The GPT-2 baseline: Hugging Face ``GPT2LMHeadModel`` behind the common model interface.

Registered as ``GPT2``. The drmlab interface (the forward, never passing labels, decoding through the
key/value cache) is :class:`drmlab.models.layers.hf_causal_lm.HFCausalLM`'s.

Presets (:mod:`.config`, vocab 256) are matched in parameter count to the DRM model J at the same
preset (within 3%); ``125m`` is 13 layers x 896 wide, 14 heads, tied embeddings, 512 positions =
126,080,640 parameters. Dropout is 0 everywhere, so training is deterministic given the seed.
``transformers`` is imported lazily (the ``hf`` extra).

Decoding keeps Hugging Face's key/value cache (:class:`GPT2DecodeState`), at most ``n_positions`` tokens.
"""

from __future__ import annotations

import torch

from drmlab.models.layers.hf_causal_lm import HFCausalLM, KeyValueState, import_transformers

from .config import GPT2Settings


class GPT2DecodeState(KeyValueState):
    """GPT2's decode state: per layer (keys, values) [B, H, S, head_dim], S at most ``n_positions``."""


class GPT2(HFCausalLM):
    """``GPT2LMHeadModel`` with the drmlab forward signature ``(tokens, step=None) -> ModelOutput``."""

    has_position_limit = True  # a learned position table of n_positions rows
    state_type = GPT2DecodeState

    def __init__(self, config: GPT2Settings, seed: int = 0, model_name: str = "GPT2", preset: str = "custom"):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")
        tf = import_transformers(model_name)
        hf_config = tf.GPT2Config(
            vocab_size=config.vocab_size,
            n_positions=config.n_positions,
            n_embd=config.n_embd,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_inner=config.n_inner,
            activation_function=config.activation_function,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=config.layer_norm_epsilon,
            initializer_range=config.initializer_range,
            tie_word_embeddings=config.tie_word_embeddings,
            bos_token_id=None,
            eos_token_id=None,
            use_cache=False,
        )
        hf_config._attn_implementation = config.attn_implementation
        # Seeded init that leaves the caller's global RNG untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.hf = tf.GPT2LMHeadModel(hf_config)
        self.config = config
        self.model_name = model_name
        self.preset = preset

    def check_length(self, length: int) -> None:
        if length > self.config.n_positions:
            raise ValueError(
                f"sequence length {length} exceeds GPT2's n_positions={self.config.n_positions}; "
                "build the model with a larger n_positions"
            )
