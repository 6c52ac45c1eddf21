"""A Hugging Face causal language model behind drmlab's model interface, decoding through its key/value cache.

The transformer baselines (GPT2, LLAMA) wrap a ``transformers`` ``*ForCausalLM`` as ``self.hf``;
:class:`HFCausalLM` gives them the drmlab contract (docs/adding-a-model.md): ``forward(tokens, step=None,
return_state=False, logits_at=None) -> ModelOutput`` whose ``logits[:, t]`` predict ``tokens[:, t + 1]``,
``init_state`` and ``step``. Labels are **never** passed to the Hugging Face model: given labels it shifts
them itself, so a loader that has already shifted its targets trains against x_{t+2} (the reference study's
bug; ``docs/drm.md`` section 10); the trainer computes the loss from the logits.

The decode state (:class:`KeyValueState`) is the per-layer keys and values of the tokens seen so far, rebuilt
into a ``transformers.DynamicCache`` at each call; the model numbers the new tokens' positions from the
cache's length, so learned positions (GPT2) and rotary angles (LLAMA) continue where the state ended.
``forward(tokens, return_state=True)`` runs a prompt in one parallel pass that also fills the cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn

from drmlab.models.inputs import check_batch_size, check_logits_at, check_step_tokens, check_tokens
from drmlab.models.output import ModelOutput


def import_transformers(model_name: str):
    """``transformers``, imported on first use (the ``hf`` extra); its absence is one line naming the model."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the {model_name} baseline needs Hugging Face transformers: pip install 'drmlab[hf]'"
        ) from exc
    return transformers


@dataclass(frozen=True)
class KeyValueState:
    """Per-layer (keys, values) [B, H, S, head_dim] of the tokens seen so far, and the batch B (held apart
    from the caches, which are empty before the first token)."""

    layers: tuple = ()
    length: int = 0
    batch_size: int | None = None  # None: read it from the caches


class HFCausalLM(nn.Module):
    """The drmlab interface over ``self.hf`` (a ``transformers`` causal LM, set by the subclass along with
    ``config``, ``model_name`` and ``preset``). A subclass with a position table overrides
    :meth:`check_length`."""

    hf: nn.Module
    state_type = KeyValueState

    def check_length(self, length: int) -> None:
        """Refuse a sequence the model cannot position (nothing to refuse without a position table)."""

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
        self.check_length(tokens.shape[1])
        if logits_at is not None:
            hidden = self.hf.base_model(input_ids=tokens.long(), use_cache=False).last_hidden_state
            return ModelOutput(logits=self.hf.lm_head(hidden[logits_at]), aux={})
        out = self.hf(input_ids=tokens.long(), use_cache=False)  # no labels: see the module docstring
        return ModelOutput(logits=out.logits, aux={})

    def init_state(self, batch_size: int) -> KeyValueState:
        check_batch_size(batch_size, self.model_name)
        return self.state_type(batch_size=batch_size)

    def _cached_forward(self, tokens: torch.Tensor, state: KeyValueState):
        """(logits [B, T, V], the state after them) for ``tokens`` [B, T] following the tokens of ``state``."""
        from transformers import DynamicCache

        self.check_length(state.length + tokens.shape[1])
        cache = DynamicCache()
        for i, (keys, values) in enumerate(state.layers):
            cache.update(keys, values, i)  # the first update stores; forward then concatenates new tensors
        # transformers 5 names the argument and the output `cache`; 4.x named them past_key_values
        name = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        out = self.hf(input_ids=tokens.long(), use_cache=True, **{name: cache})
        returned = out["cache"] if "cache" in out else out["past_key_values"]
        layers = tuple((layer.keys, layer.values) for layer in returned.layers)
        return out.logits, self.state_type(
            layers=layers, length=state.length + tokens.shape[1], batch_size=tokens.shape[0]
        )

    def step(self, tokens_t: torch.Tensor, state: KeyValueState) -> tuple[torch.Tensor, KeyValueState]:
        """One token [B] through the key/value cache -> (logits [B, vocab], new state)."""
        batch = state.batch_size
        if batch is None and state.layers:  # a state built by hand: its caches know the batch
            batch = state.layers[0][0].shape[0]
        check_step_tokens(tokens_t, self.config.vocab_size, batch, self.model_name)
        logits, state = self._cached_forward(tokens_t.unsqueeze(1), state)
        return logits[:, -1], state
