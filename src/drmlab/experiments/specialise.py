r"""The specialisation recipe (docs/mqar.md section 9; the upstream ASM-CM recipe restated in
``shared/notes/upstream-asm.md`` section 4): turn a trained J_NO_DIRECTION run into an ASM_CM run
that recalls over long distances, without losing its language modelling.

**Student and teacher** (:func:`load_base`, :func:`build_student`). The student is ASM_CM built at
the base run's preset, vocabulary and overrides. From a J_NO_DIRECTION base every parameter except
``fast_weight_memory.*`` is copied and the memory keeps its initialisation, whose read-out W_o = 0
makes the student's logits equal the base's bit for bit before the first step; from an ASM_CM base
everything is copied. The teacher is the base model itself, frozen (eval mode, no gradients).
Any other family is refused in one line.

**Curriculum** (:func:`parse_curriculum`). Stages ``length:steps``, by default 40:1000, 80:500,
160:500, 320:300, 512:200, 1024:100, 4096:25 (2,625 optimizer steps); ``steps_scale`` multiplies
every stage's steps (rounded, at least 1) for smaller budgets. Global step k (from 1) of a stage of
length L is, with three independent random streams keyed by the step (so a resumed run draws the
very batches an uninterrupted one draws):

* a coin from ``default_rng([seed, k])``: with probability 0.8 a **language batch** -- one window
  of 128 + 1 tokens of the corpus's training split at an offset from ``default_rng([seed + 1, k, 0])``
  (:func:`drmlab.training.batches.window_starts`) -- scored as

      CE(student) + 0.5 T^2 KL(softmax(teacher / T) || softmax(student / T)) / #tokens,   T = 2

  (:func:`language_loss`; the KL summed over the vocabulary, divided by the 128 positions);
* else an **MQAR batch** of the distance protocol at length L (:mod:`drmlab.experiments.mqar.distance`:
  its example generator from ``default_rng([seed + 2, k, 0])``), 4 examples if L < 512, 2 if
  512 <= L < 1024, 1 from 1024 up (:func:`mqar_batch_size`), scored by the CE on the 8 query
  positions only (:func:`mqar_loss`).

Both models run at ``step=None`` (full naturalization strength, as every evaluation does: the
base has finished its training). **Optimizer** (:func:`build_optimizer`): AdamW, weight decay 0.01,
two parameter groups at constant rates -- the backbone at 1e-5, the memory (``fast_weight_memory.*``)
at 1e-4 -- gradients clipped to norm 1.0; a non-finite loss or gradient stops the run before the
update with :class:`~drmlab.training.trainer.NonFiniteLossError`, one line naming the step.

**Evaluations.** After each stage the student reads every curriculum length up to the stage's
(:func:`drmlab.experiments.mqar.distance.read_length`: accuracy over the 8 scored positions with
a Wilson 95% interval, one parallel forward per batch); by default 32 batches of that length's MQAR
batch size (``eval_sequences`` fixes the count instead). A stage passes when every length read is
at >= 80%; the recipe passes when the last stage does (every curriculum length). The language CE
of the student before the first step and after the last is the deterministic rescoring of the
validation split (:func:`drmlab.evaluation.rescore`, the base run's window and batch, capped by
``eval_tokens``); the upstream gate allows a regression of at most 0.05 nats.

**Output.** An ordinary run directory (:class:`drmlab.runs.RunDir`): ``config.json`` naming ASM_CM,
its preset and overrides, so ``drmlab eval``, ``generate``, ``export`` and ``mqar --protocol
distance --ckpt`` load it with :func:`drmlab.runs.load_run_model`; ``metrics.jsonl`` (a row per
step); the checkpoint through RunDir's atomic commit (every ``checkpoint_every`` steps and at the
end of each stage, before its evaluation); ``specialise.json`` (settings, base, stage results,
language CE before and after, verdicts); ``summary.json`` when finished. A killed run continues from
its last checkpoint when started again with the same settings (a stage whose evaluation was lost is
evaluated again); a finished run, another run or other settings are refused unless ``overwrite``.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.runs import RunDir, jsonable, read_json, write_json_atomic

STUDENT_MODEL = "ASM_CM"
BASE_MODELS = ("J_NO_DIRECTION", "ASM_CM")
MEMORY_PREFIX = "fast_weight_memory."
DEFAULT_CURRICULUM = ((40, 1000), (80, 500), (160, 500), (320, 300), (512, 200), (1024, 100), (4096, 25))
LANGUAGE_PROBABILITY = 0.8
LANGUAGE_WINDOW = 128
TEMPERATURE = 2.0
KD_WEIGHT = 0.5
BACKBONE_LR = 1e-5
MEMORY_LR = 1e-4
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
EVAL_BATCHES = 32  # stage evaluations: 32 batches at each length's MQAR batch size, as the notes
EVAL_TOKENS_PER_FORWARD = 16_384  # sequences per evaluation forward: about this many tokens
PASS_THRESHOLD = mqar_distance.GATE_THRESHOLD
CE_REGRESSION_LIMIT = 0.05
DEFAULT_CHECKPOINT_EVERY = 100
RESULT_FILE = "specialise.json"
PROGRESS_SECONDS = 30.0
# settings that may change when continuing a run stopped by a non-finite value (the advised fix)
FIXES_AFTER_NON_FINITE = ("backbone_lr", "memory_lr")


# ---------------------------------------------------------------------------------- settings
def parse_curriculum(text: str) -> list[tuple[int, int]]:
    """``"40:1000,80:500"`` -> [(40, 1000), (80, 500)]: increasing lengths of at least 40, positive steps."""
    stages = []
    for item in str(text).split(","):
        length, colon, steps = item.strip().partition(":")
        try:
            stages.append((int(length), int(steps)))
        except ValueError:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}") from None
        if not colon:
            raise ValueError(f"--curriculum must be LENGTH:STEPS,... (e.g. 40:1000,80:500), got {text!r}")
    return check_curriculum(stages)


def check_curriculum(stages) -> list[tuple[int, int]]:
    stages = [(int(length), int(steps)) for length, steps in stages]
    if not stages:
        raise ValueError("the curriculum has no stage")
    for length, steps in stages:
        if length < mqar_distance.CONTROL_LENGTH:
            raise ValueError(f"curriculum length {length} is below {mqar_distance.CONTROL_LENGTH} (the 8 pairs and "
                             "their queries)")
        if steps <= 0:
            raise ValueError(f"curriculum stage {length}:{steps} needs a positive number of steps")
    lengths = [length for length, _ in stages]
    if any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"curriculum lengths must increase from stage to stage, got {lengths}")
    return stages


def scale_curriculum(stages, scale: float) -> list[tuple[int, int]]:
    """Every stage's steps times ``scale``, rounded, at least 1."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"--steps-scale must be a positive number, got {scale!r}")
    return [(length, max(1, int(round(steps * scale)))) for length, steps in check_curriculum(stages)]


def mqar_batch_size(length: int) -> int:
    """Examples per MQAR batch at ``length``: 4 below 512, 2 below 1024, then 1."""
    return 4 if length < 512 else 2 if length < 1024 else 1


@dataclass
class Settings:
    """Everything besides the base run and the data that decides the specialisation's steps."""

    curriculum: list  # [[length, steps], ...] after scaling
    seed: int
    backbone_lr: float = BACKBONE_LR
    memory_lr: float = MEMORY_LR
    weight_decay: float = WEIGHT_DECAY
    grad_clip: float = GRAD_CLIP
    language_probability: float = LANGUAGE_PROBABILITY
    language_window: int = LANGUAGE_WINDOW
    temperature: float = TEMPERATURE
    kd_weight: float = KD_WEIGHT
    eval_sequences: int | None = None  # None: EVAL_BATCHES x the length's MQAR batch size
    eval_seed: int = mqar_distance.DEFAULT_EVAL_SEED

    def validate(self) -> "Settings":
        self.curriculum = [list(stage) for stage in check_curriculum(self.curriculum)]
        for name in ("backbone_lr", "memory_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a non-negative number, got {value!r}")
        if not 0 <= self.language_probability <= 1:
            raise ValueError(f"the language probability must be in [0, 1], got {self.language_probability!r}")
        if self.eval_sequences is not None and (isinstance(self.eval_sequences, bool) or self.eval_sequences <= 0):
            raise ValueError(f"--eval-sequences must be a positive integer, got {self.eval_sequences!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {self.seed!r}")
        return self

    @property
    def total_steps(self) -> int:
        return sum(steps for _, steps in self.curriculum)

    def stage_bounds(self) -> list[tuple[int, int, int]]:
        """(length, first step, last step) of every stage; steps count from 1 across stages."""
        bounds, last = [], 0
        for length, steps in self.curriculum:
            bounds.append((length, last + 1, last + steps))
            last += steps
        return bounds

    def eval_count(self, length: int) -> int:
        return self.eval_sequences or EVAL_BATCHES * mqar_batch_size(length)


# ---------------------------------------------------------------------------------- batches
def uses_language(seed: int, step: int, probability: float = LANGUAGE_PROBABILITY) -> bool:
    """The coin of ``step``: a language batch (True) or an MQAR batch, from ``default_rng([seed, step])``."""
    return bool(np.random.default_rng([seed, step]).random() < probability)


def language_batch(stream: np.ndarray, seed: int, step: int, window: int = LANGUAGE_WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs [1, window], next tokens [1, window]) of one random window of the training stream, its
    offset from ``default_rng([seed + 1, step, 0])``."""
    from drmlab.training.batches import gather_windows, window_starts

    starts = window_starts(seed + 1, step, 0, 1, window, len(stream))
    rows = gather_windows(stream, starts, window + 1)
    return rows[:, :-1], rows[:, 1:]


def mqar_batch(seed: int, step: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the distance protocol's examples at ``length``, from
    ``default_rng([seed + 2, step, 0])``; targets are ignored except at the 8 query positions."""
    tokens = mqar_distance.training_tokens(seed + 2, step, 0, mqar_batch_size(length), length)
    return mqar_distance.split_tokens(tokens)


# ---------------------------------------------------------------------------------- losses
def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) summed over the vocabulary, averaged over the
    positions [..., vocab]; computed in float32 or wider."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_student = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    positions = log_student.numel() // log_student.shape[-1]
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="sum") / positions


def language_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, *,
                  temperature: float = TEMPERATURE, kd_weight: float = KD_WEIGHT
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(CE + kd_weight T^2 KL, CE, KL) of a language batch: CE of the student against the next tokens."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    logits = student_logits.to(dtype)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    kl = distillation_kl(logits, teacher_logits, temperature)
    return ce + kd_weight * temperature ** 2 * kl, ce, kl


def mqar_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CE on the scored positions only (targets other than the ignore index: the 8 queries per example)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(dtype)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=mqar_distance.IGNORE)


# ---------------------------------------------------------------------------------- models
def check_base(base: str | Path) -> dict:
    """The config.json of the run directory ``base`` after checking it can be specialised: a
    J_NO_DIRECTION or ASM_CM run of the 256-id bytes vocabulary with a checkpoint (one line otherwise)."""
    run = RunDir(base)
    if not run.has_config():
        raise FileNotFoundError(f"--base {base}: not a drmlab run directory (no {run.config_path.name})")
    config = run.read_config()
    name = config.get("model")
    if name not in BASE_MODELS:
        raise ValueError(f"--base {base}: a {name} run; the specialisation starts from a J_NO_DIRECTION run "
                         f"(or continues an ASM_CM one)")
    if not run.has_checkpoint():
        raise FileNotFoundError(f"--base {base}: no checkpoint to start from (missing {run.pointer_path.name})")
    vocab = config.get("vocab_size") or (config.get("model_config") or {}).get("vocab_size")
    if vocab != mqar_distance.VOCAB_SIZE:
        raise ValueError(f"--base {base}: its vocabulary has {vocab} ids; the recall task's tokens need exactly "
                         f"{mqar_distance.VOCAB_SIZE} (a bytes run)")
    return config


def load_base(base: str | Path, device) -> tuple[nn.Module, dict, dict]:
    """(the base model, frozen, in eval mode; its config.json; the checkpoint pointer), after
    :func:`check_base`."""
    check_base(base)
    run = RunDir(base)
    pointer = run.read_pointer()
    teacher, config, _ = run.load_model(device)
    teacher.eval().requires_grad_(False)
    return teacher, config, pointer


def memory_parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if name.startswith(MEMORY_PREFIX)]


def build_student(base_config: dict, teacher: nn.Module, seed: int) -> nn.Module:
    """ASM_CM at the base run's preset, vocabulary and overrides, holding the teacher's weights (all
    of them but the new memory's from a J_NO_DIRECTION base), on the teacher's device, in train mode."""
    from drmlab.models import build_model

    student = build_model(STUDENT_MODEL, base_config["preset"], vocab_size=int(base_config["vocab_size"]), seed=seed,
                          **(base_config.get("overrides") or {}))
    student.to(next(teacher.parameters()).device)
    source = teacher.state_dict()
    if base_config["model"] == STUDENT_MODEL:
        student.load_state_dict(source, strict=True)
    else:
        missing, unexpected = student.load_state_dict(source, strict=False)
        new = set(memory_parameter_names(student))
        if set(missing) != new or unexpected:
            raise ValueError(f"the base's weights do not fit {STUDENT_MODEL} beside its memory: missing "
                             f"{sorted(set(missing) - new)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return student.train()


def build_optimizer(student: nn.Module, backbone_lr: float = BACKBONE_LR, memory_lr: float = MEMORY_LR,
                    weight_decay: float = WEIGHT_DECAY) -> torch.optim.AdamW:
    """AdamW with two groups, ``backbone`` (every parameter but the memory's) and ``memory``
    (``fast_weight_memory.*``), both with ``weight_decay``."""
    backbone, memory = [], []
    for name, parameter in student.named_parameters():
        (memory if name.startswith(MEMORY_PREFIX) else backbone).append(parameter)
    if not memory:
        raise ValueError(f"the student has no {MEMORY_PREFIX}* parameters")
    return torch.optim.AdamW([
        {"params": backbone, "lr": backbone_lr, "weight_decay": weight_decay, "name": "backbone"},
        {"params": memory, "lr": memory_lr, "weight_decay": weight_decay, "name": "memory"},
    ], lr=memory_lr)


# ---------------------------------------------------------------------------------- the run
class Specialisation:
    """One specialisation in pieces: :meth:`start` (fresh or continued), :meth:`train_step`,
    :meth:`evaluate_stage`, :meth:`run` (everything, returning the result). See the module docstring."""

    def __init__(self, base: str | Path, out: str | Path, settings: Settings, corpus, *, eval_tokens: int | None = None,
                 device="auto", checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, overwrite: bool = False,
                 log: Callable[[str], None] | None = None, progress_seconds: float = PROGRESS_SECONDS,
                 data_source: str | None = None, base_model=None):
        from drmlab.devices import resolve_device

        self.settings = settings.validate()
        self.base, self.run_dir, self.corpus, self.data_source = Path(base), RunDir(out), corpus, data_source
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be a non-negative integer, got {checkpoint_every!r}")
        if self.run_dir.path.resolve() == self.base.resolve():
            raise ValueError(f"--out {out} is the base run itself; choose another directory")
        self.checkpoint_every, self.overwrite = checkpoint_every, overwrite
        self.log, self.progress_seconds = log, progress_seconds
        self.device = resolve_device(str(device) if isinstance(device, torch.device) else device)
        if base_model is None:
            self.teacher, self.base_config, self.base_pointer = load_base(self.base, self.device)
        else:  # (teacher, config, pointer) already loaded
            self.teacher, self.base_config, self.base_pointer = base_model
        if corpus.vocab_size != self.base_config.get("vocab_size"):
            raise ValueError(f"the corpus's vocabulary ({corpus.vocab_size}) differs from the base run's "
                             f"({self.base_config.get('vocab_size')})")
        base_train = self.base_config.get("train") or {}
        self.rescore_seq_len = int(base_train.get("seq_len") or 256)
        self.rescore_batch = int(base_train.get("eval_batch_size") or 8)
        self.eval_tokens = eval_tokens
        self.student = build_student(self.base_config, self.teacher, settings.seed)
        self.optimizer = build_optimizer(self.student, settings.backbone_lr, settings.memory_lr, settings.weight_decay)
        self.step = 0
        self.result: dict = {}
        self.lock = self.metrics = None
        self.stop_signal: int | None = None
        self.train_seconds = self.train_seconds_before = 0.0
        self.last_checkpoint: int | None = None

    # -- identity
    def spec(self) -> dict:
        """What the run's steps depend on: the base checkpoint, the data, the settings."""
        meta = self.corpus.meta if isinstance(self.corpus.meta, dict) else {}
        return jsonable({
            "base": {"path": str(self.base.resolve()), "model": self.base_config["model"],
                     "preset": self.base_config["preset"], "overrides": self.base_config.get("overrides") or {},
                     "step": int(self.base_pointer["step"]),
                     "model_sha256": self.base_pointer["files"]["model.safetensors"]["sha256"]},
            "data": {"content_sha256": meta.get("content_sha256"), "tokenizer": self.corpus.tokenizer.name},
            "rescoring": {"seq_len": self.rescore_seq_len, "batch_size": self.rescore_batch,
                          "eval_tokens": self.eval_tokens},
            "settings": dataclasses.asdict(self.settings),
        })

    def run_config(self) -> dict:
        """config.json: an ordinary run's (model, preset, overrides, vocabulary, data, the train
        settings that ``drmlab eval`` reads) with the specialisation's settings and base."""
        import platform

        import drmlab
        from drmlab.models import count_parameters

        s, base = self.settings, self.base_config
        return jsonable({
            "model": STUDENT_MODEL, "preset": base["preset"], "overrides": base.get("overrides") or {},
            "model_config": dataclasses.asdict(self.student.config), "params": count_parameters(self.student),
            "train": {"seed": s.seed, "seq_len": self.rescore_seq_len, "eval_batch_size": self.rescore_batch,
                      "eval_tokens": self.eval_tokens, "lr": s.memory_lr, "schedule": "constant",
                      "weight_decay": s.weight_decay, "grad_clip": s.grad_clip, "batch_size": 1,
                      "total_steps": s.total_steps},
            "vocab_size": self.corpus.vocab_size, "tokenizer": self.corpus.tokenizer.name,
            "data_source": self.data_source,
            "data": self.corpus.meta,
            "specialise": self.spec(),
            "runtime": {"device": str(self.device), "drmlab": drmlab.__version__, "torch": torch.__version__,
                        "python": platform.python_version(), "threads": torch.get_num_threads()},
        })

    # -- setup
    def start(self) -> None:
        """Take the lock; continue the run in ``out`` (same settings) or start a fresh one."""
        run = self.run_dir
        run.create()
        self.lock = run.lock()
        run.clean_orphans()
        result_path = run.path / RESULT_FILE
        spec = self.spec()
        if run.holds_run() or result_path.exists():
            if self.overwrite:
                run.remove_run()
                result_path.unlink(missing_ok=True)
            else:
                saved = read_json(result_path) if result_path.is_file() else None
                summary = run.read_summary() if run.summary_path.is_file() else None
                reason = self._why_not_continue(saved, summary, spec)
                if reason is not None:
                    raise FileExistsError(f"{run.path} already holds {reason}; choose another --out or --overwrite "
                                          "(its files are then deleted)")
        if run.has_checkpoint():
            state = run.load_checkpoint(self.student, self.optimizer)
            self.step = self.last_checkpoint = int(state["step"])
            self.train_seconds_before = float(state.get("train_seconds", 0.0))
            for group in self.optimizer.param_groups:  # the rates asked now (equal unless a fix after a stop)
                group["lr"] = self.settings.memory_lr if group["name"] == "memory" else self.settings.backbone_lr
            self.result = read_json(result_path)
            self.result["spec"] = spec
            run.truncate_metrics(self.step)
            run.summary_path.unlink(missing_ok=True)
            # stage results measured after the checkpoint (none in practice: a stage ends with one) are dropped
            self.result["stages"] = [st for st in self.result.get("stages", []) if st["last_step"] <= self.step]
            self._say(f"specialise: continuing {run.path} at step {self.step} of {self.settings.total_steps}")
        else:
            run.clear_outputs()
            self.result = {"spec": spec, "stages": []}
            write_json_atomic(result_path, self.result)  # a run killed before its first checkpoint starts again
        run.write_config(self.run_config())
        self.metrics = run.metrics_log()

    def _why_not_continue(self, saved: dict | None, summary: dict | None, spec: dict) -> str | None:
        run = self.run_dir
        if saved is None or "spec" not in saved:
            return run.describe() if run.holds_run() else f"a {RESULT_FILE} without its run"
        if summary and summary.get("finished"):
            return f"a finished specialisation (step {summary.get('steps')})"
        differences = _differences(saved["spec"], spec)
        if summary and summary.get("stopped") == "non-finite":
            differences = [d for d in differences if d.split(":")[0].rsplit(".", 1)[-1] not in FIXES_AFTER_NON_FINITE]
        if differences:
            return "a specialisation under other settings (" + "; ".join(differences[:4]) + ")"
        return None

    # -- one step
    def train_step(self, step: int) -> dict:
        s, stream = self.settings, self.corpus.train
        length = self.stage_of(step)
        t0 = time.perf_counter()
        self.student.train()
        language = uses_language(s.seed, step, s.language_probability)
        try:
            if language:
                inputs, targets = language_batch(stream, s.seed, step, s.language_window)
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                with torch.no_grad():
                    teacher_logits = self.teacher(inputs, step=None).logits
                out = self.student(inputs, step=None)
                loss, ce, kl = language_loss(out.logits, teacher_logits, targets, temperature=s.temperature,
                                             kd_weight=s.kd_weight)
            else:
                inputs, targets = mqar_batch(s.seed, step, length)
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                out = self.student(inputs, step=None)
                loss = ce = mqar_loss(out.logits, targets)
                kl = None
            aux = out.aux.get("loss_aux") if out.aux else None
            if aux is not None:
                loss = loss + aux.float()
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                self._non_finite(step, f"non-finite loss ({loss_value})", length, language)
            loss.backward()
        except torch.linalg.LinAlgError as exc:
            self.optimizer.zero_grad(set_to_none=True)
            self._non_finite(step, f"a linear-algebra failure inside the model ({str(exc).splitlines()[0]})",
                             length, language)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            self._non_finite(step, f"non-finite gradient norm ({grad_norm})", length, language)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        self.train_seconds += dt
        return {"kind": "train", "step": step, "stage": length, "batch": "language" if language else "mqar",
                "tokens": int(inputs.numel()), "loss": loss_value, "ce": float(ce.detach()),
                "kd": None if kl is None else float(kl.detach()), "grad_norm": grad_norm,
                "lr_backbone": s.backbone_lr, "lr_memory": s.memory_lr, "seconds": dt}

    def _non_finite(self, step: int, what: str, length: int, language: bool):
        from drmlab.training.trainer import NonFiniteLossError

        self.optimizer.zero_grad(set_to_none=True)
        kept = (f"the last good checkpoint (step {self.last_checkpoint}) is in {self.run_dir.path}"
                if self.last_checkpoint is not None else "no checkpoint was written")
        message = (f"{what} at step {step} (stage {length}, {'language' if language else 'MQAR'} batch); stopped, "
                   f"{kept}. Try a lower --memory-lr or --backbone-lr (the run then continues from that checkpoint)")
        self.run_dir.write_summary({"finished": False, "stopped": "non-finite", "message": message,
                                    "checkpoint_step": self.last_checkpoint})
        raise NonFiniteLossError(message)

    def stage_of(self, step: int) -> int:
        for length, first, last in self.settings.stage_bounds():
            if first <= step <= last:
                return length
        raise ValueError(f"step {step} is outside the curriculum's {self.settings.total_steps} steps")

    def save(self, step: int) -> None:
        from drmlab.runs import non_finite_parameters
        from drmlab.training.trainer import NonFiniteLossError

        if self.last_checkpoint == step:
            return
        bad = non_finite_parameters(self.student)
        if bad:
            raise NonFiniteLossError(f"non-finite weights ({', '.join(bad[:3])}) after step {step}; stopped, the last "
                                     f"good checkpoint (step {self.last_checkpoint}) is in {self.run_dir.path}")
        self.run_dir.save_checkpoint(self.student, self.optimizer, {
            "step": step, "stage": self.stage_of(step), "train_seconds": self.train_seconds_before + self.train_seconds})
        self.last_checkpoint = step

    # -- evaluations
    def rescore(self) -> dict:
        from drmlab.evaluation import byte_counter, rescore

        meta = self.corpus.meta if isinstance(self.corpus.meta, dict) else {}
        t0 = time.perf_counter()
        result = rescore(self.student, self.corpus.val, self.rescore_seq_len, batch_size=self.rescore_batch,
                         max_targets=self.eval_tokens, device=self.device,
                         count_bytes=byte_counter(self.corpus.val, self.corpus.tokenizer, meta.get("val_bytes")))
        result["seconds"] = time.perf_counter() - t0
        return result

    def evaluate_stage(self, length: int, first: int, last: int) -> dict:
        """Read every curriculum length up to ``length``; the stage's record."""
        s = self.settings
        lengths = [L for L, _ in s.curriculum if L <= length]
        chunk = max(L for L, _ in s.curriculum)
        records = {}
        for L in lengths:
            n = s.eval_count(L)
            batch = max(1, min(n, EVAL_TOKENS_PER_FORWARD // L))
            record = mqar_distance.read_length(self.student, L, n, eval_seed=s.eval_seed, eval_batch=batch, chunk=chunk)
            records[str(L)] = {k: record[k] for k in ("acc", "correct", "total", "ci95", "by_query", "n_eval",
                                                      "eval_seed", "seconds")}
            lo, hi = record["ci95"]
            self._say(f"specialise: after stage {length} (step {last}) L={L}: {100 * record['acc']:.2f}% "
                      f"[{100 * lo:.2f}, {100 * hi:.2f}] ({record['correct']}/{record['total']})")
        failing = [int(L) for L, r in records.items() if r["acc"] < PASS_THRESHOLD]
        return {"length": length, "first_step": first, "last_step": last, "lengths": records,
                "pass": not failing, "failing": failing}

    # -- everything
    def run(self, stop_after_step: int | None = None) -> dict:
        """Train (from the last checkpoint), evaluate each stage, rescore; the result (also specialise.json)."""
        try:
            self.start()
            with _SignalStop(self):
                return self._run(stop_after_step)
        finally:
            self.close()

    def _run(self, stop_after_step: int | None) -> dict:
        s, run = self.settings, self.run_dir
        path = run.path / RESULT_FILE
        if "before" not in self.result:
            if self.step != 0:
                raise RuntimeError(f"{path} lacks the language CE before training although a checkpoint at step "
                                   f"{self.step} exists; use --overwrite to start again")
            self.result["before"] = self.rescore()
            write_json_atomic(path, jsonable(self.result))
            self._say(f"specialise: language CE before {self.result['before']['ce']:.4f} nats/token "
                      f"({self.result['before']['targets']:,} tokens)")
        last_step = s.total_steps if stop_after_step is None else min(s.total_steps, stop_after_step)
        done = {st["length"] for st in self.result["stages"]}
        progress_at = time.perf_counter()
        for length, first, last in s.stage_bounds():
            if length in done:
                continue
            for step in range(max(first, self.step + 1), min(last, last_step) + 1):
                row = self.train_step(step)
                self.step = step
                self.metrics.log(row)
                if self.stop_signal is not None or step == last_step or step == last or (
                        self.checkpoint_every and step % self.checkpoint_every == 0):
                    self.save(step)
                if self.stop_signal is not None:
                    from drmlab.training.trainer import TrainingInterrupted

                    name = signal.Signals(self.stop_signal).name
                    raise TrainingInterrupted(f"{name} received: stopped after step {step} of {s.total_steps}, "
                                              f"checkpoint committed in {run.path}", self.stop_signal, step)
                if time.perf_counter() - progress_at >= self.progress_seconds:
                    progress_at = time.perf_counter()
                    self._say(f"specialise: step {step}/{s.total_steps} (stage {length}): {row['batch']} loss "
                              f"{row['loss']:.4f}")
            if self.step < last:  # stopped early (stop_after_step)
                return self.result
            self.save(last)
            self.result["stages"].append(self.evaluate_stage(length, first, last))
            write_json_atomic(path, jsonable(self.result))
        if "after" not in self.result:
            self.result["after"] = self.rescore()
        self.result.update(self.verdicts())
        write_json_atomic(path, jsonable(self.result))
        self._say(f"specialise: language CE after {self.result['after']['ce']:.4f} nats/token "
                  f"({self.result['language']['regression']:+.4f})")
        run.write_summary(self.summary())
        return self.result

    def verdicts(self) -> dict:
        stages = self.result["stages"]
        before, after = self.result["before"]["ce"], self.result["after"]["ce"]
        first_failed = next((st["length"] for st in stages if not st["pass"]), None)
        final = stages[-1]
        recall = bool(final["pass"]) and len(final["lengths"]) == len(self.settings.curriculum)
        language = {"before": before, "after": after, "regression": after - before, "limit": CE_REGRESSION_LIMIT,
                    "pass": after - before <= CE_REGRESSION_LIMIT}
        control = final["lengths"][str(self.settings.curriculum[0][0])]
        reasons = []
        if not recall:
            reasons.append(f"recall below {100 * PASS_THRESHOLD:.0f}% at " + ", ".join(str(L) for L in final["failing"])
                           + f" after the last stage (first failing stage: {first_failed})")
        if not language["pass"]:
            reasons.append(f"language CE rose by {after - before:.4f} > {CE_REGRESSION_LIMIT}")
        return {"control": control, "recall_pass": recall, "first_failed_stage": first_failed, "language": language,
                "passed": recall and language["pass"], "reasons": reasons}

    def summary(self) -> dict:
        from drmlab.models import count_parameters

        after = self.result["after"]
        return {"model": STUDENT_MODEL, "preset": self.base_config["preset"], "seed": self.settings.seed,
                "params": count_parameters(self.student), "steps": self.step, "total_steps": self.settings.total_steps,
                "finished": True, "specialised_from": str(self.base.resolve()),
                "train_seconds": self.train_seconds_before + self.train_seconds,
                **{f"val_{k}": after[k] for k in ("ce", "bpb", "ppl", "targets", "bytes")},
                "recall_pass": self.result["recall_pass"], "language_regression": self.result["language"]["regression"],
                "passed": self.result["passed"], "out_dir": str(self.run_dir.path)}

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)


def _differences(saved, now, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ, with both values."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(saved) | set(now)):
            out += _differences(saved.get(key), now.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == now else [f"{prefix[:-1]}: {saved!r} in the run, {now!r} now"]


class _SignalStop:
    """While running (main thread only), SIGINT and SIGTERM ask for a stop after the current step
    (checkpoint committed); the same signal twice stops at once."""

    def __init__(self, run: Specialisation):
        self.run, self.previous = run, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.run.stop_signal == signum:
            raise KeyboardInterrupt
        self.run.stop_signal = signum

    def __exit__(self, *exc):
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        return False


def specialise(base: str | Path, out: str | Path, corpus, *, curriculum=DEFAULT_CURRICULUM, steps_scale: float = 1.0,
               seed: int | None = None, backbone_lr: float = BACKBONE_LR, memory_lr: float = MEMORY_LR,
               eval_sequences: int | None = None, eval_tokens: int | None = None, device="auto",
               checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, overwrite: bool = False,
               stop_after_step: int | None = None, log: Callable[[str], None] | None = None,
               data_source: str | None = None) -> dict:
    """Run the recipe from the run directory ``base`` into ``out`` on ``corpus`` (a
    :class:`drmlab.data.TokenCorpus`; ``data_source`` is its name as config.json records it); ``seed``
    defaults to the base run's. The result (specialise.json); ``stop_after_step`` stops early with a
    checkpoint (an interruption, for tests)."""
    from drmlab.devices import resolve_device

    stages = scale_curriculum(curriculum, steps_scale)
    dev = resolve_device(str(device) if isinstance(device, torch.device) else device)
    base_model = load_base(base, dev)
    if seed is None:
        seed = int((base_model[1].get("train") or {}).get("seed", 0))
    settings = Settings(curriculum=[list(st) for st in stages], seed=seed, backbone_lr=backbone_lr, memory_lr=memory_lr,
                        eval_sequences=eval_sequences)
    job = Specialisation(base, out, settings, corpus, eval_tokens=eval_tokens, device=dev,
                         checkpoint_every=checkpoint_every, overwrite=overwrite, log=log, data_source=data_source,
                         base_model=base_model)
    return job.run(stop_after_step)
