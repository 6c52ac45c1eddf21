"""The specialisation recipe on top of :func:`drmlab.training.train` (docs/mqar.md section 9): the
learning-rate groups (two under ``distill``, one under ``interleaved``) of the student built from the
base run (both :mod:`~drmlab.experiments.specialise.student`), the stage evaluations and the language CE
before and after as the trainer's hooks, the verdicts and ``specialise.json``. The step, the guards,
checkpoints, resume and signals are the trainer's; whether a saved run may be continued is
:mod:`~drmlab.experiments.specialise.continuing`'s."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from drmlab.experiments.mqar import distance as mqar_distance
from drmlab.experiments.specialise.batches import MixedBatches
from drmlab.experiments.specialise.continuing import (  # noqa: F401 (re-exported)
    FIXES_AFTER_NON_FINITE,
    RESULT_FILE,
    why_not_continue,
)
from drmlab.experiments.specialise.curriculum import (  # noqa: F401 (recipe_settings re-exported)
    CE_REGRESSION_LIMIT,
    DEFAULT_CHECKPOINT_EVERY,
    EVAL_TOKENS_PER_FORWARD,
    PASS_THRESHOLD,
    Settings,
    default_curriculum,
    recipe_settings,
    scale_curriculum,
)
from drmlab.experiments.specialise.losses import SpecialiseLoss
from drmlab.experiments.specialise.student import (  # noqa: F401 (re-exported)
    BASE_MODELS,
    MEMORY_PREFIX,
    STUDENT_MODEL,
    build_optimizer,
    build_single_rate_optimizer,
    build_student,
    check_base,
    load_base,
    memory_parameter_names,
    student_model,
    student_overrides,
)
from drmlab.runs import RunDir, jsonable, read_json, write_json_atomic
from drmlab.training.config import TrainConfig
from drmlab.training.fast import memory_products_in_bf16
from drmlab.training.pieces import EvalHook, TrainPieces
from drmlab.training.run_info import DataInfo, RunInfo

PROGRESS_SECONDS = 30.0
ADVICE = "Try a lower --memory-lr or --backbone-lr (the run then continues from that checkpoint)."


# ---------------------------------------------------------------------------------- the run
class Specialisation:
    """One specialisation: the student, the teacher, the batch source and loss, and the trainer's
    pieces; :meth:`run` trains (continuing a killed run) and returns the result (specialise.json)."""

    def __init__(
        self,
        base: str | Path,
        out: str | Path,
        settings: Settings,
        corpus,
        *,
        eval_tokens: int | None = None,
        device="auto",
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        overwrite: bool = False,
        log: Callable[[str], None] | None = None,
        progress_seconds: float = PROGRESS_SECONDS,
        data_source: str | None = None,
        base_model=None,
    ):
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
            self.teacher, self.base_config, self.base_pointer = load_base(self.base, self.device, settings.recipe)
        else:  # (teacher, config, pointer) already loaded
            self.teacher, self.base_config, self.base_pointer = base_model
        if corpus.vocab_size != self.base_config.get("vocab_size"):
            raise ValueError(
                f"the corpus's vocabulary ({corpus.vocab_size}) differs from the base run's "
                f"({self.base_config.get('vocab_size')})"
            )
        base_train = self.base_config.get("train") or {}
        self.rescore_seq_len = int(base_train.get("seq_len") or 256)
        self.rescore_batch = int(base_train.get("eval_batch_size") or 8)
        self.eval_tokens = eval_tokens
        self.student_name = student_model(self.base_config, settings.recipe)
        self.student_overrides = student_overrides(self.base_config, settings.recipe, settings.fast_weight_dim)
        self.student = build_student(
            self.base_config, self.teacher, settings.seed, settings.recipe, self.student_overrides
        )
        self.batches = MixedBatches(corpus.train, self.settings)
        if settings.bf16 and settings.bf16_memory_products:  # the student's: the trainer, from train_config
            memory_products_in_bf16(self.teacher)
        self.loss = SpecialiseLoss(self.teacher, self.batches, self.settings)
        self.result: dict = {}

    # -- identity
    def spec(self) -> dict:
        """What the run's steps depend on: the base checkpoint, the data, the settings."""
        meta = self.corpus.meta if isinstance(self.corpus.meta, dict) else {}
        return jsonable(
            {
                "base": {
                    "path": str(self.base.resolve()),
                    "model": self.base_config["model"],
                    "preset": self.base_config["preset"],
                    "overrides": self.base_config.get("overrides") or {},
                    "step": int(self.base_pointer["step"]),
                    "model_sha256": self.base_pointer["files"]["model.safetensors"]["sha256"],
                },
                "data": {"content_sha256": meta.get("content_sha256"), "tokenizer": self.corpus.tokenizer.name},
                "rescoring": {
                    "seq_len": self.rescore_seq_len,
                    "batch_size": self.rescore_batch,
                    "eval_tokens": self.eval_tokens,
                },
                "settings": dataclasses.asdict(self.settings),
            }
        )

    def train_config(self) -> TrainConfig:
        """The trainer's settings: one batch per step, the curriculum's steps, the memory's rate as
        ``lr`` (each group keeps its own), constant; ``seq_len``, ``eval_batch_size`` and ``eval_tokens``
        are the rescoring's (what ``drmlab eval`` reads), so the nominal step is ``seq_len`` tokens."""
        s, seq = self.settings, self.rescore_seq_len
        return TrainConfig(
            tokens=s.total_steps * seq,
            batch_size=1,
            grad_accum=1,
            seq_len=seq,
            seed=s.seed,
            lr=s.trainer_lr,
            schedule="constant",
            weight_decay=s.weight_decay,
            grad_clip=s.grad_clip,
            eval_every=0,
            eval_windows=0,
            eval_tokens=self.eval_tokens,
            eval_batch_size=self.rescore_batch,
            checkpoint_every=self.checkpoint_every * seq,
            divergence_steps=0,
            bf16=s.bf16,  # recorded in config.json; the loss piece runs the autocast
            bf16_memory_products=s.bf16_memory_products,  # the trainer switches the student's memory
        ).validate()

    def run_info(self) -> RunInfo:
        """config.json beside the trainer's entries: the student model at the base's preset and
        overrides (with ``fast_weight_dim`` when set), the data and the specialisation's own record
        (``specialise``: :meth:`spec`)."""
        base = self.base_config
        return RunInfo(
            self.student_name,
            base["preset"],
            self.student_overrides,
            data=DataInfo(self.corpus.vocab_size, self.corpus.tokenizer.name, self.data_source, self.corpus.meta),
            study={"specialise": self.spec()},
        )

    def pieces(self) -> TrainPieces:
        s = self.settings
        return TrainPieces(
            loss_fn=self.loss,
            optimizer_builder=(
                (lambda model, cfg: build_single_rate_optimizer(model, s.lr, s.weight_decay))
                if s.recipe == "interleaved"
                else (lambda model, cfg: build_optimizer(model, s.backbone_lr, s.memory_lr, s.weight_decay))
            ),
            hooks=(
                EvalHook("rescore", {0}, self._before),
                EvalHook("stage", {last for _, _, last in s.stage_bounds()}, self._stage),
            ),
            summary_extras=self._finish,
            advice=ADVICE,
        )

    def _trainer_arguments(self) -> dict:
        return {
            "run_info": self.run_info(),
            "evaluate": self._after,
            "device": str(self.device),
            "quiet": self.log is None,
            "progress_seconds": self.progress_seconds,
            "pieces": self.pieces(),
        }

    def trainer(self):
        """The :class:`~drmlab.training.trainer.Trainer` of this run, not started (to inspect a step)."""
        from drmlab.training.trainer import Trainer

        return Trainer(
            self.student, self.batches, self.train_config(), self.run_dir, val_tokens=None, **self._trainer_arguments()
        )

    # -- everything
    def run(self, stop_after_step: int | None = None) -> dict:
        """Train (continuing from the last checkpoint), evaluate each stage, rescore; the result (also
        specialise.json). ``stop_after_step`` stops early with a checkpoint (an interruption, for tests)."""
        from drmlab.training.trainer import train

        resume = self._plan()
        train(
            self.student,
            self.batches,
            None,
            self.train_config(),
            self.run_dir,
            resume=resume,
            overwrite=not resume,
            stop_after_step=stop_after_step,
            **self._trainer_arguments(),
        )
        return self.result

    def _plan(self) -> bool:
        """Whether to continue the run in ``out`` (True) or start afresh; refuses a finished run, another
        run or other settings (unless ``overwrite``) in one line."""
        run = self.run_dir
        path = run.path / RESULT_FILE
        spec = self.spec()
        self.result = {"spec": spec, "stages": []}
        if self.overwrite or not (run.holds_run() or path.exists()):
            return False
        saved = read_json(path) if path.is_file() else None
        summary = run.read_summary() if run.summary_path.is_file() else None
        reason = why_not_continue(run, saved, summary, spec)
        if reason is not None:
            raise FileExistsError(
                f"{run.path} already holds {reason}; choose another --out or --overwrite (its files are then deleted)"
            )
        if not run.has_checkpoint():
            return False  # killed before its first checkpoint: start again
        step = int(run.read_pointer()["step"])
        if "before" not in saved:
            raise RuntimeError(
                f"{path} lacks the language CE before training although a checkpoint at step "
                f"{step} exists; use --overwrite to start again"
            )
        self.result = dict(saved, spec=spec)
        self._say(f"specialise: continuing {run.path} at step {step} of {self.settings.total_steps}")
        return True

    def _write_result(self) -> None:
        write_json_atomic(self.run_dir.path / RESULT_FILE, jsonable(self.result))

    # -- the trainer's hooks
    def _before(self, model: nn.Module, step: int) -> dict:
        """Step 0 of a fresh run: the language CE of the student (still the base)."""
        self.result = {"spec": self.result["spec"], "stages": []}
        self._write_result()  # a run killed before its first checkpoint starts again
        self.result["before"] = self.rescore(model)
        self._write_result()
        self._say(
            f"specialise: language CE before {self.result['before']['ce']:.4f} nats/token "
            f"({self.result['before']['targets']:,} tokens)"
        )
        return self.result["before"]

    def _stage(self, model: nn.Module, step: int) -> dict:
        """The end of a stage (its checkpoint committed): read every curriculum length up to it."""
        length, first, last = next(b for b in self.settings.stage_bounds() if b[2] == step)
        record = self.evaluate_stage(length, first, last, model)
        # a stage read again after a kill replaces its record
        self.result["stages"] = [st for st in self.result.get("stages", []) if st["last_step"] < step] + [record]
        self._write_result()
        return record

    def _after(self, model: nn.Module, device, progress: bool = False) -> dict:
        """The trainer's final evaluation: the language CE after the last step."""
        self.result["after"] = self.rescore(model)
        return self.result["after"]

    def _finish(self, summary: dict) -> dict:
        """A finished run: the verdicts into specialise.json, and the summary's own entries."""
        self.result.update(self.verdicts())
        self._write_result()
        self._say(
            f"specialise: language CE after {self.result['after']['ce']:.4f} nats/token "
            f"({self.result['language']['regression']:+.4f})"
        )
        return {
            "specialised_from": str(self.base.resolve()),
            "recall_pass": self.result["recall_pass"],
            "language_regression": self.result["language"]["regression"],
            "passed": self.result["passed"],
        }

    # -- evaluations
    def rescore(self, model: nn.Module | None = None) -> dict:
        from drmlab.evaluation import byte_counter, rescore

        meta = self.corpus.meta if isinstance(self.corpus.meta, dict) else {}
        t0 = time.perf_counter()
        result = rescore(
            model if model is not None else self.student,
            self.corpus.val,
            self.rescore_seq_len,
            batch_size=self.rescore_batch,
            max_targets=self.eval_tokens,
            device=self.device,
            count_bytes=byte_counter(self.corpus.val, self.corpus.tokenizer, meta.get("val_bytes")),
        )
        result["seconds"] = time.perf_counter() - t0
        return result

    def evaluate_stage(self, length: int, first: int, last: int, model: nn.Module | None = None) -> dict:
        """Read every curriculum length up to ``length`` (with the decoding state's bytes per sequence
        after it, :func:`~drmlab.experiments.mqar.distance_read.read_length`'s); the stage's record."""
        s = self.settings
        model = model if model is not None else self.student
        lengths = [L for L, _ in s.curriculum if L <= length]
        chunk = max(L for L, _ in s.curriculum)
        records = {}
        for L in lengths:
            n = s.eval_count(L)
            batch = max(1, min(n, EVAL_TOKENS_PER_FORWARD // L))
            record = mqar_distance.read_length(
                model, L, n, eval_seed=s.eval_seed, eval_batch=batch, chunk=chunk, pairs=s.pairs
            )
            records[str(L)] = {
                k: record[k]
                for k in (
                    "acc",
                    "correct",
                    "total",
                    "ci95",
                    "first_acc",
                    "first_correct",
                    "first_ci95",
                    "by_query",
                    "n_eval",
                    "eval_seed",
                    "state_bytes",
                    "seconds",
                )
            }
            lo, hi = record["ci95"]
            self._say(
                f"specialise: after stage {length} (step {last}) L={L}: {100 * record['acc']:.2f}% "
                f"[{100 * lo:.2f}, {100 * hi:.2f}] ({record['correct']}/{record['total']})"
            )
        failing = [int(L) for L, r in records.items() if r["acc"] < PASS_THRESHOLD]
        return {
            "length": length,
            "first_step": first,
            "last_step": last,
            "lengths": records,
            "pass": not failing,
            "failing": failing,
        }

    def verdicts(self) -> dict:
        stages = self.result["stages"]
        before, after = self.result["before"]["ce"], self.result["after"]["ce"]
        first_failed = next((st["length"] for st in stages if not st["pass"]), None)
        final = stages[-1]
        recall = bool(final["pass"]) and len(final["lengths"]) == len(self.settings.curriculum)
        language = {
            "before": before,
            "after": after,
            "regression": after - before,
            "limit": CE_REGRESSION_LIMIT,
            "pass": after - before <= CE_REGRESSION_LIMIT,
        }
        control = final["lengths"][str(self.settings.curriculum[0][0])]
        reasons = []
        if not recall:
            reasons.append(
                f"recall below {100 * PASS_THRESHOLD:.0f}% at "
                + ", ".join(str(L) for L in final["failing"])
                + f" after the last stage (first failing stage: {first_failed})"
            )
        if not language["pass"]:
            reasons.append(f"language CE rose by {after - before:.4f} > {CE_REGRESSION_LIMIT}")
        return {
            "control": control,
            "recall_pass": recall,
            "first_failed_stage": first_failed,
            "language": language,
            "passed": recall and language["pass"],
            "reasons": reasons,
        }

    def _say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)


def specialise(
    base: str | Path,
    out: str | Path,
    corpus,
    *,
    curriculum=None,
    steps_scale: float = 1.0,
    seed: int | None = None,
    recipe: str = "distill",
    backbone_lr: float | None = None,
    memory_lr: float | None = None,
    lr: float | None = None,
    eval_sequences: int | None = None,
    eval_tokens: int | None = None,
    pairs: int = mqar_distance.PAIRS,
    fast_weight_dim: int | None = None,
    bf16: bool = False,
    bf16_memory_products: bool = False,
    device="auto",
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    overwrite: bool = False,
    stop_after_step: int | None = None,
    log: Callable[[str], None] | None = None,
    data_source: str | None = None,
) -> dict:
    """Run the recipe from the run directory ``base`` into ``out`` on ``corpus`` (a
    :class:`drmlab.data.TokenCorpus`; ``data_source`` is its name as config.json records it); ``seed``
    defaults to the base run's. ``recipe`` is ``distill`` (rates ``backbone_lr`` and ``memory_lr``,
    default 1e-5 and 1e-4) or ``interleaved`` (one rate ``lr``, default 3e-4). ``pairs``: the MQAR task's
    pair count (``curriculum`` None: the default curriculum fitted to it, :func:`default_curriculum`);
    ``fast_weight_dim``: the new memory's width (a J_NO_DIRECTION base under ``distill``); ``bf16``: the
    forwards under a bf16 autocast (``--fast``), ``bf16_memory_products`` with the selective memory's
    products in it too. The result
    (specialise.json); ``stop_after_step`` stops early with a checkpoint (an interruption, for tests)."""
    from drmlab.devices import resolve_device

    mqar_distance.check_pairs(pairs)
    stages = scale_curriculum(default_curriculum(pairs) if curriculum is None else curriculum, steps_scale, pairs)
    dev = resolve_device(str(device) if isinstance(device, torch.device) else device)
    base_model = load_base(base, dev, recipe)
    if seed is None:
        seed = int((base_model[1].get("train") or {}).get("seed", 0))
    settings = recipe_settings(
        recipe,
        stages,
        seed,
        lr,
        backbone_lr,
        memory_lr,
        eval_sequences,
        pairs,
        fast_weight_dim,
        bf16,
        bf16_memory_products,
    )
    job = Specialisation(
        base,
        out,
        settings,
        corpus,
        eval_tokens=eval_tokens,
        device=dev,
        checkpoint_every=checkpoint_every,
        overwrite=overwrite,
        log=log,
        data_source=data_source,
        base_model=base_model,
    )
    return job.run(stop_after_step)
