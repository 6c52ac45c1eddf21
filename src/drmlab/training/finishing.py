"""The end of a run: its summary (summary.json: counts, rate, utilisation, the last sampled validation CE, the
wall time ``elapsed``), the final evaluation of a finished run (its ``val_*`` entries, refused when
non-finite or diverged) and a study's summary entries; then the run's lock and process group are released.
"""

from __future__ import annotations

import gc
import math

from drmlab.training import distributed as dist_utils
from drmlab.training import pauses
from drmlab.training.stops import NonFiniteLossError


class Finishing:
    """The end of :class:`~drmlab.training.trainer.Trainer`, as its method."""

    def finish(self, last_step: int, final_loss: float | None) -> dict:
        """summary.json of the run (also returned, with this call's metrics ``rows``); the final evaluation
        of a finished run; the lock and the process group released."""
        cfg, main = self.cfg, self.main
        steps_done = max(self.start_step, last_step)
        session_tokens = (last_step - self.start_step) * cfg.tokens_per_step
        summary = {
            "model": self.config["model"],
            "preset": self.config["preset"],
            "seed": cfg.seed,
            "params": self.config["params"],
            "steps": steps_done,
            "total_steps": cfg.total_steps,
            "tokens": steps_done * cfg.tokens_per_step,
            "finished": steps_done >= cfg.total_steps,
            "final_loss": final_loss,
            "tokens_per_s": (session_tokens / self.train_seconds) if self.train_seconds > 0 else None,
            "train_seconds": self.train_seconds_before + self.train_seconds,
            "paused_seconds": self.paused_seconds(),
            "world_size": self.info.world_size,
        }
        steps_now = last_step - self.start_step
        if self.utilisation is not None and steps_now > 0 and self.train_seconds > 0:  # this session's mean rate
            summary.update(self.utilisation.entries(self.train_seconds / steps_now))
            summary["gemm_peak_gflops"] = self.utilisation.peak["gflops"]
        eval_rows = [r for r in self.log.rows if r["kind"] == "eval"]
        if eval_rows:
            summary["last_sampled_val_ce"] = eval_rows[-1]["val_ce"]
        if self.evaluate is not None and summary["finished"]:
            if main or self.sharded:  # a sharded forward needs every process; process 0 reports
                t0 = pauses.now()
                result = self.evaluate(self.model, self.device, self.bar is not None)
                summary.update(
                    {f"val_{k}": v for k, v in result.items() if k in ("ce", "bpb", "ppl", "targets", "bytes")}
                )
                summary["eval_seconds"] = pauses.now() - t0
                if summary.get("val_ce") is not None and not math.isfinite(summary["val_ce"]):
                    raise NonFiniteLossError(
                        f"the final evaluation gave a non-finite CE ({summary['val_ce']}) after {self._where(last_step)}: "
                        f"the weights are finite but the model's outputs are not; stopped, {self._kept()}. {self.advice}"
                    )
                self._refuse_diverged(summary.get("val_ce"), "the final validation CE", last_step)
            dist_utils.barrier(self.info)
        if self.pieces.summary_extras is not None and summary["finished"] and main:
            summary.update(self.pieces.summary_extras(summary))
        # the run's wall time: start to the end of its final evaluation, earlier sessions and evaluations
        # included, time suspended left out (pauses)
        summary["elapsed"] = self.elapsed()
        if self.run is not None and main:
            summary["out_dir"] = str(self.run.path)
            self.run.write_summary(summary)
        if self.info.enabled:
            self.net = None  # the data-parallel wrapper goes before the group it holds (dist_utils.teardown)
            gc.collect()
        dist_utils.teardown(self.info)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        return dict(summary, rows=self.log.rows)
