"""The Llama-style transformer baseline: Hugging Face ``LlamaForCausalLM`` behind the common model interface.

Registered as ``LLAMA``: the "Transformer++" of the Mamba, GLA, DeltaNet and Zoology papers, i.e.
Llama's block (Touvron et al. 2023) -- pre-norm RMSNorm (Zhang & Sennrich 2019), causal attention
with rotary positions on queries and keys (Su et al. 2021), a SwiGLU MLP ``down(silu(gate x) * up x)``
(Shazeer 2020) -- with no biases, no dropout, no grouped-query attention and the head tied to the
token embedding. ``forward(tokens, step=None)`` returns a :class:`ModelOutput` whose ``logits[:, t]``
predict ``tokens[:, t + 1]``. Labels are **never** passed to the Hugging Face model: given labels it
shifts them itself (the trap ``docs/drm.md`` section 10 describes for GPT2); the trainer computes
the loss from the logits.

Presets (:mod:`.config`, vocab 256) are matched in parameter count to DRM J at the same preset
(within 1%). Rotary positions have no table, so ``max_seq_len`` is only the training window:
the model runs and steps past it (``has_position_limit`` is False). ``transformers`` is imported
lazily (the ``hf`` extra).

Decoding keeps Hugging Face's key/value cache (:class:`LlamaDecodeState`); ``forward(tokens,
return_state=True)`` runs the prompt in one parallel pass that also fills the cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens
from drmlab.models.output import ModelOutput

from .config import LlamaSettings


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the LLAMA baseline needs Hugging Face transformers: pip install 'drmlab[hf]'") from exc
    return transformers


def hf_llama_config(config: LlamaSettings):
    """The ``transformers.LlamaConfig`` of ``config``: no biases, no dropout, as many key/value heads
    as query heads, silu (SwiGLU), default rope at ``rope_theta``, no special tokens, no cache."""
    tf = _transformers()
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


@dataclass(frozen=True)
class LlamaDecodeState:
    """Per-layer (keys, values) [B, H, S, head_dim] of the tokens seen so far (keys already rotated
    to their positions), and the batch B (held apart from the caches, which are empty before the
    first token)."""

    layers: tuple = ()
    length: int = 0
    batch_size: int | None = None  # None: read it from the caches


class Llama(nn.Module):
    """``LlamaForCausalLM`` with the drmlab forward signature ``(tokens, step=None) -> ModelOutput``."""

    has_position_limit = False  # rotary positions: no table, the model runs past max_seq_len

    def __init__(self, config: LlamaSettings, seed: int = 0, model_name: str = "LLAMA", preset: str = "custom"):
        super().__init__()
        config.validate()
        tf = _transformers()
        settings = hf_llama_config(config)
        # Seeded init that leaves the caller's global RNG untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.hf = tf.LlamaForCausalLM(settings)
        self.config = config
        self.model_name = model_name
        self.preset = preset

    def forward(
        self,
        tokens: torch.Tensor,
        step: int | None = None,
        return_state: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Logits [B, T, V] for ``tokens`` [B, T]; ``step`` is accepted and ignored. ``return_state``:
        ``.state`` is the key/value cache after the last token. ``logits_at``: the head at those
        positions only (:mod:`drmlab.models.inputs`)."""
        check_tokens(tokens, self.config.vocab_size, self.model_name)
        check_logits_at(logits_at, tokens, self.model_name)
        if return_state:
            logits, state = self._cached_forward(tokens, self.init_state(tokens.shape[0]))
            return ModelOutput(logits=logits if logits_at is None else logits[logits_at], aux={}, state=state)
        if logits_at is not None:
            hidden = self.hf.model(input_ids=tokens.long(), use_cache=False).last_hidden_state
            return ModelOutput(logits=self.hf.lm_head(hidden[logits_at]), aux={})
        # No labels: Hugging Face would shift them again (targets x_{t+2} for shifted labels).
        out = self.hf(input_ids=tokens.long(), use_cache=False)
        return ModelOutput(logits=out.logits, aux={})

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> LlamaDecodeState:
        check_batch_size(batch_size, self.model_name)
        return LlamaDecodeState(batch_size=batch_size)

    def _cached_forward(self, tokens: torch.Tensor, state: LlamaDecodeState):
        """``tokens`` [B, T] after the ``state.length`` tokens of ``state``: Hugging Face numbers their
        positions from the cache's length, so the rotary angles continue where the state ended."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (keys, values) in enumerate(state.layers):
            cache.update(keys, values, i)  # the first update stores; forward then concatenates new tensors
        # transformers 5 names the argument and the output `cache`; 4.x named them past_key_values
        name = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        out = self.hf(input_ids=tokens.long(), use_cache=True, **{name: cache})
        returned = out["cache"] if "cache" in out else out["past_key_values"]
        layers = tuple((layer.keys, layer.values) for layer in returned.layers)
        return out.logits, LlamaDecodeState(
            layers=layers, length=state.length + tokens.shape[1], batch_size=tokens.shape[0]
        )

    def step(self, tokens_t: torch.Tensor, state: LlamaDecodeState) -> tuple[torch.Tensor, LlamaDecodeState]:
        """One token [B] through the key/value cache -> (logits [B, vocab], new state)."""
        batch = state.batch_size
        if batch is None and state.layers:  # a state built by hand: its caches know the batch
            batch = state.layers[0][0].shape[0]
        check_step_tokens(tokens_t, self.config.vocab_size, batch, self.model_name)
        logits, state = self._cached_forward(tokens_t.unsqueeze(1), state)
        return logits[:, -1], state
