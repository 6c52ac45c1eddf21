r"""The MQAR task (docs/mqar.md sections 1-3): multi-query associative-recall sequences, the
training batches drawn from them, and accuracy on the query positions.

**Task** (:class:`MQARTask`, :func:`generate`). ``vocab_kv`` = 64 keys are the tokens 2..65, the
values 66..129, token 0 pads, 1 is unused: vocabulary 2·vocab_kv + 2 = 130. A set of ``n``
sequences uses its own ``numpy.random.default_rng(seed)``; per sequence it draws, in order, ``kv``
distinct keys (``choice`` without replacement), ``kv`` values (``integers``, with replacement) and a
permutation of ``kv``. The sequence is ``k1 v1 k2 v2 ... k_kv v_kv`` followed by the keys again in
the permuted order (the first ``queries`` of them, default all ``kv``), one token each, then pads
up to ``seq_len`` (default 2·kv + queries + 4 = 3·kv + 4: 16 for kv = 4, 52 for kv = 16). The target
at a query position is that key's value (``logits[:, t]`` is scored against ``targets[:, t]``, the
model reads the key and names its value); every other target is -100 (ignored). Train set
``n_train`` = 4,096 sequences with seed = the run seed, test set ``n_test`` = 1,024 with seed +
999; ``n_train = 0`` draws a fresh batch for every step instead (:class:`FreshMQARBatches`: no
sequence is seen twice, so the model cannot memorise its way to a low loss).

**Accuracy** (:func:`accuracy`) = argmax over *all* logits equals the value, pooled over the query
positions only, and per query. Chance = 1 / vocab_kv; the two levels that need no key-value binding
(a random value of the context; the same among the values not yet queried) are
:attr:`MQARTask.context_guess` and :attr:`MQARTask.elimination_guess`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.training.batches import BatchSource

PAD = 0
IGNORE = -100
FIRST_KEY = 2


@dataclass(frozen=True)
class MQARTask:
    """One MQAR setting; ``queries`` None = kv, ``seq_len`` None = 2·kv + queries + 4."""

    kv: int = 4
    vocab_kv: int = 64
    queries: int | None = None
    seq_len: int | None = None
    n_train: int = 4096
    n_test: int = 1024
    test_seed_offset: int = 999

    @property
    def n_queries(self) -> int:
        return self.kv if self.queries is None else self.queries

    @property
    def length(self) -> int:
        return 2 * self.kv + self.n_queries + 4 if self.seq_len is None else self.seq_len

    @property
    def vocab_size(self) -> int:
        return 2 * self.vocab_kv + 2

    @property
    def first_value(self) -> int:
        return FIRST_KEY + self.vocab_kv

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the values."""
        return 1.0 / self.vocab_kv

    @property
    def context_guess(self) -> float:
        """Expected accuracy of answering with a uniformly drawn one of the kv values in the
        context (no key-value binding): (1 + (kv - 1) / vocab_kv) / kv, values being drawn with
        replacement."""
        return (1 + (self.kv - 1) / self.vocab_kv) / self.kv

    @property
    def elimination_guess(self) -> float:
        """Expected accuracy of the same guess restricted to the values not yet queried (every key
        is queried at most once, so the j-th query has kv - j candidates left): still no binding."""
        left = [self.kv - j for j in range(self.n_queries)]
        return sum((1 + (r - 1) / self.vocab_kv) / r for r in left) / len(left)

    def validate(self) -> MQARTask:
        for name in ("kv", "vocab_kv", "n_queries", "length", "n_test"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MQAR {name} must be a positive integer, got {value!r}")
        if not isinstance(self.n_train, int) or isinstance(self.n_train, bool) or self.n_train < 0:
            raise ValueError(
                f"MQAR n_train must be a non-negative integer (0 = a fresh batch every step), got {self.n_train!r}"
            )
        if self.kv > self.vocab_kv:
            raise ValueError(f"kv ({self.kv}) needs that many distinct keys; vocab_kv is {self.vocab_kv}")
        if self.n_queries > self.kv:
            raise ValueError(f"queries ({self.n_queries}) cannot exceed kv ({self.kv})")
        if self.length < 2 * self.kv + self.n_queries:
            raise ValueError(
                f"seq_len {self.length} is shorter than the {2 * self.kv} pair tokens + {self.n_queries} queries"
            )
        return self


def generate(task: MQARTask, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of ``task`` from ``default_rng(seed)``: (inputs, targets) int64 [n, length]."""
    task.validate()
    kv, q, vkv = task.kv, task.n_queries, task.vocab_kv
    rng = np.random.default_rng(seed)
    inputs = np.full((n, task.length), PAD, dtype=np.int64)
    targets = np.full((n, task.length), IGNORE, dtype=np.int64)
    key_pool = np.arange(FIRST_KEY, FIRST_KEY + vkv)
    for i in range(n):
        keys = rng.choice(key_pool, size=kv, replace=False)
        values = rng.integers(task.first_value, task.first_value + vkv, size=kv)
        order = rng.permutation(kv)[:q]
        inputs[i, 0 : 2 * kv : 2] = keys
        inputs[i, 1 : 2 * kv : 2] = values
        inputs[i, 2 * kv : 2 * kv + q] = keys[order]
        targets[i, 2 * kv : 2 * kv + q] = values[order]
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def train_set(task: MQARTask, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return generate(task, task.n_train, seed)


def test_set(task: MQARTask, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return generate(task, task.n_test, seed + task.test_seed_offset)


class FreshMQARBatches(BatchSource):
    """The training batches for ``n_train = 0``: ``batch_size`` new sequences of ``task`` from
    ``default_rng([seed, step, micro])`` (never the test set's generator, an integer seed)."""

    def __init__(self, task: MQARTask, batch_size: int):
        self.task, self.batch_size = task, batch_size

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return generate(self.task, self.batch_size, [seed, step, micro])


@torch.no_grad()
def accuracy(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 1024, scored_only: bool = False
) -> dict:
    """Argmax over all logits against the targets, pooled over the scored (query) positions only,
    and per query (``by_query[j]``: the j-th scored position of the sequences, in order); ``ce``: the mean
    cross-entropy (nats) of the values at those positions, in float32.
    ``scored_only``: the model's head runs at the scored positions only (``logits_at``, which every
    registered model takes; the study's own arms do not)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    col_correct = torch.zeros(inputs.shape[1], dtype=torch.long)
    col_total = torch.zeros(inputs.shape[1], dtype=torch.long)
    ce_sum = 0.0
    try:
        with torch.no_grad():
            for i in range(0, inputs.shape[0], batch_size):
                x, y = inputs[i : i + batch_size].to(device), targets[i : i + batch_size].to(device)
                scored = y != IGNORE
                if scored_only:
                    logits = model(x, step=None, logits_at=scored).logits
                else:
                    logits = model(x, step=None).logits[scored]
                hits = torch.zeros_like(scored)
                hits[scored] = logits.argmax(dim=-1) == y[scored]
                ce_sum += float(F.cross_entropy(logits.float(), y[scored], reduction="sum"))
                col_correct += hits.sum(0).cpu()
                col_total += scored.sum(0).cpu()
    finally:
        model.train(was_training)
    correct, total = int(col_correct.sum()), int(col_total.sum())
    cols = col_total > 0
    by_query = (col_correct[cols].double() / col_total[cols].double()).tolist()
    return {
        "acc": correct / total if total else float("nan"),
        "correct": correct,
        "total": total,
        "by_query": by_query,
        "ce": ce_sum / total if total else float("nan"),
    }


def probe_train_config(*, batch_size: int, seq_len: int, seed: int, lr: float, steps: int, overrides: dict):
    """The recall probes' training settings (docs/mqar.md): AdamW at a constant ``lr``, weight decay
    0.01 on every tensor, clipping at 1.0, fp32, no sampled evaluation and no intermediate checkpoint,
    ``steps`` optimizer steps of ``batch_size`` sequences; ``overrides`` (TrainConfig fields) last."""
    from drmlab.training.config import TrainConfig

    values = dict(
        batch_size=batch_size,
        grad_accum=1,
        seq_len=seq_len,
        seed=seed,
        lr=lr,
        schedule="constant",
        weight_decay=0.01,
        decay_all_params=True,
        grad_clip=1.0,
        bf16=False,
        eval_every=0,
        eval_windows=0,
        checkpoint_every=0,
    )
    values.update(overrides)
    cfg = TrainConfig(**values)
    cfg.tokens = steps * cfg.tokens_per_step
    return cfg.validate()
