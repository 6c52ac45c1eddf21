"""The value every model's forward returns, and the token check every forward and step makes.

Every model is called as ``model(tokens, step=None, return_state=False)``; ``return_state=True``
asks the parallel forward for the decoding state after the last token as well (``.state``), the
same state that ``init_state`` + ``step`` over the tokens would reach, so a prompt is prefilled by
one parallel pass (:func:`drmlab.generation.prefill`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ModelOutput:
    """``logits`` [B, T, vocab]: logits[:, t] predicts token t + 1.

    ``aux`` holds diagnostic tensors and auxiliary losses. When the model has
    auxiliary losses, ``aux["loss_aux"]`` is the weighted sum to add to the
    next-token cross-entropy (the trainer adds it; it is absent or zero otherwise).
    ``state`` is the decoding state after the last token when the forward was asked for it
    (``return_state=True``), else None.
    """

    logits: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)
    state: object = None


def check_tokens(tokens: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError naming the problem when ``tokens`` is not a valid [B, T] id tensor."""
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape [batch, time] (rank 2), got shape {tuple(tokens.shape)}")
    if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.numel():
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
