"""What ``drmlab train`` was asked, read from its parsed flags once: :class:`TrainRequest` (what to train) and
:class:`RunPlace` (where and how the run computes). :func:`drmlab.cli.train.run` builds both first and hands
them, never the namespace, to its helpers; :func:`resolve_settings` turns a request into the run's settings.

Nothing here imports torch at module level.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace

from drmlab.cli import common
from drmlab.cli.common import check_model_names, model_setting_names, parse_assignments
from drmlab.training.config import TRAIN_KEYS, parse_tokens, resolve_train_config, split_overrides
from drmlab.training.recipes import DEFAULT_RECIPE

DEFAULT_MODEL = "J"
DEFAULT_PRESET = "tiny"


@dataclass(frozen=True)
class TrainRequest:
    """What to train: the model, preset, data and tokenizer, the budget and train flags as given (None where
    a flag was left out: the resumed run's config.json, the recipe or the preset decides), the ``--set``
    assignments, and the run directory with what to do about the run already there."""

    model: str | None
    preset: str | None
    data: str | None
    tokenizer: str | None
    tokens: str | None
    steps: str | None
    seed: int | None
    batch_size: int | None
    grad_accum: int | None
    seq_len: int | None
    lr: float | None
    recipe: str | None
    schedule: str | None
    eval_every: str | None
    eval_tokens: str | None
    bf16: bool | None
    compile: bool | str | None  # True, False, "auto" (--compile on|off|auto), None: left out
    fast: bool | None
    assignments: tuple[str, ...]
    out: str | None
    resume: bool
    overwrite: bool
    accept_edited_config: bool
    bf16_memory_products: bool | None = None  # no flag of its own: --fast chooses it (:meth:`with_fast`)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainRequest:
        return cls(
            model=args.model,
            preset=args.preset,
            data=args.data,
            tokenizer=args.tokenizer,
            tokens=args.tokens,
            steps=args.steps,
            seed=args.seed,
            batch_size=args.batch_size,
            grad_accum=args.grad_accum,
            seq_len=args.seq_len,
            lr=args.lr,
            recipe=args.recipe,
            schedule=args.schedule,
            eval_every=args.eval_every,
            eval_tokens=args.eval_tokens,
            bf16=args.bf16,
            compile=common.compile_setting(args.compile),
            fast=args.fast,
            assignments=tuple(args.assignments or ()),
            out=args.out,
            resume=args.resume,
            overwrite=args.overwrite,
            accept_edited_config=args.accept_edited_config,
        )

    def with_fast(self, device: str | None) -> TrainRequest:
        """The request with what --fast stands for on ``device`` (:func:`drmlab.cli.common.fast_choices`) in
        place of the precision and compile settings left out; the request itself without --fast."""
        if not self.fast:
            return self
        bf16, products, compile = common.fast_choices(
            device,
            bf16=self.bf16,
            bf16_memory_products=self.bf16_memory_products,
            compile=self.compile,
            resume=self.resume,
        )
        return replace(self, bf16=bf16, bf16_memory_products=products, compile=compile)


@dataclass(frozen=True)
class RunPlace:
    """Where and how the run computes, never what: the device, torch's threads, the CPU processes (--procs),
    the corpus cache, what is printed (``quiet``) and written beside the run (``tensorboard``), FSDP under
    torchrun, and the command as given (``argv``, for advice lines that repeat it). ``main_process``: this
    process reports (process 0 under torchrun); the others are quiet."""

    device: str | None
    threads: int | None
    procs: str | None
    cache_dir: str | None
    quiet: bool
    tensorboard: bool
    fsdp: bool
    argv: tuple[str, ...]
    main_process: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunPlace:
        main_process = os.environ.get("RANK", "0") == "0"  # under torchrun only process 0 reports
        return cls(
            device=args.device,
            threads=args.threads,
            procs=args.procs,
            cache_dir=args.cache_dir,
            quiet=bool(args.quiet) or not main_process,
            tensorboard=args.tensorboard,
            fsdp=args.fsdp,
            argv=tuple(args.argv),
            main_process=main_process,
        )


def resolve_settings(request: TrainRequest, saved: dict | None):
    """(model name, preset, data source, tokenizer, model overrides, TrainConfig) from the request, layered
    over the resumed run's config.json; every setting is checked before any corpus is loaded (a
    model's setting names do not depend on the vocabulary)."""
    saved = saved or {}
    if saved and request.recipe is not None:
        ran = saved.get("train", {}).get("recipe", DEFAULT_RECIPE)  # a run from before recipes ran the reference
        if request.recipe != ran:
            raise ValueError(
                f"cannot resume: the run was trained with recipe {ran!r}, not {request.recipe!r}; "
                "leave --recipe out to continue it, or train a new run with --out elsewhere"
            )
    name = request.model or saved.get("model") or DEFAULT_MODEL
    check_model_names([name])
    preset = request.preset or saved.get("preset") or DEFAULT_PRESET
    data = request.data if request.data is not None else saved.get("data_source")
    tokenizer = request.tokenizer or saved.get("tokenizer") or "bytes"
    assignments = parse_assignments(request.assignments)
    model_keys = [] if all(k in TRAIN_KEYS for k in assignments) else model_setting_names(name, preset, 256)
    train_set, model_overrides = split_overrides(assignments, model_keys)
    model_overrides = {**saved.get("overrides", {}), **model_overrides}
    in_tokens, in_steps = (
        request.tokens is not None or "tokens" in train_set,
        request.steps is not None or "steps" in train_set,
    )
    if in_tokens and in_steps:
        raise ValueError("--tokens and --steps exclude each other: give the budget in tokens or in optimizer steps")
    explicit = {
        "tokens": parse_tokens(request.tokens) if request.tokens is not None else None,
        "steps": _parse_steps(request.steps) if request.steps is not None else None,
        "seed": request.seed,
        "batch_size": request.batch_size,
        "grad_accum": request.grad_accum,
        "seq_len": request.seq_len,
        "lr": request.lr,
        "recipe": request.recipe,
        "schedule": request.schedule,
        "eval_every": None
        if request.eval_every is None
        else (0 if str(request.eval_every) == "0" else parse_tokens(request.eval_every)),
        "eval_tokens": None
        if str(request.eval_tokens).lower() in ("none", "all")
        else parse_tokens(request.eval_tokens),
        "bf16": request.bf16,
        "bf16_memory_products": request.bf16_memory_products,
        "compile": request.compile,
    }
    if not saved and explicit["compile"] is None and "compile" not in train_set:  # a new run: auto by default
        explicit["compile"] = common.compile_setting(common.default_compile())
    base = {k: v for k, v in saved.get("train", {}).items() if k in TRAIN_KEYS}
    if in_tokens:  # a resumed run's budget in steps gives way to the one now given in tokens
        base.pop("steps", None)
    values = {**base, **{k: v for k, v in explicit.items() if v is not None}, **train_set}
    if str(request.eval_tokens).lower() == "all":
        values.pop("eval_tokens", None)  # the whole stream, whatever the run had
    return name, preset, data, tokenizer, model_overrides, resolve_train_config(preset, **values)


def _parse_steps(text: str) -> int:
    """``--steps N`` (``300``, ``2k``): a positive whole number of optimizer steps."""
    try:
        return parse_tokens(text)
    except ValueError:
        raise ValueError(f"--steps must be a positive whole number of optimizer steps, got {text!r}") from None
