"""What a study is and how it runs, as two frozen values (docs/drm.md section A.7 for the protocol).

:class:`StudySpec` is the ablation protocol's study as asked for: models, seeds, preset, token budget,
train settings, per-model settings, data, and the learning-rate sweep. Planning it
(:func:`drmlab.experiments.ablate.protocol.plan_study`) checks every name and setting and resolves the
train config; the planned study is what ``study.json`` records. The loop study's spec
(:class:`drmlab.experiments.loop.study.LoopSpec`) extends it; the MQAR protocols have specs of their own
beside their studies (:class:`drmlab.experiments.mqar.study.MQARSpec`,
:class:`drmlab.experiments.mqar.distance.DistanceSpec`), on the common :class:`Spec` base.

:class:`Runtime` is how a study runs and never what it computes: device, CPU threads, progress bars,
TensorBoard files, the tokenized-corpus cache, the progress log. Every study's entry point is
``run_study(spec, runtime, out)``. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

Log = Callable[[str], None]

# How often a process that waits for runs held by another process looks again (seconds).
WAIT_SECONDS = 30.0


def _silent(message: str) -> None:
    pass


@dataclass(frozen=True)
class Runtime:
    """How a study runs: none of these changes what a run computes (the thread count only its last bits)."""

    device: str = "auto"  # auto (CUDA if available), cpu, cuda, cuda:1 ...
    threads: int | None = None  # torch's CPU threads (None: leave torch's setting)
    quiet: bool = True  # no progress bars
    tensorboard: bool = False  # also write each run's metrics as TensorBoard event files
    cache_dir: str | None = None  # where tokenized corpora are cached
    log: Log | None = field(default=None, compare=False)  # one line per run: skipped, resuming, its score
    wait_seconds: float = WAIT_SECONDS  # between looks at runs another process holds
    leave_held: bool = False  # exit, not wait, once every run left is held by (or waits on) another process

    def __post_init__(self):
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads <= 0
        ):
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")

    def say(self, message: str) -> None:
        """Send one progress line to ``log`` (nothing without one)."""
        (self.log or _silent)(message)

    def apply_threads(self) -> None:
        """Set torch's intra-op threads when ``threads`` is given."""
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)


class Spec:
    """The common base of the study specs: frozen dataclasses whose list fields are kept as tuples and
    whose mapping fields are copied, so a spec is a value that no caller can change under a study."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
            elif isinstance(value, dict):
                object.__setattr__(self, f.name, {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()})

    def replace(self, **changes):
        """A copy with ``changes`` (:func:`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)


DEFAULT_MODELS = ("J", "SSM_CONTROL", "GPT2")
DEFAULT_SEEDS = (1, 2, 3)


@dataclass(frozen=True)
class StudySpec(Spec):
    """A study of the paired ablation protocol: every model trains once per seed under one train config.

    ``models``: registered names or ``NAME:ARM`` (or labels of ``registry_names``, which maps a label to
    the registered model it builds). ``tokens``: the budget per run (None: the protocol's default).
    ``train``: TrainConfig settings for every run (not ``seed``: the seeds are the study's).
    ``model_settings``: label -> model-config settings of that model only. ``lr_grid``: sweep these rates
    per model first (first seed, ``tune_tokens`` tokens each, default the budget), then run its seeds at
    its best rate; instead of ``train["lr"]``. ``rates``: label -> the rate of its paired runs (a finished
    sweep's choices, e.g. to train the same models in another setting at the rates chosen before); instead
    of ``train["lr"]`` and ``lr_grid``.
    """

    models: tuple = DEFAULT_MODELS
    seeds: tuple = DEFAULT_SEEDS
    preset: str = "tiny"
    tokens: int | str | None = None
    train: dict = field(default_factory=dict)
    model_settings: dict = field(default_factory=dict)
    data: str | None = None  # a file, folder, glob or hf:NAME (None: the embedded corpus)
    tokenizer: str = "bytes"
    lr_grid: tuple | str | None = None
    tune_tokens: int | str | None = None
    registry_names: dict = field(default_factory=dict)
    rates: dict | None = None
