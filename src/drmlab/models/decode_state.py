"""What a model's decoding state can hold: its bytes, whether it grows with every token, and how far
back a model can read.

* :func:`state_nbytes`: the bytes of every tensor in a decoding state, less the caches a state type lists
  in ``CACHE_FIELDS`` (recomputable from the rest): what a sequence carries;
* :func:`decode_state_grows`: whether the state's bytes rise with every step (a key/value cache), measured
  by stepping a few tokens at batch 1;
* :func:`position_limit`: the rows of a learned position table (``has_position_limit``: GPT2's
  ``n_positions``, LOOPED's ``max_seq_len``), or None;
* :func:`context_limit`: the most input tokens a model reads -- its position table, else the training
  window of a model whose state grows, else None;
* :func:`carries_fixed_state`: the rule the long-context evaluation uses to carry a state across a whole
  stream: no position table and a state that does not grow (the recurrent families; not GPT2, LLAMA,
  LOOPED, RESOLVENT*, whose key/value caches grow).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

PROBE_TOKEN = 1  # the token stepped by decode_state_grows (any id of every vocabulary)


def state_nbytes(state) -> int:
    """Bytes of every tensor in a decoding state (dataclasses, tuples, lists and dicts walked), without the
    fields a state type lists in ``CACHE_FIELDS`` (caches recomputable from the rest, such as the DRM
    fast step's block constants): the state a sequence must carry."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    derived = getattr(type(state), "CACHE_FIELDS", ())
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_nbytes(getattr(state, f.name)) for f in dataclasses.fields(state) if f.name not in derived)
    if derived and hasattr(state, "_fields"):  # a NamedTuple
        return sum(state_nbytes(getattr(state, name)) for name in state._fields if name not in derived)
    if isinstance(state, (tuple, list)):
        return sum(state_nbytes(s) for s in state)
    if isinstance(state, dict):
        return sum(state_nbytes(s) for s in state.values())
    return 0


@torch.no_grad()
def decode_state_grows(model: nn.Module, probe: int = 8) -> bool:
    """Whether the decoding state gets larger with every token (a key/value cache): steps ``probe``
    tokens at batch 1 and checks the state's bytes rise at each step after the first."""
    device = next(model.parameters()).device
    state = model.init_state(1)
    sizes = []
    for _ in range(probe):
        _, state = model.step(torch.full((1,), PROBE_TOKEN, dtype=torch.long, device=device), state)
        sizes.append(state_nbytes(state))
    return all(b > a for a, b in zip(sizes[1:], sizes[2:]))


def position_limit(model: nn.Module) -> int | None:
    """How many tokens one forward of ``model`` may take: the rows of its learned position table
    (GPT2's ``n_positions``, LOOPED's ``max_seq_len``), or None when it has no such table."""
    if not getattr(model, "has_position_limit", False):
        return None
    config = model.config
    return int(getattr(config, "n_positions", None) or config.max_seq_len)


def _grows(model: nn.Module) -> bool:
    was_training = model.training
    model.eval()
    try:
        return decode_state_grows(model)
    finally:
        model.train(was_training)


def context_limit(model: nn.Module) -> int | None:
    """The most input tokens the model can read, or None for no limit: the rows of a learned position
    table (:func:`position_limit`), or the training window max_seq_len of a model whose decoding state
    grows with every token; None for a constant-size state."""
    limit = position_limit(model)
    if limit is not None:
        return limit
    if _grows(model):
        config = getattr(model, "config", None)
        window = getattr(config, "max_seq_len", None) or getattr(config, "n_positions", None)
        if not isinstance(window, int):
            raise ValueError(
                f"{getattr(model, 'model_name', type(model).__name__)}'s decoding state grows with "
                "every token and its config names no window (max_seq_len)"
            )
        return window
    return None


def carries_fixed_state(model: nn.Module) -> bool:
    """Whether a whole stream can be scored carrying one state of a fixed size: no learned position table
    and a decoding state whose bytes do not grow as it steps (:func:`decode_state_grows`)."""
    return position_limit(model) is None and not _grows(model)
