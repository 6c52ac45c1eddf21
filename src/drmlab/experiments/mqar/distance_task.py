r"""The distance MQAR task (docs/mqar.md section 8): a recall task of P pairs (5P tokens: 40 at the
default 8) asked again after L - 5P tokens of filler.

Vocabulary 256: the query marker is token 1, the keys 2..33 (32), the values 34..97 (64), the filler
98..255. An example of L tokens with P pairs (``pairs``, 1 to 32: there are 32 key ids; default 8) is

    k1 v1 ... kP vP  |  L - 5P filler tokens  |  1 k_pi(1) v_pi(1)  ...  1 k_pi(P) v_pi(P)

with P distinct keys, P values drawn independently (repeats allowed), filler drawn uniformly and pi a
random permutation. The model reads tokens[:-1] and is scored on the P positions whose next token is
a queried value (the key right after each marker); accuracy is the argmax over all 256 logits
against that value (chance 1/64). L = 5P is the short control, without filler (docs/mqar.md 8.2).

**Random draws.** A training batch of step k, micro-batch m, comes from ``default_rng([seed, k, m])``
(steps count from 1), a fresh batch every step. Evaluation row r draws its keys, values and
permutation from ``default_rng([eval_seed, 0, r, 1])`` and its filler from ``default_rng([eval_seed,
0, r, 2])``: the same row carries the same associations at every length and only its filler differs,
so two lengths compare the same questions asked at two distances. (numpy pads a seed list with zeros,
so ``[a, b, c]`` and ``[a, b, c, 0]`` are one stream; a last word of 1 or 2 keeps the evaluation
streams apart from every three-word training stream, whatever its step.) The draws of 8 pairs are
those of the task before the pair count was a setting, bit for bit.
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
PAIRS = 8  # the default; any 1 <= pairs <= N_KEYS (check_pairs)
MAX_PAIRS = N_KEYS  # the keys of one example are distinct
TOKENS_PER_PAIR = 5  # a written pair (key, value) and its query (marker, key, value)
IGNORE = BatchSource.IGNORE_INDEX
CHANCE = 1.0 / N_VALUES


def check_pairs(pairs) -> int:
    """``pairs`` if it is an integer from 1 to 32 (the byte vocabulary's 32 key ids); else one ValueError line."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs <= MAX_PAIRS:
        raise ValueError(
            f"pairs (--pairs) must be an integer from 1 to {MAX_PAIRS} (the vocabulary has {N_KEYS} key ids, "
            f"{FIRST_KEY}-{FIRST_KEY + N_KEYS - 1}, and an example's keys are distinct), got {pairs!r}"
        )
    return pairs


def control_length(pairs: int = PAIRS) -> int:
    """The short control's length: the pairs and the queries, no filler (5 x pairs: 40 at 8 pairs)."""
    return 2 * check_pairs(pairs) + 3 * pairs


def context_guess(pairs: int = PAIRS) -> float:
    """The accuracy of naming a random one of the ``pairs`` values in the context (docs/mqar.md section 3):
    (1 + (P - 1) / 64) / P; a wrong pick may still carry the right value."""
    return (1 + (check_pairs(pairs) - 1) / N_VALUES) / pairs


def elimination_guess(pairs: int = PAIRS) -> float:
    """The same among the values not yet queried, averaged over the P queries: the mean over r = P..1
    candidates left of (1 + (r - 1) / 64) / r, which is (H_P + (P - H_P) / 64) / P."""
    return sum((1 + (r - 1) / N_VALUES) / r for r in range(1, check_pairs(pairs) + 1)) / pairs


CONTROL_LENGTH = control_length(PAIRS)  # 40: the pairs and the queries, no filler
# Levels reached without binding a key to its value (docs/mqar.md section 3, with 8 pairs of 64 values):
# a random one of the 8 values in the context, and the same among the values not yet queried.
CONTEXT_GUESS = context_guess(PAIRS)
ELIMINATION_GUESS = elimination_guess(PAIRS)


def levels(pairs: int = PAIRS) -> dict:
    """What the pair count decides: ``pairs``, ``control_length``, ``chance``, ``context_guess`` and
    ``elimination_guess``."""
    return {
        "pairs": check_pairs(pairs),
        "control_length": control_length(pairs),
        "chance": CHANCE,
        "context_guess": context_guess(pairs),
        "elimination_guess": elimination_guess(pairs),
    }


def check_length(length, pairs: int = PAIRS) -> int:
    minimum = control_length(pairs)
    if isinstance(length, bool) or not isinstance(length, int) or length < minimum:
        raise ValueError(
            f"a distance MQAR length must be an integer >= {minimum} (the {pairs} pairs and their queries), "
            f"got {length!r}"
        )
    return length


def draw_example(
    pairs_rng: np.random.Generator, filler_rng: np.random.Generator, length: int, pairs: int = PAIRS
) -> np.ndarray:
    """One example of ``length`` tokens (int64): keys, values and permutation from ``pairs_rng``, in
    that order, then the filler from ``filler_rng`` (they may be the same generator)."""
    keys = pairs_rng.choice(np.arange(FIRST_KEY, FIRST_KEY + N_KEYS), size=pairs, replace=False)
    values = pairs_rng.integers(FIRST_VALUE, FIRST_VALUE + N_VALUES, size=pairs)
    order = pairs_rng.permutation(pairs)
    filler = filler_rng.integers(FIRST_FILLER, VOCAB_SIZE, size=length - control_length(pairs))
    queries = np.stack([np.full(pairs, MARKER), keys[order], values[order]], axis=1).reshape(-1)
    return np.concatenate([np.stack([keys, values], axis=1).reshape(-1), filler, queries]).astype(np.int64)


def scored_positions(length: int, pairs: int = PAIRS) -> np.ndarray:
    """The ``pairs`` input positions (of tokens[:-1]) whose next token is a queried value: each query's key."""
    return length - 3 * pairs + 3 * np.arange(pairs) + 1


def split_tokens(tokens: torch.Tensor, pairs: int = PAIRS) -> tuple[torch.Tensor, torch.Tensor]:
    """Examples [n, L] -> (inputs tokens[:, :-1], targets): the next token at the scored positions,
    :data:`IGNORE` everywhere else."""
    inputs = tokens[:, :-1]
    targets = torch.full_like(inputs, IGNORE)
    cols = torch.from_numpy(scored_positions(tokens.shape[1], pairs))
    targets[:, cols] = tokens[:, cols + 1]
    return inputs, targets


def training_tokens(
    seed: int, step: int, micro: int, batch_size: int, length: int | None = None, pairs: int = PAIRS
) -> torch.Tensor:
    """The examples of one training micro-batch, all from ``default_rng([seed, step, micro])``; ``length``
    None: the control length of ``pairs``."""
    length = control_length(pairs) if length is None else length
    rng = np.random.default_rng([seed, step, micro])
    return torch.from_numpy(np.stack([draw_example(rng, rng, length, pairs) for _ in range(batch_size)]))


def evaluation_tokens(eval_seed: int, length: int, rows: range, pairs: int = PAIRS) -> torch.Tensor:
    """Evaluation examples ``rows`` at ``length``; row r's associations are the same at every length."""
    check_length(length, pairs)
    return torch.from_numpy(
        np.stack(
            [
                draw_example(
                    np.random.default_rng([eval_seed, 0, r, 1]),
                    np.random.default_rng([eval_seed, 0, r, 2]),
                    length,
                    pairs,
                )
                for r in rows
            ]
        )
    )


class DistanceBatches(BatchSource):
    """Fresh training batches of ``length``-token examples of ``pairs`` pairs (:func:`training_tokens`;
    ``length`` None: the control length), scored on the queries."""

    def __init__(self, batch_size: int, length: int | None = None, pairs: int = PAIRS):
        self.pairs = check_pairs(pairs)
        self.batch_size = batch_size
        self.length = check_length(control_length(pairs) if length is None else length, pairs)

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_tokens(training_tokens(seed, step, micro, self.batch_size, self.length, self.pairs), self.pairs)
