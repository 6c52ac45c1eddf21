"""Zoology's Figure-2 recipe (docs/mqar.md section 10.1): the settings (L, kv) = (64, 4), (128, 8),
(256, 16), (512, 64); batch 512 / 512 / 256 / 128; 100,000 training and 3,000 test examples; at most
64 epochs of the shuffled training set (the last batch of an epoch is the remainder); AdamW, weight
decay 0.1 on every tensor, no clipping, a cosine from the rate to 0 over the 64 epochs, no warm-up;
after each epoch the test accuracy is measured and the run stops once it exceeds 0.99; rates
logspace(-4, -2, 4); widths 64, 128, 256, 512; 2 layers, one attention head, no MLP where the model
allows it. A cell reports the best rate's final test accuracy, as Zoology's figure does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from drmlab.experiments.mqar.zoology_task import POWER_A, VOCAB_SIZE

SETTINGS = ((64, 4), (128, 8), (256, 16), (512, 64))  # (sequence length, key-value pairs)
BATCH_SIZES = {64: 512, 128: 512, 256: 256, 512: 128}  # Zoology's rule: 512 up to 128 tokens, then halving
WIDTHS = (64, 128, 256, 512)
LR_GRID = tuple(float(x) for x in np.logspace(-4, -2, 4))


@dataclass(frozen=True)
class ZoologyRecipe:
    """Zoology's Figure-2 settings (docs/mqar.md section 10.1)."""

    vocab_size: int = VOCAB_SIZE
    power_a: float = POWER_A
    settings: tuple = SETTINGS
    batch_sizes: tuple = tuple(sorted(BATCH_SIZES.items()))
    n_train: int = 100_000
    n_test: int = 3_000
    epochs: int = 64
    weight_decay: float = 0.1
    early_stop: float = 0.99  # stop once the test accuracy after an epoch exceeds this
    # None: every rate trains all the epochs (Zoology's). P: every rate trains its first P epochs (the
    # probe: the same run, cosine over all the epochs, stopped early), then only the best one goes on
    probe_epochs: int | None = None
    lr_grid: tuple = LR_GRID
    widths: tuple = WIDTHS
    n_layer: int = 2
    n_head: int = 1
    dropout: float = 0.1  # the attention baseline's embedding and attention-probability dropout
    seed: int = 123  # Zoology's TrainConfig seed (model init, batch order)
    data_seed: int = 0  # Zoology's DataConfig seed

    def batch_size(self, seq_len: int) -> int:
        return dict(self.batch_sizes)[seq_len]

    def steps_per_epoch(self, seq_len: int) -> int:
        return math.ceil(self.n_train / self.batch_size(seq_len))


RECIPE = ZoologyRecipe()
