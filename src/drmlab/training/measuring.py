"""What a run measures of itself before its first step: the counted FLOPs of a step and this machine's
GEMM peak (:mod:`drmlab.training.utilisation`, recorded in config.json's runtime), under ``compile`` the
time of one eager pass (:mod:`drmlab.training.compile_report`), and under ``compile="auto"`` whether to
compile (:mod:`drmlab.training.compile_choice`, recorded in config.json's runtime as ``compile``).
"""

from __future__ import annotations

import sys

import torch

from drmlab.runs import jsonable
from drmlab.training import distributed as dist_utils
from drmlab.training.compile_choice import AUTO, CompileRecords, choose, record_key
from drmlab.training.compile_report import time_eager_pass
from drmlab.training.utilisation import Utilisation, count_step_flops, gemm_peak_gflops

# under --compile auto, a run of at least this many steps says why it stays eager (a shorter one only says so in
# config.json's runtime); a run that compiles always says so
SAY_OFF_FROM_STEPS = 500


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

    def _compile_key(self) -> str:
        """The shape a compiled run's figures hold for (:func:`drmlab.training.compile_choice.record_key`)."""
        cfg = self.cfg
        rows = cfg.batch_size // max(1, self.info.world_size) if self.info.enabled else cfg.batch_size
        return record_key(
            str(self.config["model"]),
            self.config.get("model_config"),
            (rows, cfg.seq_len),
            "bf16" if cfg.bf16 else str(next(self.model.parameters()).dtype).replace("torch.", ""),
            self.device,
        )

    def _choose_compile(self, saved_runtime: dict | None) -> bool:
        """Whether this run compiles: ``cfg.compile`` itself when true or false; under ``"auto"`` the choice a
        resumed run made before (``saved_runtime``), else :func:`~drmlab.training.compile_choice.choose`'s,
        process 0's in a distributed run, said in one line and recorded in config.json's runtime."""
        cfg = self.cfg
        if cfg.compile != AUTO:
            return bool(cfg.compile)
        before = (saved_runtime or {}).get("compile")
        if isinstance(before, dict) and isinstance(before.get("on"), bool):
            self.config["runtime"]["compile"] = before  # a resumed run goes on as it began
            return before["on"]
        timed: list[float | None] = []

        def eager_seconds() -> float | None:  # timed once: the compile report reuses it (eager_timed)
            timed.append(self._eager_seconds())
            return timed[-1]

        choice = choose(
            str(self.config["model"]),
            key=self._compile_key(),
            device=self.device,
            precision="bf16" if cfg.bf16 else "float32",
            steps=cfg.total_steps - self.start_step,
            grad_accum=cfg.grad_accum,
            eager_seconds=eager_seconds,
            records=CompileRecords.default(),
        )
        self.eager_timed = timed[-1] if timed else None
        on = choice.on
        if self.info.enabled:  # process 0 decides for all (another node may hold other records)
            on = dist_utils.all_reduce_max([1.0 if (on and self.main) else 0.0], self.info, self.device)[0] > 0.5
        self.config["runtime"]["compile"] = {**choice.as_record(), "on": on}
        steps = cfg.total_steps - self.start_step
        if self.main and not self.quiet and (on or steps >= SAY_OFF_FROM_STEPS):  # a short run stays eager quietly
            print(choice.why, file=sys.stderr, flush=True)
        return on

    def _record_compile(self, row: dict) -> None:
        """A compiled run's measured figures (its ``compile`` row), kept for later ``--compile auto`` runs."""
        if row.get("eager_ms") is None or row.get("compiled_ms") is None or row.get("compile_seconds") is None:
            return
        CompileRecords.default().add(
            self._compile_key(),
            eager_seconds=row["eager_ms"] / 1e3,
            compiled_seconds=row["compiled_ms"] / 1e3,
            compile_seconds=row["compile_seconds"],
        )
