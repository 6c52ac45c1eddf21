"""How a run stops, and what it says: each stop leaves the last committed checkpoint loadable and finite.

A non-finite loss, gradient norm or weight, or a linear-algebra failure inside the model, raises
:class:`NonFiniteLossError` (before the optimizer touches the weights); a loss ``divergence_nats`` above
the uniform guess ln(vocab) for ``divergence_steps`` steps in a row, or a validation CE above it at any
evaluation, raises :class:`DivergenceError` (:class:`Guards`); SIGINT or SIGTERM finish the current step,
commit a checkpoint and raise :class:`TrainingInterrupted`, and a second such signal stops at once
(:class:`StoppedAtOnce`, :func:`stop_on_signals`). Each message names the step, the kept checkpoint and
what to try.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class NonFiniteLossError(RuntimeError):
    """The loss, the gradient norm or the weights became NaN or infinite, or the model's linear
    algebra failed; the message names the step, the kept checkpoint and what to try."""


class DivergenceError(NonFiniteLossError):
    """The loss stayed far above the uniform guess for ``divergence_steps`` steps in a row."""


class StoppedAtOnce(KeyboardInterrupt):
    """A second SIGINT or SIGTERM: the run stops without finishing its step; ``exit_code`` is 128 + the signal,
    as a shell reports a process the signal ended, and the message says what is kept."""

    def __init__(self, signum: int, kept: str):
        super().__init__(f"{signal.Signals(signum).name} received twice: stopped at once, {kept}")
        self.exit_code = 128 + signum


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a committed checkpoint; ``signal`` and ``step`` say which and where."""

    def __init__(self, message: str, signum: int, step: int):
        super().__init__(message)
        self.signal, self.step = signum, step


class Guards:
    """The divergence guard and the words of every stop, as methods of :class:`~drmlab.training.trainer.Trainer`
    (which holds ``cfg``, ``uniform_ce``, ``diverging_steps``, ``run``, ``last_ckpt_step`` and ``advice``)."""

    def _check_divergence(self, step: int, loss: float) -> None:
        cfg = self.cfg
        if self.uniform_ce is None or not cfg.divergence_steps:
            return
        self.diverging_steps = self.diverging_steps + 1 if loss > self.uniform_ce + cfg.divergence_nats else 0
        if self.diverging_steps >= cfg.divergence_steps:
            raise DivergenceError(
                f"the loss diverged: {loss:.4f} at {self._where(step)}, above the uniform guess "
                f"{self.uniform_ce:.4f} + {cfg.divergence_nats:g} nats for {self.diverging_steps} steps "
                f"in a row; stopped, {self._kept()}. {self.advice}"
            )

    def _refuse_diverged(self, ce: float | None, what: str, step: int) -> None:
        """A validation CE above the uniform guess + ``divergence_nats`` ends the run as diverged, however short
        it is (the loss check needs ``divergence_steps`` steps in a row; a short run never reaches them)."""
        if ce is None or self.uniform_ce is None or ce <= self.uniform_ce + self.cfg.divergence_nats:
            return
        raise DivergenceError(
            f"the run diverged: {what} is {ce:.4f} nats/token after {self._where(step)}, above the "
            f"uniform guess {self.uniform_ce:.4f} + {self.cfg.divergence_nats:g} nats; stopped, "
            f"{self._kept()}. {self.advice}"
        )

    def _where(self, step: int) -> str:
        return f"step {step} ({(step - 1) * self.cfg.tokens_per_step:,} tokens trained)"

    def _kept(self) -> str:
        if self.run is not None and self.last_ckpt_step is not None:
            return f"the last good checkpoint (step {self.last_ckpt_step}) is in {self.run.path}"
        return "no checkpoint was written"


@contextlib.contextmanager
def stop_on_signals(trainer, during: str | None = None):
    """While training (main thread only), SIGINT and SIGTERM ask the trainer to stop after the
    current step; a second signal of the same kind stops at once. ``during`` names a phase after the
    last checkpoint (the final evaluation) that a signal stops at once: nothing of the training is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if during is not None:
            raise TrainingInterrupted(
                f"{signal.Signals(signum).name} received during {during}: stopped it; {trainer._kept()}",
                signum,
                trainer.last_ckpt_step or 0,
            )
        if trainer.stop_signal == signum:  # asked twice: do not wait for the step
            raise StoppedAtOnce(signum, trainer._kept())
        trainer.stop_signal = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
