"""The GPT-2 baseline: Hugging Face ``GPT2LMHeadModel`` behind the common model interface.

Registered as ``GPT2``. ``forward(tokens, step=None)`` returns a :class:`ModelOutput` whose
``logits[:, t]`` predict ``tokens[:, t + 1]``. Labels are **never** passed to the Hugging Face
model: given labels it shifts them itself, so a loader that has already shifted its targets
trains against x_{t+2} (the reference study's bug; ``docs/drm.md`` section 10). The trainer computes
the loss from the logits.

Presets (:mod:`.config`, vocab 256) are matched in parameter count to the DRM model J at the same
preset (within 3%); ``125m`` is 13 layers x 896 wide, 14 heads, tied embeddings, 512 positions =
126,080,640 parameters. Dropout is 0 everywhere, so training is deterministic given the seed.
``transformers`` is imported lazily (the ``hf`` extra).

Decoding keeps Hugging Face's key/value cache (:class:`GPT2DecodeState`); ``forward(tokens,
return_state=True)`` runs the prompt in one parallel pass that also fills the cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens
from drmlab.models.output import ModelOutput

from .config import GPT2Settings


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the GPT2 baseline needs Hugging Face transformers: pip install 'drmlab[hf]'") from exc
    return transformers


@dataclass(frozen=True)
class GPT2DecodeState:
    """Per-layer (keys, values) [B, H, S, head_dim] of the tokens seen so far, and the batch B
    (held apart from the caches, which are empty before the first token)."""

    layers: tuple = ()
    length: int = 0
    batch_size: int | None = None  # None: read it from the caches


class GPT2(nn.Module):
    """``GPT2LMHeadModel`` with the drmlab forward signature ``(tokens, step=None) -> ModelOutput``."""

    has_position_limit = True  # a learned position table of n_positions rows

    def __init__(self, config: GPT2Settings, seed: int = 0, model_name: str = "GPT2", preset: str = "custom"):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")
        tf = _transformers()
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
        self._check_length(tokens.shape[1])
        if logits_at is not None:
            hidden = self.hf.transformer(input_ids=tokens.long(), use_cache=False).last_hidden_state
            return ModelOutput(logits=self.hf.lm_head(hidden[logits_at]), aux={})
        # No labels: Hugging Face would shift them again (targets x_{t+2} for shifted labels).
        out = self.hf(input_ids=tokens.long(), use_cache=False)
        return ModelOutput(logits=out.logits, aux={})

    def _check_length(self, length: int) -> None:
        if length > self.config.n_positions:
            raise ValueError(
                f"sequence length {length} exceeds GPT2's n_positions={self.config.n_positions}; "
                "build the model with a larger n_positions"
            )

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> GPT2DecodeState:
        check_batch_size(batch_size, self.model_name)
        return GPT2DecodeState(batch_size=batch_size)

    def _cached_forward(self, tokens: torch.Tensor, state: GPT2DecodeState):
        from transformers import DynamicCache

        self._check_length(state.length + tokens.shape[1])
        cache = DynamicCache()
        for i, (keys, values) in enumerate(state.layers):
            cache.update(keys, values, i)  # the first update stores; forward then concatenates new tensors
        # transformers 5 names the argument and the output `cache`; 4.x named them past_key_values
        name = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        out = self.hf(input_ids=tokens.long(), use_cache=True, **{name: cache})
        returned = out["cache"] if "cache" in out else out["past_key_values"]
        layers = tuple((layer.keys, layer.values) for layer in returned.layers)
        return out.logits, GPT2DecodeState(
            layers=layers, length=state.length + tokens.shape[1], batch_size=tokens.shape[0]
        )

    def step(self, tokens_t: torch.Tensor, state: GPT2DecodeState) -> tuple[torch.Tensor, GPT2DecodeState]:
        """One token [B] through the key/value cache -> (logits [B, vocab], new state)."""
        batch = state.batch_size
        if batch is None and state.layers:  # a state built by hand: its caches know the batch
            batch = state.layers[0][0].shape[0]
        check_step_tokens(tokens_t, self.config.vocab_size, batch, self.model_name)
        logits, state = self._cached_forward(tokens_t.unsqueeze(1), state)
        return logits[:, -1], state
