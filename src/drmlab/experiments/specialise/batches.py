"""The specialisation's batches (docs/mqar.md section 9, "Curriculum"): at global step k a coin from
``default_rng([seed, k])`` picks a language window (offset from ``default_rng([seed + 1, k, 0])``)
or an MQAR batch of the distance protocol at the stage's length (``default_rng([seed + 2, k, 0])``);
the interleaved recipe replaces the coin by its fixed order (every 5th step a language batch).
Streams keyed by the step, so :class:`MixedBatches` is an ordinary
:class:`~drmlab.training.batches.BatchSource`: a resumed run draws the batches an uninterrupted one draws."""

from __future__ import annotations

import numpy as np
import torch

from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.experiments.specialise.curriculum import LANGUAGE_PROBABILITY, LANGUAGE_WINDOW, Settings, mqar_batch_size
from drmlab.training.batches import BatchSource, gather_windows, window_starts


def uses_language(seed: int, step: int, probability: float = LANGUAGE_PROBABILITY) -> bool:
    """The coin of ``step``: a language batch (True) or an MQAR batch, from ``default_rng([seed, step])``."""
    return bool(np.random.default_rng([seed, step]).random() < probability)


def language_batch(
    stream: np.ndarray, seed: int, step: int, window: int = LANGUAGE_WINDOW, rows: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs [rows, window], next tokens [rows, window]) of random windows of the training stream,
    their offsets from ``default_rng([seed + 1, step, 0])``."""
    starts = window_starts(seed + 1, step, 0, rows, window, len(stream))
    rows = gather_windows(stream, starts, window + 1)
    return rows[:, :-1], rows[:, 1:]


def mqar_batch(
    seed: int, step: int, length: int, pairs: int = mqar_distance.PAIRS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the distance protocol's examples of ``pairs`` pairs at ``length``, from
    ``default_rng([seed + 2, step, 0])``; targets are ignored except at the ``pairs`` query positions."""
    tokens = mqar_distance.training_tokens(seed + 2, step, 0, mqar_batch_size(length), length, pairs)
    return mqar_distance.split_tokens(tokens, pairs)


class MixedBatches(BatchSource):
    """The curriculum's batch of each step: a language window of ``stream`` or an MQAR batch at the
    stage's length, by the step's coin. One micro-batch per step (the recipe's steps take one batch)."""

    def __init__(self, stream: np.ndarray, settings: Settings):
        self.stream, self.settings = stream, settings

    def is_language(self, seed: int, step: int) -> bool:
        if self.settings.recipe == "interleaved":
            return self.settings.is_language_step(step)
        return uses_language(seed, step, self.settings.language_probability)

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        if micro:
            raise ValueError("the specialisation takes one batch per step (grad_accum 1)")
        if self.is_language(seed, step):
            s = self.settings
            return language_batch(self.stream, seed, step, s.language_window, s.language_rows)
        return mqar_batch(seed, step, self.settings.stage_of(step), self.settings.pairs)
