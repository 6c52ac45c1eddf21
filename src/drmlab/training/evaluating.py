"""The evaluations during and after training: the sampled validation CE of fixed windows (a row of
metrics.jsonl every ``eval_every``, with the model's geometry diagnostics, :mod:`drmlab.training.diagnostics`),
a study's evaluation hooks at their steps (:class:`~drmlab.training.pieces.EvalHook`), and the final
evaluation (:data:`Evaluate`) at each token milestone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from drmlab.training import distributed as dist_utils
from drmlab.training import pauses
from drmlab.training.diagnostics import WINDOWS as DIAGNOSTIC_WINDOWS
from drmlab.training.diagnostics import evaluation_diagnostics
from drmlab.training.stops import NonFiniteLossError

# evaluate(model, device, progress) -> {"ce", "bpb", "ppl", "targets", "bytes", ...}: the final
# evaluation of a finished run (for a language model, drmlab.evaluation.rescorer's rescoring).
Evaluate = Callable[[torch.nn.Module, torch.device, bool], dict]


@torch.no_grad()
def sampled_eval(model: torch.nn.Module, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token CE (nats) over the fixed validation ``windows`` [n, T + 1]; fp32, eval mode, step=None."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, windows.shape[0], batch_size):
            rows = windows[i : i + batch_size].to(device)
            logits = model(rows[:, :-1], step=None).logits.float()
            total += float(
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum")
            )
            count += rows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / max(count, 1)


class Evaluations:
    """The evaluations of :class:`~drmlab.training.trainer.Trainer`, as its methods."""

    def run_hooks(self, step: int, missing_only: bool = False) -> None:
        """The evaluation hooks of ``step``, each row to metrics.jsonl; ``missing_only``: those whose row
        the resumed run's kept metrics lack (a hook killed after the checkpoint of its step)."""
        for hook in self.pieces.hooks:
            if step not in hook.steps or (missing_only and (hook.kind, step) in self.kept_rows):
                continue
            if self.main or self.sharded:  # a sharded forward needs every process; process 0 logs
                entries = hook.run(self.model, step)
                if self.main:
                    self.log.log({"kind": hook.kind, "step": step, **entries})
            dist_utils.barrier(self.info)

    def milestone_evaluation(self, step: int) -> None:
        """The final evaluation (the whole rescoring) at a milestone, as a ``milestone`` metrics row."""
        if self.main or self.sharded:
            t0 = pauses.now()
            result = self.evaluate(self.model, self.device, False)
            if self.main:
                self.log.log(
                    {
                        "kind": "milestone",
                        "step": step,
                        "tokens": step * self.cfg.tokens_per_step,
                        **{f"val_{k}": v for k, v in result.items() if k in ("ce", "bpb", "targets")},
                        "eval_seconds": pauses.now() - t0,
                        "elapsed": self.elapsed(),
                    }
                )
        dist_utils.barrier(self.info)

    def sampled_evaluation(self, step: int) -> None:
        if self.eval_windows is None:
            return
        if self.main or self.sharded:  # a sharded forward needs every process
            val_ce = sampled_eval(self.model, self.eval_windows, self.cfg.eval_batch_size, self.device)
        if self.main:
            row = {
                "kind": "eval",
                "step": step,
                "tokens": step * self.cfg.tokens_per_step,
                "val_ce": val_ce,
                "val_windows": int(self.eval_windows.shape[0]),
                "elapsed": self.elapsed(),
            }
            if not self.sharded and math.isfinite(val_ce):  # the model's geometry (DRM) on the first windows
                diagnostics = evaluation_diagnostics(self.model, self.eval_windows[:DIAGNOSTIC_WINDOWS], self.device)
                if diagnostics:
                    row["diagnostics"] = diagnostics
            self.log.log(row)
            if self.bar is not None:
                self.bar.set_postfix_str(f"{self.bar.postfix or ''} val {val_ce:.3f}".strip())
        if (self.main or self.sharded) and not math.isfinite(val_ce):
            raise NonFiniteLossError(
                f"non-finite sampled validation CE ({val_ce}) after {self._where(step)}; "
                f"stopped, {self._kept()}. {self.advice}"
            )
        if self.main or self.sharded:
            self._refuse_diverged(val_ce, "the sampled validation CE", step)
        dist_utils.barrier(self.info)
