"""The GPT-2 baseline: Hugging Face ``GPT2LMHeadModel`` behind the common model interface.

Registered as ``GPT2``. ``forward(tokens, step=None)`` returns a :class:`ModelOutput` whose
``logits[:, t]`` predict ``tokens[:, t + 1]``. Labels are **never** passed to the Hugging Face
model: given labels it shifts them itself, so a loader that has already shifted its targets
trains against x_{t+2} (the reference study's bug). The trainer computes the loss from the logits.

Presets (vocab 256) are matched in parameter count to the DRM model J at the same preset
(within 3%; pinned in ``tests/test_gpt2.py``); ``125m`` is 13 layers x 896 wide, 14 heads,
tied embeddings, 512 positions = 126,080,640 parameters. Dropout is 0 everywhere, so training
is deterministic given the seed. ``transformers`` is imported lazily (the ``hf`` extra).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn

from drmlab.models.output import ModelOutput, check_tokens
from drmlab.models.registry import register, suggest


@dataclass
class GPT2Settings:
    """The dimensions of the GPT-2 baseline (the subset of ``GPT2Config`` that we vary)."""

    n_layer: int
    n_head: int
    n_embd: int
    n_positions: int
    vocab_size: int = 256
    n_inner: int | None = None  # MLP width; None = 4 * n_embd
    tie_word_embeddings: bool = True
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    attn_implementation: str = "sdpa"  # "sdpa" or "eager"


# Parameter counts at vocab 256 (12 d^2 + 13 d per layer, (V + P) d embeddings, 2 d final norm),
# against J's at the same preset when these were chosen:
#   micro  2 x 26  (2 heads),  32 positions:     24,440   (J     24,184: +1.06%)
#   tiny   3 x 160 (5 heads), 256 positions:  1,010,080   (J  1,008,208: +0.19%)
#   small 10 x 288 (9 heads), 512 positions: 10,212,480   (J 10,203,504: +0.09%)
#   125m  13 x 896 (14 heads), 512 positions: 126,080,640
# tests/test_gpt2.py re-checks the micro/tiny/small rows against J (within 3%).
PRESET_DIMS: dict[str, dict] = {
    "micro": dict(n_layer=2, n_head=2, n_embd=26, n_positions=32),
    "tiny": dict(n_layer=3, n_head=5, n_embd=160, n_positions=256),
    "small": dict(n_layer=10, n_head=9, n_embd=288, n_positions=512),
    "125m": dict(n_layer=13, n_head=14, n_embd=896, n_positions=512),
}


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the GPT2 baseline needs Hugging Face transformers: pip install 'drmlab[hf]'"
        ) from exc
    return transformers


def count_parameters(settings: GPT2Settings) -> int:
    """The exact parameter count of ``settings`` (no model is built)."""
    d, v, p, n = settings.n_embd, settings.vocab_size, settings.n_positions, settings.n_layer
    inner = settings.n_inner or 4 * d
    per_layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d)
    head = 0 if settings.tie_word_embeddings else v * d
    return v * d + p * d + n * per_layer + 2 * d + head


@dataclass(frozen=True)
class GPT2DecodeState:
    """Per-layer (keys, values) [B, H, S, head_dim] of the tokens seen so far."""

    layers: tuple = ()
    length: int = 0


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

    def forward(self, tokens: torch.Tensor, step: int | None = None) -> ModelOutput:
        """Logits [B, T, V] for ``tokens`` [B, T]; ``step`` is accepted and ignored."""
        check_tokens(tokens, self.config.vocab_size)
        if tokens.shape[1] > self.config.n_positions:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds GPT2's n_positions={self.config.n_positions}"
                " (use --set n_positions=N)"
            )
        # No labels: Hugging Face would shift them again (targets x_{t+2} for shifted labels).
        out = self.hf(input_ids=tokens.long(), use_cache=False)
        return ModelOutput(logits=out.logits, aux={})

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int) -> GPT2DecodeState:
        return GPT2DecodeState()

    def _cached_forward(self, tokens: torch.Tensor, state: GPT2DecodeState):
        from transformers import DynamicCache

        if state.length + tokens.shape[1] > self.config.n_positions:
            raise ValueError(f"GPT2 has {self.config.n_positions} positions; cannot go past them "
                             f"(use --set n_positions=N when training)")
        cache = DynamicCache()
        for i, (keys, values) in enumerate(state.layers):
            cache.update(keys, values, i)  # the first update stores; forward then concatenates new tensors
        # transformers 5 names the argument and the output `cache`; 4.x named them past_key_values
        name = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        out = self.hf(input_ids=tokens.long(), use_cache=True, **{name: cache})
        returned = out["cache"] if "cache" in out else out["past_key_values"]
        layers = tuple((layer.keys, layer.values) for layer in returned.layers)
        return out.logits, GPT2DecodeState(layers=layers, length=state.length + tokens.shape[1])

    def step(self, tokens_t: torch.Tensor, state: GPT2DecodeState) -> tuple[torch.Tensor, GPT2DecodeState]:
        """One token [B] through the key/value cache -> (logits [B, vocab], new state)."""
        if tokens_t.dim() != 1:
            raise ValueError(f"step expects tokens of shape [batch], got shape {tuple(tokens_t.shape)}")
        check_tokens(tokens_t.unsqueeze(1), self.config.vocab_size)
        logits, state = self._cached_forward(tokens_t.unsqueeze(1), state)
        return logits[:, -1], state

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, GPT2DecodeState]:
        """The parallel forward over a prompt [B, T], keeping its key/value cache."""
        check_tokens(tokens, self.config.vocab_size)
        logits, state = self._cached_forward(tokens, self.init_state(tokens.shape[0]))
        return logits[:, -1], state


def build_gpt2(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> GPT2:
    """Registry builder: the ``preset`` dimensions at ``vocab_size``, then ``overrides``."""
    values = dict(PRESET_DIMS[preset], vocab_size=vocab_size)
    fields = {f.name for f in dataclasses.fields(GPT2Settings)}
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown GPT2 config key {key!r}{suggest(key, fields)}; known: {', '.join(sorted(fields))}")
        values[key] = value
    return GPT2(GPT2Settings(**values), seed=seed, model_name=name, preset=preset)


register("GPT2", build_gpt2)
