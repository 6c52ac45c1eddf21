"""The one input contract of every model, and the checks that enforce it (``docs/architecture.md``
section 2, "The input contract").

Every registered model checks its inputs here, at its entry, so the same mistake gives the same
error on every family:

* ``model(tokens, ...)``: ``tokens`` is an integer tensor (``torch.long``; int32, int16, int8 and
  uint8 are accepted and read as ``long``) of shape ``[B, T]`` with ``B >= 1`` and ``T >= 1``,
  every id in ``[0, vocab_size)``;
* ``model.init_state(B)``: ``B >= 1``;
* ``model(tokens, logits_at=mask)``: ``mask`` is a boolean ``[B, T]`` tensor; the model applies its
  head at the marked positions only and returns logits ``[N, vocab]`` (N = ``mask.sum()``), in the
  order of ``full_logits[mask]`` (row-major), equal to those up to float rounding of the head's
  matrix product; a loss scored at a few positions (MQAR queries) skips the rest of the head;
* ``model.step(tokens_t, state)``: ``tokens_t`` is an integer tensor of shape ``[B]`` (one token
  per sequence; no family takes ``[B, 1]``), ids as above, and ``B`` equals the batch the state
  was made for.

Anything else raises :class:`ModelInputError` (a ``ValueError``) whose message names the model,
what it got (shape, dtype or id) and what it expects; a step whose batch differs from its state's
says ``state holds batch X, tokens have batch Y``.

Under ``torch.compile`` (``torch.compiler.is_compiling()``) the shape, dtype and batch checks still
run -- they read only tensor metadata, so a valid input traces them as guards, with no graph
break (``fullgraph=True`` compiles) -- but the id range is not checked: it reads the tensor's
values, which a traced graph cannot branch on. There an out-of-range id is caught only by the
embedding lookup's own bounds check, where the compiled backend keeps one (not checked here). An
input that breaks the contract still raises :class:`ModelInputError` from a compiled model
(Dynamo hands the frame back to eager); only under ``fullgraph=True`` does Dynamo wrap it in its
own ``Unsupported`` error, whose text quotes this module's message.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree

__all__ = [
    "TOKEN_DTYPES",
    "ModelInputError",
    "check_batch_size",
    "check_logits_at",
    "check_step_tokens",
    "check_tokens",
    "leading_batch",
]

# Integer dtypes accepted as token ids (read as torch.long by every model).
TOKEN_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class ModelInputError(ValueError):
    """A model was given tokens, a batch size or a decoding state outside its input contract."""


def _who(model: str | None) -> str:
    return f"{model}: " if model else ""


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _check_ids(tokens: torch.Tensor, vocab_size: int, model: str | None) -> None:
    """Every id in [0, vocab_size); skipped while torch.compile traces (value-dependent)."""
    if torch.compiler.is_compiling():
        return
    lo, hi = (int(v) for v in torch.aminmax(tokens))
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ModelInputError(
            f"{_who(model)}token id {bad} is outside the vocabulary [0, {vocab_size}) "
            f"(tokens of shape {tuple(tokens.shape)})"
        )


def _check_dtype(tokens: torch.Tensor, model: str | None) -> None:
    if tokens.dtype not in TOKEN_DTYPES:
        raise ModelInputError(
            f"{_who(model)}tokens must be an integer tensor of token ids (torch.long), got dtype {tokens.dtype}"
        )


def check_tokens(tokens: torch.Tensor, vocab_size: int, model: str | None = None) -> None:
    """Raise :class:`ModelInputError` unless ``tokens`` is an integer ``[B, T]`` tensor with
    ``B >= 1``, ``T >= 1`` and every id in ``[0, vocab_size)``; ``model`` names the model in the
    message."""
    if not isinstance(tokens, torch.Tensor):
        raise ModelInputError(
            f"{_who(model)}tokens must be a torch.Tensor of shape [batch, time], got {type(tokens).__name__}"
        )
    if tokens.dim() != 2:
        raise ModelInputError(
            f"{_who(model)}tokens must have shape [batch, time] (rank 2), got shape {tuple(tokens.shape)}"
        )
    _check_dtype(tokens, model)
    batch, time = tokens.shape
    if batch < 1 or time < 1:
        raise ModelInputError(
            f"{_who(model)}tokens must have batch >= 1 and time >= 1 (shape [batch, time]), "
            f"got shape {tuple(tokens.shape)}: an empty "
            f"{'batch' if batch < 1 else 'sequence'} has nothing to predict"
        )
    _check_ids(tokens, vocab_size, model)


def check_logits_at(logits_at: torch.Tensor | None, tokens: torch.Tensor, model: str | None = None) -> None:
    """Raise :class:`ModelInputError` unless ``logits_at`` is None or a boolean tensor of the tokens' shape."""
    if logits_at is None:
        return
    if not isinstance(logits_at, torch.Tensor) or logits_at.dtype != torch.bool:
        got = logits_at.dtype if isinstance(logits_at, torch.Tensor) else type(logits_at).__name__
        raise ModelInputError(f"{_who(model)}logits_at must be a boolean [batch, time] mask, got {got}")
    if tuple(logits_at.shape) != tuple(tokens.shape):
        raise ModelInputError(
            f"{_who(model)}logits_at has shape {tuple(logits_at.shape)}, the tokens have shape {tuple(tokens.shape)}"
        )


def check_batch_size(batch_size: int, model: str | None = None) -> None:
    """Raise :class:`ModelInputError` unless ``batch_size`` (of ``init_state``) is an int >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, torch.SymInt)) or batch_size < 1:
        raise ModelInputError(f"{_who(model)}init_state needs a batch size >= 1, got {batch_size!r}")


def check_step_tokens(
    tokens_t: torch.Tensor, vocab_size: int, state_batch: int | None, model: str | None = None
) -> None:
    """Raise :class:`ModelInputError` unless ``tokens_t`` is an integer ``[B]`` tensor (one token
    per sequence) with ids in ``[0, vocab_size)`` and ``B == state_batch``, the batch of the
    decoding state it continues (:func:`leading_batch` reads it from the state's tensors; None: a
    state that holds no batch yet, which any batch may continue)."""
    if not isinstance(tokens_t, torch.Tensor) or tokens_t.dim() != 1:
        raise ModelInputError(
            f"{_who(model)}step expects tokens of shape [batch] (one token per sequence), got shape {_shape(tokens_t)}"
        )
    _check_dtype(tokens_t, model)
    if state_batch is not None and tokens_t.shape[0] != state_batch:
        raise ModelInputError(f"{_who(model)}state holds batch {state_batch}, tokens have batch {tokens_t.shape[0]}")
    if tokens_t.shape[0] < 1:
        raise ModelInputError(f"{_who(model)}step expects tokens of shape [batch] with batch >= 1, got shape (0,)")
    _check_ids(tokens_t, vocab_size, model)


def leading_batch(state_parts) -> int:
    """The batch of a decoding state: dim 0 of the first tensor among ``state_parts`` (tuples,
    lists, dicts and named tuples of tensors, in order); every family keeps its state batch-first."""
    for leaf in _pytree.tree_leaves(state_parts):
        if isinstance(leaf, torch.Tensor):
            return leaf.shape[0]
    raise ModelInputError(f"the decoding state holds no tensor, so its batch is unknown: {type(state_parts).__name__}")
