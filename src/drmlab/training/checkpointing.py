"""Committing a checkpoint: the weights (finite, or the run stops and the previous checkpoint stays),
the optimizer state and the step's record (:meth:`drmlab.runs.RunDir.save_checkpoint`); and the summary
of a run that stopped, so that a resume may take the advised fixes.
"""

from __future__ import annotations

import time

from drmlab.runs import non_finite_parameters
from drmlab.training import distributed as dist_utils
from drmlab.training.stops import NonFiniteLossError


class Checkpoints:
    """The checkpoints of :class:`~drmlab.training.trainer.Trainer`, as its methods."""

    def save(self, step: int) -> None:
        bad = (
            dist_utils.non_finite_parameters(self.model, self.info)
            if self.sharded
            else non_finite_parameters(self.model)
        )
        if bad:  # never commit weights that cannot be used; the previous checkpoint stays
            raise NonFiniteLossError(
                f"non-finite weights ({', '.join(bad[:3])}) after {self._where(step)}; stopped, "
                f"{self._kept()}. {self.advice}"
            )
        full_state = None
        if self.run is not None and self.sharded:  # collective: gathered on process 0
            full_state = dist_utils.gather_full_state(self.model, self.optimizer, self.info)
        if self.run is not None and self.main:
            self.run.save_checkpoint(
                self.model,
                self.optimizer,
                {
                    "step": step,
                    "tokens": step * self.cfg.tokens_per_step,
                    "elapsed": self.elapsed(),
                    "train_seconds": self.train_seconds_before + self.train_seconds,
                    "paused_seconds": self.paused_seconds(),
                    "world_size": self.info.world_size,
                    **({"metrics": self.log.committed()} if self.log is not None and self.log.path else {}),
                },
                full_state=full_state,
            )
        self.last_ckpt_step = step
        dist_utils.barrier(self.info)
        self.last_save = time.monotonic()

    def record_stop(self, reason: str, message: str) -> None:
        """A stopped (not finished) run's summary says why, so that a resume may take the advised fixes."""
        if self.run is not None and self.main:
            self.run.write_summary(
                {"finished": False, "stopped": reason, "message": message, "checkpoint_step": self.last_ckpt_step}
            )
