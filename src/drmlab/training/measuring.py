"""What a run measures of itself before its first step: the counted FLOPs of a step and this machine's
GEMM peak (:mod:`drmlab.training.utilisation`, recorded in config.json's runtime), and when compiling (or
choosing whether to) the time of one eager pass (:mod:`drmlab.training.compile_report`).
"""

from __future__ import annotations

import sys

import torch

from drmlab.runs import jsonable
from drmlab.training.compile_report import time_eager_pass
from drmlab.training.utilisation import Utilisation, count_step_flops, gemm_peak_gflops


class Measurements:
    """The measurements of :class:`~drmlab.training.trainer.Trainer`, as its methods."""

    def _measure_utilisation(self) -> Utilisation | None:
        """The counted FLOPs of a step and this machine's GEMM peak (:mod:`drmlab.training.utilisation`),
        recorded in config.json's runtime; None in a distributed run, or (said in one line) where the
        count fails -- a measurement, never a reason to stop training."""
        if self.info.enabled:
            return None
        cfg, step = self.cfg, self.start_step + 1
        try:
            inputs, targets = self.batches.batch(cfg.seed, step, 0)
            batch = (inputs.to(self.device), targets.to(self.device))
            flops = count_step_flops(self.model, self.loss_fn, batch, step, cfg.batch_size * cfg.grad_accum)
            dtype = torch.bfloat16 if cfg.bf16 else next(self.model.parameters()).dtype
            utilisation = Utilisation(flops, gemm_peak_gflops(self.device, dtype))
        except Exception as exc:  # noqa: BLE001 -- a diagnostic; the run goes on without it
            print(f"note: no FLOP count for this run ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        if self.run is not None and self.main:
            self.config["runtime"]["utilisation"] = jsonable(utilisation.record())
        return utilisation

    def _eager_seconds(self) -> float | None:
        """Before compiling: one eager forward and backward of the next step's first micro-batch, timed
        and undone (compile_report.time_eager_pass); None in a distributed run (its collectives would
        be timed too)."""
        if self.info.enabled:
            return None
        cfg, step = self.cfg, self.start_step + 1
        inputs, targets = self.batches.batch(cfg.seed, step, 0, self.info.rank, self.info.world_size)
        batch = (inputs.to(self.device), targets.to(self.device))

        def run_pass():
            self.net.train()
            loss, _ = self.loss_fn(self.net, batch, step)
            (loss / cfg.grad_accum).backward()

        return time_eager_pass(run_pass, self.model, self.device)
