"""Training and evaluation batches as pure functions of their coordinates.

The rows of the micro-batch ``micro`` of optimizer step ``step`` are windows of ``seq_len + 1``
tokens starting at uniform random offsets of the training stream, drawn from
``numpy.random.default_rng([seed, step, micro])`` (no epochs, no document alignment, as in the
reference). Nothing is carried between steps, so a resumed run sees exactly the batches it would
have seen, every model trained with a seed sees the same batches in the same order, and under
``torchrun`` each process takes its contiguous share of the same global micro-batch.
"""

from __future__ import annotations

import numpy as np
import torch

from drmlab.training.config import TrainConfig

# The sampled in-training evaluation uses one fixed set of validation windows for every model,
# seed and step (seeded with this constant), so the curves of different runs are paired.
EVAL_SAMPLE_SEED = 100_000


def window_starts(seed: int, step: int, micro: int, rows: int, seq_len: int, stream_len: int) -> np.ndarray:
    """The ``rows`` start offsets of micro-batch ``micro`` of step ``step`` (int64)."""
    high = stream_len - seq_len  # a window spans [start, start + seq_len] inclusive
    if high <= 0:
        raise ValueError(f"the training stream ({stream_len} tokens) is shorter than one window of {seq_len + 1}")
    rng = np.random.default_rng([seed, step, micro])
    return rng.integers(0, high, size=rows, dtype=np.int64)


def gather_windows(stream: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
    """Rows ``stream[s : s + length]`` for each start, as an int64 tensor [len(starts), length]."""
    index = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]
    return torch.from_numpy(np.asarray(stream[index], dtype=np.int64))


def train_batch(
    stream: np.ndarray,
    *,
    seed: int,
    step: int,
    micro: int,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world_size: int = 1,
) -> torch.Tensor:
    """This process's rows [batch_size / world_size, seq_len + 1] of the global micro-batch."""
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by the number of processes {world_size}")
    starts = window_starts(seed, step, micro, batch_size, seq_len, len(stream))
    share = batch_size // world_size
    return gather_windows(stream, starts[rank * share : (rank + 1) * share], seq_len + 1)


def eval_sample(stream: np.ndarray, windows: int, seq_len: int) -> torch.Tensor:
    """The fixed validation windows [n, seq_len + 1] of the sampled evaluation (same for every run). More
    windows than the stream holds side by side (or than the default 32, for a stream holding fewer) would only
    score its tokens again, at any cost: refused, naming the setting and the largest value."""
    length = min(seq_len, len(stream) - 1)
    if windows <= 0 or length <= 0:
        return torch.zeros(0, max(length, 0) + 1, dtype=torch.int64)
    largest = max((len(stream) - 1) // length, TrainConfig.eval_windows)
    if windows > largest:
        raise ValueError(
            f"eval_windows={windows}: the validation stream ({len(stream):,} tokens) holds {largest:,} windows of "
            f"{length}; the sampled evaluation takes at most that many: --set eval_windows={largest} (the final "
            "evaluation scores the whole stream)"
        )
    starts = np.random.default_rng(EVAL_SAMPLE_SEED).integers(0, len(stream) - length, size=windows, dtype=np.int64)
    return gather_windows(stream, starts, length + 1)


# ---------------------------------------------------------------- batch sources


class BatchSource:
    """Where a run's training batches come from: a pure function of (seed, step, micro).

    ``global_batch(seed, step, micro)`` gives every process's rows together as (inputs [B, T],
    targets [B, T]); :meth:`batch` takes this process's contiguous share. Logits at t are scored
    against targets[:, t]; a target equal to ``IGNORE_INDEX`` is not scored. Token counts of a run
    count positions, B x T, scored or not.
    """

    IGNORE_INDEX = -100

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def batch(
        self, seed: int, step: int, micro: int, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = (torch.as_tensor(t).long() for t in self.global_batch(seed, step, micro))
        if inputs.dim() != 2 or inputs.shape != targets.shape:
            raise ValueError(
                f"{type(self).__name__} must give inputs and targets of one shape [B, T], got "
                f"{tuple(inputs.shape)} and {tuple(targets.shape)}"
            )
        rows = inputs.shape[0]
        if rows % world_size:
            raise ValueError(
                f"{type(self).__name__} gave {rows} rows, not divisible by the number of processes {world_size}"
            )
        share = rows // world_size
        return inputs[rank * share : (rank + 1) * share], targets[rank * share : (rank + 1) * share]


class LMWindows(BatchSource):
    """Language-model windows of a token stream (:func:`train_batch`), scored against the next token."""

    def __init__(self, stream: np.ndarray, batch_size: int, seq_len: int):
        self.stream, self.batch_size, self.seq_len = stream, batch_size, seq_len

    def batch(
        self, seed: int, step: int, micro: int, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        window = train_batch(
            self.stream,
            seed=seed,
            step=step,
            micro=micro,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            rank=rank,
            world_size=world_size,
        )
        return window[:, :-1], window[:, 1:]

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch(seed, step, micro)


class FixedSetBatches(BatchSource):
    """``batch_size`` rows drawn with replacement from a fixed set (inputs, targets), from
    ``numpy.random.default_rng([seed, step, micro])`` (a probe task's training set)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int):
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(
            np.random.default_rng([seed, step, micro]).integers(0, self.inputs.shape[0], size=self.batch_size)
        )
        return self.inputs[rows], self.targets[rows]
