"""The models of the Zoology MQAR protocol (docs/mqar.md section 10): ``ATTENTION`` is Zoology's baseline
on GPT2's blocks (2 layers, one head, learned positions of length L, no MLP: the MLP is replaced by the
identity on the second LayerNorm's output, as Zoology's identity state mixer does, dropout 0.1 on the
embeddings and the attention probabilities). Every other registered model gets its width
(:func:`drmlab.experiments.mqar.models.width_overrides`), ``n_layer = 2`` and ``n_head = 1`` where its
config has them, LOOPED ``n_stored = 2 / n_loop``, MAMBA ``dt_rank = ceil(W / 16)``, and a position
table / window of L. A setting a model cannot hold (a learned position table shorter than L, a LOOPED
arm that loops more than twice, an invalid config) is ``n/a`` with the reason (:func:`protocol_overrides`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from drmlab.experiments.mqar.models import POSITION_FIELDS, width_overrides
from drmlab.experiments.mqar.zoology_recipe import RECIPE, ZoologyRecipe

ATTENTION = "ATTENTION"


def protocol_overrides(
    name: str, preset: str, width: int, seq_len: int, settings: dict | None = None, recipe: ZoologyRecipe = RECIPE
) -> tuple[str, dict, str | None]:
    """(registered name, overrides, None) of ``name`` at the protocol's width and length, or
    (registered name, overrides, reason) when the model cannot hold the setting (n/a)."""
    from drmlab.models.registry import config_fields, parse_model_spec

    settings = dict(settings or {})
    registry, kw = ("GPT2", {}) if name == ATTENTION else parse_model_spec(name)
    fields = config_fields(registry, preset, recipe.vocab_size, **kw)
    kw.update(width_overrides(fields, width))
    if "n_layer" in fields:
        kw["n_layer"] = recipe.n_layer
    if "n_head" in fields:
        kw["n_head"] = recipe.n_head
    if registry == "LOOPED":
        loops = fields["n_loop"]
        if recipe.n_layer % loops:
            return (
                registry,
                kw,
                (
                    f"{name} loops {loops} times; the protocol's {recipe.n_layer} layers hold "
                    f"only loop counts dividing {recipe.n_layer}"
                ),
            )
        kw["n_stored"] = recipe.n_layer // loops
    if "dt_rank" in fields:
        kw["dt_rank"] = math.ceil(width / 16)  # Mamba's "auto" rank, as Zoology's Mamba uses it
    kw.update(settings)
    for key in POSITION_FIELDS:
        if key in fields and key not in settings:
            kw[key] = max(seq_len, 1)
    try:
        fields = config_fields(registry, preset, recipe.vocab_size, **kw)
    except ValueError as exc:
        return registry, kw, str(exc).splitlines()[0]
    learned = "n_positions" in fields or fields.get("positions") == "learned"
    for key in POSITION_FIELDS:
        if learned and key in fields and fields[key] < seq_len:
            return (
                registry,
                kw,
                (f"attention past its positions: {key}={fields[key]} is shorter than the sequence length {seq_len}"),
            )
    return registry, kw, None


def zoology_attention(model: nn.Module, dropout: float) -> nn.Module:
    """Turn a built GPT2 into Zoology's attention baseline: each block's MLP becomes the identity
    (the residual then adds the second LayerNorm's output, as Zoology's identity state mixer does)
    and the embedding and attention-probability dropouts become ``dropout``."""
    transformer = model.hf.transformer
    transformer.drop.p = dropout
    for block in transformer.h:
        block.mlp = nn.Identity()
        block.attn.attn_dropout.p = dropout
    return model


def protocol_model(
    name: str,
    preset: str,
    width: int,
    seq_len: int,
    seed: int,
    settings: dict | None = None,
    recipe: ZoologyRecipe = RECIPE,
) -> tuple[nn.Module, str, dict]:
    """(model, registered name, overrides) of ``name`` in the protocol; ValueError when n/a."""
    from drmlab.models import build_model

    registry, kw, why = protocol_overrides(name, preset, width, seq_len, settings, recipe)
    if why is not None:
        raise ValueError(f"{name} at width {width}, length {seq_len}: n/a ({why})")
    model = build_model(registry, preset=preset, vocab_size=recipe.vocab_size, seed=seed, **kw)
    if name == ATTENTION:
        zoology_attention(model, recipe.dropout)
    return model, registry, kw


@torch.no_grad()
def decode_state_bytes(
    name: str, preset: str, width: int, seq_len: int, settings: dict | None = None, recipe: ZoologyRecipe = RECIPE
) -> int:
    """Bytes of one sequence's decoding state after ``seq_len`` tokens (the state-size frontier of
    docs/mqar.md section 10.5: the key/value cache of attention at that length, MAMBA's conv and SSM state,
    ASM_CM's matrices, J's vector), from the model as built (the architecture decides it, not the weights):
    a batch-1 prefill of ``seq_len`` tokens with ``return_state=True``."""
    from drmlab.experiments.mqar.distance import state_nbytes

    model, _, _ = protocol_model(name, preset, width, seq_len, recipe.seed, settings, recipe)
    tokens = torch.zeros(1, seq_len, dtype=torch.long)
    return state_nbytes(model.eval()(tokens, return_state=True).state)
