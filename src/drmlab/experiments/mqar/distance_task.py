r"""The distance MQAR task (docs/mqar.md section 8): a 40-token recall task asked again after L - 40 tokens
of filler.

Vocabulary 256: the query marker is token 1, the keys 2..33 (32), the values 34..97 (64), the filler
98..255. An example of L tokens is

    k1 v1 ... k8 v8  |  L - 40 filler tokens  |  1 k_pi(1) v_pi(1)  ...  1 k_pi(8) v_pi(8)

with 8 distinct keys, 8 values drawn independently (repeats allowed), filler drawn uniformly and pi a
random permutation. The model reads tokens[:-1] and is scored on the 8 positions whose next token is
a queried value (the key right after each marker); accuracy is the argmax over all 256 logits
against that value (chance 1/64). L = 40 is the short control, without filler.

**Random draws.** A training batch of step k, micro-batch m, comes from ``default_rng([seed, k, m])``
(steps count from 1), a fresh batch every step. Evaluation row r draws its keys, values and
permutation from ``default_rng([eval_seed, 0, r, 1])`` and its filler from ``default_rng([eval_seed,
0, r, 2])``: the same row carries the same associations at every length and only its filler differs,
so two lengths compare the same questions asked at two distances. (numpy pads a seed list with zeros,
so ``[a, b, c]`` and ``[a, b, c, 0]`` are one stream; a last word of 1 or 2 keeps the evaluation
streams apart from every three-word training stream, whatever its step.)
"""

from __future__ import annotations

import numpy as np
import torch

from drmlab.training.batches import BatchSource

VOCAB_SIZE = 256
MARKER = 1
FIRST_KEY, N_KEYS = 2, 32
FIRST_VALUE, N_VALUES = 34, 64
FIRST_FILLER = 98
PAIRS = 8
CONTROL_LENGTH = 2 * PAIRS + 3 * PAIRS  # 40: the pairs and the queries, no filler
IGNORE = BatchSource.IGNORE_INDEX
CHANCE = 1.0 / N_VALUES
# Levels reached without binding a key to its value (docs/mqar.md section 3, with 8 pairs of 64 values):
# a random one of the 8 values in the context, and the same among the values not yet queried.
CONTEXT_GUESS = (1 + (PAIRS - 1) / N_VALUES) / PAIRS
ELIMINATION_GUESS = sum((1 + (r - 1) / N_VALUES) / r for r in range(1, PAIRS + 1)) / PAIRS


def check_length(length) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < CONTROL_LENGTH:
        raise ValueError(
            f"a distance MQAR length must be an integer >= {CONTROL_LENGTH} (the pairs and the queries), got {length!r}"
        )
    return length


def draw_example(pairs_rng: np.random.Generator, filler_rng: np.random.Generator, length: int) -> np.ndarray:
    """One example of ``length`` tokens (int64): keys, values and permutation from ``pairs_rng``, in
    that order, then the filler from ``filler_rng`` (they may be the same generator)."""
    keys = pairs_rng.choice(np.arange(FIRST_KEY, FIRST_KEY + N_KEYS), size=PAIRS, replace=False)
    values = pairs_rng.integers(FIRST_VALUE, FIRST_VALUE + N_VALUES, size=PAIRS)
    order = pairs_rng.permutation(PAIRS)
    filler = filler_rng.integers(FIRST_FILLER, VOCAB_SIZE, size=length - CONTROL_LENGTH)
    queries = np.stack([np.full(PAIRS, MARKER), keys[order], values[order]], axis=1).reshape(-1)
    return np.concatenate([np.stack([keys, values], axis=1).reshape(-1), filler, queries]).astype(np.int64)


def scored_positions(length: int) -> np.ndarray:
    """The 8 input positions (of tokens[:-1]) whose next token is a queried value: each query's key."""
    return length - 3 * PAIRS + 3 * np.arange(PAIRS) + 1


def split_tokens(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Examples [n, L] -> (inputs tokens[:, :-1], targets): the next token at the scored positions,
    :data:`IGNORE` everywhere else."""
    inputs = tokens[:, :-1]
    targets = torch.full_like(inputs, IGNORE)
    cols = torch.from_numpy(scored_positions(tokens.shape[1]))
    targets[:, cols] = tokens[:, cols + 1]
    return inputs, targets


def training_tokens(seed: int, step: int, micro: int, batch_size: int, length: int = CONTROL_LENGTH) -> torch.Tensor:
    """The examples of one training micro-batch, all from ``default_rng([seed, step, micro])``."""
    rng = np.random.default_rng([seed, step, micro])
    return torch.from_numpy(np.stack([draw_example(rng, rng, length) for _ in range(batch_size)]))


def evaluation_tokens(eval_seed: int, length: int, rows: range) -> torch.Tensor:
    """Evaluation examples ``rows`` at ``length``; row r's associations are the same at every length."""
    check_length(length)
    return torch.from_numpy(
        np.stack(
            [
                draw_example(
                    np.random.default_rng([eval_seed, 0, r, 1]), np.random.default_rng([eval_seed, 0, r, 2]), length
                )
                for r in rows
            ]
        )
    )


class DistanceBatches(BatchSource):
    """Fresh training batches of ``length``-token examples (:func:`training_tokens`), scored on the queries."""

    def __init__(self, batch_size: int, length: int = CONTROL_LENGTH):
        self.batch_size, self.length = batch_size, check_length(length)

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_tokens(training_tokens(seed, step, micro, self.batch_size, self.length))
