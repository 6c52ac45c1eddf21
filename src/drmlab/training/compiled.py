"""The compiled training forward (docs/architecture.md, "Compiled models"), as methods of
:class:`~drmlab.training.trainer.Trainer`: whether the run compiles (``cfg.compile``, or under ``"auto"`` the
choice of :mod:`drmlab.training.compile_choice`, kept in config.json's runtime), the compiled net beside the
eager one with its :class:`~drmlab.training.compile_report.CompileReport`, the one-line errors, auto's fall-back
to eager after a failed compile, and the figures a compiled run leaves for later ``auto`` runs.
"""

from __future__ import annotations

import contextlib
import sys

from drmlab.training import distributed as dist_utils
from drmlab.training.compile_choice import AUTO, CompileRecords, choose, record_key
from drmlab.training.compile_report import CompileReport
from drmlab.training.compiling import compile_errors, compile_model

# under --compile auto, a run of at least this many steps says why it stays eager (a shorter one only says so in
# config.json's runtime); a run that compiles always says so
SAY_OFF_FROM_STEPS = 500


class Compiling:
    """The compiled training forward of :class:`~drmlab.training.trainer.Trainer`, as its methods. State:
    ``eager_net`` (the uncompiled training forward while compiling, else None) and ``compile_report``."""

    eager_net = None
    compile_report: CompileReport | None = None

    @property
    def compiling(self) -> bool:
        """Whether the training forward is compiled now."""
        return self.eager_net is not None

    def _start_compiling(self, saved_runtime: dict | None) -> None:
        """Compile ``self.net`` where ``cfg.compile`` or auto's choice says so (config.json written again
        under auto, with the choice in its runtime); evaluation and checkpoints keep using ``self.model``."""
        on, eager = self._choose_compile(saved_runtime)
        if self.run is not None and self.main and self.cfg.compile == AUTO:
            self.run.write_config(self.config)
        if on:
            self.compile_report = CompileReport(
                eager if eager is not None else self._eager_seconds(), self.cfg.grad_accum
            )
            self.eager_net, self.net = self.net, compile_model(self.net)

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

    def _choose_compile(self, saved_runtime: dict | None) -> tuple[bool, float | None]:
        """(whether this run compiles, the eager pass's seconds where the choice timed it): ``cfg.compile``
        itself when true or false; under ``"auto"`` the choice a resumed run made before (``saved_runtime``),
        else :func:`~drmlab.training.compile_choice.choose`'s, process 0's in a distributed run, said in one
        line (a run that stays eager only from :data:`SAY_OFF_FROM_STEPS` steps) and recorded in config.json's
        runtime."""
        cfg = self.cfg
        if cfg.compile != AUTO:
            return bool(cfg.compile), None
        before = (saved_runtime or {}).get("compile")
        if isinstance(before, dict) and isinstance(before.get("on"), bool):
            self.config["runtime"]["compile"] = before  # a resumed run goes on as it began
            return before["on"], None
        timed: list[float | None] = []

        def eager_seconds() -> float | None:  # timed once: the compile report reuses it
            timed.append(self._eager_seconds())
            return timed[-1]

        steps = cfg.total_steps - self.start_step
        choice = choose(
            str(self.config["model"]),
            key=self._compile_key(),
            device=self.device,
            precision="bf16" if cfg.bf16 else "float32",
            steps=steps,
            grad_accum=cfg.grad_accum,
            eager_seconds=eager_seconds,
            records=CompileRecords.default(),
        )
        on = choice.on
        if self.info.enabled:  # process 0 decides for all (another node may hold other records)
            on = dist_utils.all_reduce_max([1.0 if (on and self.main) else 0.0], self.info, self.device)[0] > 0.5
        self.config["runtime"]["compile"] = {**choice.as_record(), "on": on}
        if self.main and not self.quiet and (on or steps >= SAY_OFF_FROM_STEPS):  # a short run stays eager quietly
            print(choice.why, file=sys.stderr, flush=True)
        return on, (timed[-1] if timed else None)

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

    def _compile_fell_back(self, exc: Exception) -> None:
        """Under ``compile="auto"``: the compile failed, so the run goes on eager, said in one line and
        recorded in config.json's runtime."""
        self.optimizer.zero_grad(set_to_none=True)
        self.net, self.eager_net, self.compile_report = self.eager_net, None, None
        choice = self.config["runtime"].get("compile") or {}
        self.config["runtime"]["compile"] = {**choice, "on": False, "failed": str(exc)}
        if self.run is not None and self.main:
            self.run.write_config(self.config)
        if self.main:
            print(f"compile: off (auto): {exc}; training {self.config['model']} eager", file=sys.stderr, flush=True)

    def _compile_errors(self):
        """While compiling: a model that cannot compile raises CompileError naming the operation."""
        return compile_errors(str(self.config["model"])) if self.compiling else contextlib.nullcontext()
