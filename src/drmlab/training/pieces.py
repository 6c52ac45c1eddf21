"""What a study may swap in the training loop (docs/architecture.md, "One trainer"): the
loss, the optimizer, evaluation hooks at given steps and the summary of a finished run. Every piece
left out keeps the language-model default, so ``train(model, stream, val, cfg)`` is unchanged.

A study brings its batches as a :class:`~drmlab.training.batches.BatchSource` (a mixed source with
its own random streams is just another source) and these pieces as one :class:`TrainPieces`; the
trainer keeps the step, the non-finite guards, checkpoints, resume and the signal handling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

# loss_fn(model, (inputs, targets), step) -> (loss, entries): the loss to differentiate and the entries
# of the step's metrics row; a tensor entry is averaged over the micro-batches (and the processes),
# any other value (a name, a count, None) is the last micro-batch's. The default gives {"ce": CE}.
LossFn = Callable[[torch.nn.Module, tuple, int], tuple[torch.Tensor, dict]]
# optimizer_builder(model, cfg) -> optimizer. Each parameter group keeps the "lr" it is built with as
# its own base rate: the schedule (drmlab.training.optim.lr_at) runs from that rate, not cfg.lr.
OptimizerBuilder = Callable[[torch.nn.Module, object], torch.optim.Optimizer]

ADVICE = "Try a lower lr or a warm-up (warmup_fraction=0.05)."


@dataclasses.dataclass(frozen=True)
class EvalHook:
    """``run(model, step) -> entries`` after each step in ``steps`` (step 0: before the first step of a
    fresh run), with the uncompiled model; the row ``{"kind": kind, "step": step, **entries}`` goes to
    metrics.jsonl. The checkpoint of a hook's step is committed before the hook runs, so when a run
    is resumed from that checkpoint and its row is missing (the hook was killed), the hook runs again
    first."""

    kind: str
    steps: frozenset
    run: Callable[[torch.nn.Module, int], dict]

    def __post_init__(self):
        object.__setattr__(self, "steps", frozenset(int(s) for s in self.steps))


@dataclasses.dataclass(frozen=True)
class TrainPieces:
    """The swappable pieces of a run, each optional.

    ``loss_fn`` (:data:`LossFn`; default: next-token CE plus the model's ``loss_aux``),
    ``optimizer_builder`` (:data:`OptimizerBuilder`; default :func:`drmlab.training.optim.build_optimizer`),
    ``hooks`` (:class:`EvalHook`), ``summary_extras(summary) -> entries`` added to a finished run's
    summary after its final evaluation, and ``advice``, the fix a non-finite stop suggests."""

    loss_fn: LossFn | None = None
    optimizer_builder: OptimizerBuilder | None = None
    hooks: tuple = ()
    summary_extras: Callable[[dict], dict] | None = None
    advice: str = ADVICE

    @property
    def hook_steps(self) -> frozenset:
        return frozenset().union(*(hook.steps for hook in self.hooks))
