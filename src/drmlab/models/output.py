"""The value every model's forward returns (``docs/architecture.md`` section 2).

Every model is called as ``model(tokens, step=None, return_state=False)``; ``return_state=True``
asks the parallel forward for the decoding state after the last token as well (``.state``), the
same state that ``init_state`` + ``step`` over the tokens would reach, so a prompt is prefilled by
one parallel pass (:func:`drmlab.generation.prefill`). What a forward, ``init_state`` and ``step``
accept, and the error for anything else, is :mod:`drmlab.models.inputs`.
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
