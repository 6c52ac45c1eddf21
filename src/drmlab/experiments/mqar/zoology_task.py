r"""The Zoology MQAR task (docs/mqar.md section 10), as HazyResearch/zoology generates it.

Vocabulary 8,192: token 0 fills, the keys are 1..4,095 (the lower half), the values 4,096..8,191
(the upper half). An example of length L with kv pairs is ``k1 v1 ... k_kv v_kv`` followed by
L - 2 kv slots: slot pair s (s = 0 .. (L - 2 kv)/2 - 1) is position 2 kv + 2 s. Key j's query sits at
slot pair g_j, where (g_1, .., g_kv) are drawn without replacement with weights w_s = (s + 1)^(a - 1),
a = 0.01, one after another (g_1 from w, g_2 from w without g_1, ...). Keys are distinct, values are
distinct (both without replacement). The input at a query position is the key, the target there is
its value; every other target is -100 and every other input 0. Draws come from
``numpy.random.default_rng(seed)``: keys (rejection of rows with a repeat), values (the same), then
the slots in blocks of :data:`GAP_BLOCK` rows by the Gumbel-top-k rule (the kv largest of log w_s +
Gumbel noise, in decreasing order, which has the law of drawing one after another). Train and test
sets come from ``[data_seed, L, kv, 0]`` and ``[data_seed, L, kv, 1]`` (:func:`data_sets`); training
walks shuffled epochs of the train set (:class:`EpochBatches`); the score is the argmax accuracy at
the query positions (:func:`query_accuracy`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from drmlab.experiments.mqar.task import accuracy
from drmlab.training.batches import BatchSource

VOCAB_SIZE = 8192
POWER_A = 0.01
FILL = 0
IGNORE = BatchSource.IGNORE_INDEX
GAP_BLOCK = 8192  # rows per block of the slot draw (bounds its memory; part of the stream's definition)
EVAL_TOKENS = 16384  # tokens per evaluation forward (the logits of 8,192 entries are the memory)


def check_setting(seq_len, kv, vocab_size: int = VOCAB_SIZE) -> None:
    for what, value in (("seq_len", seq_len), ("kv", kv)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"Zoology MQAR {what} must be a positive integer, got {value!r}")
    if seq_len % 2:
        raise ValueError(f"Zoology MQAR seq_len must be even (keys and queries sit on even positions), got {seq_len}")
    if 4 * kv > seq_len:
        raise ValueError(
            f"Zoology MQAR needs seq_len >= 4 kv (the pairs and one query slot pair per key); "
            f"seq_len {seq_len} holds at most kv {seq_len // 4}, got {kv}"
        )
    if kv > vocab_size // 2 - 1:
        raise ValueError(
            f"kv {kv} needs that many distinct keys; the vocabulary of {vocab_size} has {vocab_size // 2 - 1}"
        )


def slot_weights(space: int, power_a: float = POWER_A) -> np.ndarray:
    """The normalised weights (s + 1)^(a - 1), s = 0 .. space - 1, of a query's slot pair."""
    w = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1.0)
    return w / w.sum()


def _distinct(rng: np.random.Generator, low: int, high: int, n: int, k: int) -> np.ndarray:
    """[n, k] integers of [low, high), distinct within each row: rows with a repeat are drawn again
    (each row is then uniform over the ordered k-tuples without repeats)."""
    out = rng.integers(low, high, size=(n, k), dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        rows = np.sort(out[todo], axis=1)
        todo = todo[(rows[:, 1:] == rows[:, :-1]).any(axis=1)]
        if todo.size:
            out[todo] = rng.integers(low, high, size=(todo.size, k), dtype=np.int64)
    return out


def _slots(rng: np.random.Generator, n: int, kv: int, space: int, power_a: float) -> np.ndarray:
    """[n, kv] slot pairs drawn without replacement by weight, in draw order (Gumbel-top-k)."""
    log_w = np.log(slot_weights(space, power_a))
    out = np.empty((n, kv), dtype=np.int64)
    for start in range(0, n, GAP_BLOCK):
        m = min(GAP_BLOCK, n - start)
        score = log_w + rng.gumbel(size=(m, space))
        top = np.argpartition(-score, kv - 1, axis=1)[:, :kv]
        order = np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable")
        out[start : start + m] = np.take_along_axis(top, order, axis=1)
    return out


def generate(
    seq_len: int,
    kv: int,
    n: int,
    seed,
    *,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = POWER_A,
    dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` Zoology MQAR examples from ``default_rng(seed)``: (inputs, targets) [n, seq_len]."""
    check_setting(seq_len, kv, vocab_size)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"the number of examples must be a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    half = vocab_size // 2
    keys = _distinct(rng, 1, half, n, kv)
    values = _distinct(rng, half, vocab_size, n, kv)
    slots = _slots(rng, n, kv, (seq_len - 2 * kv) // 2, power_a)
    np_type = np.int16 if dtype == torch.int16 else np.int32 if dtype == torch.int32 else np.int64
    inputs = np.full((n, seq_len), FILL, dtype=np_type)
    targets = np.full((n, seq_len), IGNORE, dtype=np_type)
    inputs[:, 0 : 2 * kv : 2] = keys
    inputs[:, 1 : 2 * kv : 2] = values
    where = 2 * kv + 2 * slots
    np.put_along_axis(inputs, where, keys, axis=1)
    np.put_along_axis(targets, where, values, axis=1)
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def data_sets(seq_len: int, kv: int, *, n_train: int, n_test: int, data_seed: int = 0, dtype=torch.int16):
    """(train inputs, train targets, test inputs, test targets) of one setting (int16 by default:
    8,192 tokens and -100 fit, at a quarter of int64's memory)."""
    x, y = generate(seq_len, kv, n_train, [data_seed, seq_len, kv, 0], dtype=dtype)
    xt, yt = generate(seq_len, kv, n_test, [data_seed, seq_len, kv, 1], dtype=dtype)
    return x, y, xt, yt


class EpochBatches(BatchSource):
    """Shuffled epochs of a fixed set: step k (1-based) is batch (k - 1) mod E of epoch (k - 1) // E,
    E = ceil(n / batch_size), in the order of ``default_rng([seed, epoch]).permutation(n)``; the last
    batch of an epoch holds the remainder (as a data loader without drop_last)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int):
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.per_epoch = math.ceil(inputs.shape[0] / batch_size)
        self._perm: tuple[tuple, np.ndarray] | None = None

    def rows(self, seed: int, step: int) -> np.ndarray:
        epoch, index = divmod(step - 1, self.per_epoch)
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), np.random.default_rng([seed, epoch]).permutation(self.inputs.shape[0]))
        return self._perm[1][index * self.batch_size : (index + 1) * self.batch_size]

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(self.rows(seed, step))
        return self.inputs[rows].long(), self.targets[rows].long()


def query_accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Accuracy on the query positions only (argmax over all logits), a bounded number of tokens per forward."""
    batch = max(1, EVAL_TOKENS // inputs.shape[1])
    return accuracy(model, inputs.long(), targets.long(), batch_size=batch, scored_only=True)
