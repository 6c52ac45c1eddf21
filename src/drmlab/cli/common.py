"""Arguments and checks shared by the verbs, each flag defined once here: --out, --set, --seed / --seeds,
--preset, --tokens, --device, --threads (applied by :mod:`drmlab.cli.machine`), --quiet, --tensorboard, the
data arguments, the lr sweep's and the study train flags; :func:`runtime` turns parsed flags into a :class:`drmlab.experiments.spec.Runtime`.
Each ``add_*`` takes the verb's own help (and default) where verbs differ. Model names and sequence
lengths are checked here too.

Nothing here imports torch at module level; the helpers that need the library import it when called.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_out_argument(parser, help: str, *, default=None, required: bool = False, metavar: str | None = "DIR") -> None:
    """--out: where the verb writes (a run or study directory, a folder, a file)."""
    parser.add_argument("--out", default=default, required=required, metavar=metavar, help=help)


def refuse_run_output(path, flag: str, instead=None, allow=()) -> None:
    """Refuse an output path (``--out``, ``--output``) that is an existing run's own file or lies inside its
    checkpoints/ (:func:`drmlab.runs.refuse_run_output`: one line, a place to write ``instead``)."""
    if path is None:
        return
    from drmlab.runs import refuse_run_output as refuse

    refuse(path, flag, instead, allow=allow)


def add_set_argument(parser, help: str, *, metavar: str = "KEY=VALUE", dest: str = "assignments") -> None:
    """--set KEY=VALUE, repeatable: settings by name (:func:`parse_assignments` reads them)."""
    parser.add_argument("--set", dest=dest, action="append", default=[], metavar=metavar, help=help)


def add_seed_argument(parser, help: str, *, default: int | None = None) -> None:
    """--seed N: one seed."""
    parser.add_argument("--seed", type=int, default=default, help=help)


def add_seeds_argument(parser, default: str | None, help: str = "comma-separated seeds (default {default})") -> None:
    """--seeds 1,2,3: a study's seeds (:func:`parse_seeds` reads them)."""
    parser.add_argument("--seeds", default=default, help=help.format(default=default))


def add_preset_argument(parser, *, default: str | None = "tiny", help: str | None = None) -> None:
    """--preset: model size (and training defaults)."""
    from drmlab.presets import PRESETS

    parser.add_argument("--preset", default=default, choices=PRESETS, help=help)


def add_tokens_argument(parser, help: str) -> None:
    """--tokens N: a token budget (5M, 500k, 5_005_312)."""
    parser.add_argument("--tokens", default=None, metavar="N", help=help)


def add_recipe_argument(parser) -> None:
    """--recipe NAME: the named training recipe (drmlab.training.recipes); the name is checked on use."""
    from drmlab.training.recipes import DEFAULT_RECIPE, SUMMARIES

    known = "; ".join(f"{name}: {text}" for name, text in SUMMARIES.items()).replace("%", "%%")  # argparse formats help
    parser.add_argument(
        "--recipe",
        default=None,
        metavar="NAME",
        help=f"the training recipe (default {DEFAULT_RECIPE}; --set KEY=VALUE still changes any of its settings). {known}",
    )


def add_study_train_arguments(parser, *, lr_grid: bool = True) -> None:
    """--recipe, --lr (with the lr sweep's flags) and --eval-tokens of a study's runs; :func:`train_settings`
    reads them."""
    add_recipe_argument(parser)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    if lr_grid:
        add_lr_sweep_arguments(parser)
    parser.add_argument(
        "--eval-tokens", default=None, metavar="N", help="cap on validation tokens rescored per run (default: all)"
    )


def add_bf16_argument(parser, help: str = "bf16 autocast for training") -> None:
    parser.add_argument("--bf16", action="store_true", default=None, help=help)
    parser.add_argument(
        "--fast",
        action="store_true",
        default=None,
        help="the fast setting: bf16 autocast where this device multiplies bf16 natively (else float32, said in "
        "one line), torch.compile with a persistent cache, and the fused kernels (docs/architecture.md)",
    )


COMPILE_CHOICES = {"on": True, "off": False, "auto": "auto"}


def add_compile_argument(parser, default_help: str = "auto; $DRMLAB_COMPILE where set") -> None:
    """--compile on|off|auto (a bare --compile is on)."""
    parser.add_argument(
        "--compile",
        nargs="?",
        const="on",
        choices=tuple(COMPILE_CHOICES),
        default=None,
        metavar="on|off|auto",
        help="torch.compile the training forward as one graph (fullgraph=True, inductor; evaluation stays "
        "eager): on (a bare --compile), off, or auto: where the run's planned length repays the compile, from "
        "this machine's earlier compiled runs or the benchmark's figures, said in one line "
        f'(docs/architecture.md, "Compiled models"); default {default_help}. Under on, a model that cannot '
        "compile is refused at the first step naming the operation; under auto it trains eager",
    )


COMPILE_VARIABLE = "DRMLAB_COMPILE"


def default_compile() -> str:
    """--compile's default for a new run: ``$DRMLAB_COMPILE`` (on, off or auto) where set, else auto."""
    value = os.environ.get(COMPILE_VARIABLE, "auto").strip().lower()
    if value not in COMPILE_CHOICES:
        raise ValueError(f"${COMPILE_VARIABLE} must be on, off or auto, got {value!r}")
    return value


def compile_setting(choice: str | bool | None):
    """The train setting ``compile`` of ``--compile``'s value (on, off, auto: True, False, "auto"); a setting
    already made (True or False, as --fast writes it back) or None (left out) as it is."""
    return COMPILE_CHOICES[choice] if isinstance(choice, str) else choice


def apply_fast(args: argparse.Namespace) -> None:
    """Under --fast: :func:`fast_choices` written back into the parsed flags (``bf16``, ``bf16_memory_products``,
    ``compile``). Nothing without --fast."""
    if not getattr(args, "fast", None):
        return
    args.bf16, products, args.compile = fast_choices(
        getattr(args, "device", None),
        bf16=args.bf16,
        bf16_memory_products=getattr(args, "bf16_memory_products", None),
        compile=getattr(args, "compile", None),
        resume=getattr(args, "resume", False),
    )
    if products is not None:
        args.bf16_memory_products = products


def fast_choices(
    device: str | None, *, bf16: bool | None, bf16_memory_products: bool | None, compile: bool | None, resume: bool
) -> tuple[bool | None, bool | None, bool | None]:
    """(bf16, bf16_memory_products, compile) of --fast on ``device``, each kept where given: bf16 where the
    device has bf16 matrix units (one line where it has not), the memory's products in bf16 with it (not for a
    resumed run) and torch.compile; Inductor's cache moves to drmlab's cache folder."""
    from drmlab.devices import resolve_device
    from drmlab.training.fast import fast_settings, use_persistent_compile_cache

    settings, note = fast_settings(resolve_device(device))
    if note is not None:
        print(f"drmlab: {note}", file=sys.stderr)
    if bf16 is None:
        bf16 = settings["bf16"]
    # the memory's products in bf16 (docs/drm.md A.4.7): for new runs; a resumed run keeps its own setting
    if bf16_memory_products is None and not resume:
        bf16_memory_products = settings.get("bf16_memory_products", False) and bf16
    if compile is None:
        compile = settings["compile"]
    use_persistent_compile_cache()
    return bf16, bf16_memory_products, compile


def train_settings(args: argparse.Namespace, assignments: dict) -> dict:
    """A study's train settings from the flags (--recipe, --lr, --bf16 or --fast, --eval-tokens), then
    ``--set KEY=VALUE``."""
    apply_fast(args)
    flags = {
        "recipe": getattr(args, "recipe", None),
        "lr": args.lr,
        "bf16": args.bf16,
        "bf16_memory_products": getattr(args, "bf16_memory_products", None),
        "compile": compile_setting(getattr(args, "compile", None)),
        "eval_tokens": None if args.eval_tokens in (None, "all") else args.eval_tokens,
    }
    return {**{k: v for k, v in flags.items() if v is not None}, **assignments}


def add_data_arguments(parser: argparse.ArgumentParser, run: str | None = None) -> None:
    """--data / --tokenizer / --cache-dir: which text and how it becomes token ids. ``run`` names the run a
    verb reads (``"the run's"``, ``"the base run's"``): its data and tokenizer are then the defaults."""
    if run is None:
        data_help = (
            "training text: a file, a folder, a glob, or hf:NAME (default: the embedded corpus, "
            "the Python standard library's source, which depends on the Python version)"
        )
        tokenizer_help = "bytes (256 ids, the default) or gpt2 (50,257 BPE ids; needs the hf extra)"
    else:
        data_help = (
            f"other text instead of {run} own: a file, a folder, a glob, or hf:NAME (default: the data "
            f"{run} config.json records, split as it was in training)"
        )
        tokenizer_help = f"bytes or gpt2 (default: {run} own; another one is refused)"
    parser.add_argument("--data", metavar="SRC", default=None, help=data_help)
    parser.add_argument("--tokenizer", choices=("bytes", "gpt2"), default=None, help=tokenizer_help)
    parser.add_argument("--cache-dir", metavar="DIR", default=None, help="where tokenized corpora are cached")


def add_runtime_arguments(
    parser: argparse.ArgumentParser,
    *,
    device_default: str = "auto",
    quiet: bool = True,
    device_help: str | None = None,
    threads: bool = True,
) -> None:
    """--device / --threads (and --quiet): where and how fast, never what is computed."""
    add_device_argument(parser, device_default, device_help)
    if threads:
        add_threads_argument(parser)
    if quiet:
        add_quiet_argument(parser)


def add_threads_argument(parser) -> None:
    """--threads N: torch's CPU threads (:func:`apply_threads` applies it), on every verb that computes."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's choice, fewer when other tasks keep cores busy)",
    )


def add_device_argument(parser, default: str = "auto", help: str | None = None) -> None:
    parser.add_argument(
        "--device",
        default=default,
        help=help or (f"auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ... (default {default})"),
    )


def add_quiet_argument(parser, help: str = "no progress bars") -> None:
    parser.add_argument("--quiet", action="store_true", help=help)


def add_leave_held_argument(parser, *, default: bool | None = False) -> None:
    """--leave-held: a study process shared with others exits once every run it has left is held by another
    process, or waits on runs another process holds (those processes finish them), instead of waiting."""
    parser.add_argument(
        "--leave-held",
        action="store_true",
        default=default,
        help="exit (0) once every run left is held by another process or waits on one it holds, instead of "
        "waiting to finish the study; the holders finish those runs (for a queue of studies: the next "
        "command starts at once); the report is written by the process that finishes last",
    )


def runtime(args: argparse.Namespace, log=None):
    """The :class:`~drmlab.experiments.spec.Runtime` of the parsed flags: --tensorboard is refused without
    its package and --threads applied (:func:`apply_threads`) before anything is read."""
    from drmlab.cli.machine import apply_threads
    from drmlab.experiments.spec import Runtime

    check_tensorboard(getattr(args, "tensorboard", False))
    apply_threads(args)
    return Runtime(
        device=getattr(args, "device", "auto"),
        threads=getattr(args, "threads", None),
        quiet=getattr(args, "quiet", True),
        tensorboard=getattr(args, "tensorboard", False),
        cache_dir=getattr(args, "cache_dir", None),
        log=log,
        leave_held=bool(getattr(args, "leave_held", False)),
    )


def add_tensorboard_argument(parser: argparse.ArgumentParser, where: str = "the run directory") -> None:
    """--tensorboard: metrics.jsonl's rows also as TensorBoard event files (an output option, not a setting)."""
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help=f"also write every metrics row (loss, lr, grad norm, tokens/s, sampled validation CE, DRM "
        f"diagnostics) as TensorBoard event files into {where}/tensorboard/; may differ on a "
        "resume (needs: pip install 'drmlab[tensorboard]')",
    )


def check_tensorboard(wanted: bool) -> None:
    """Refuse --tensorboard (``wanted``) without the tensorboard package, in one line, before any corpus is loaded."""
    if wanted:
        from drmlab.training.tensorboard import require_tensorboard

        require_tensorboard()


def written_files(out, always: list[str], maybe: list[str]) -> str:
    """``always`` and those of ``maybe`` that exist in the folder ``out``, comma-separated: what a study
    verb names after "results in OUT/" (plots are drawn only when there is something to draw)."""
    from pathlib import Path

    return ", ".join(always + [name for name in maybe if (Path(out) / name).exists()])


def load_corpus_for(data: str | None, tokenizer: str | None, cache_dir: str | None, *, need_doc_starts: bool = False):
    """``drmlab.data.load_corpus`` with the command line's arguments (``need_doc_starts``: a cache written before
    document starts were recorded is rebuilt with them)."""
    from drmlab.data import load_corpus

    return load_corpus(
        source=data, tokenizer=tokenizer or "bytes", cache_dir=cache_dir, need_doc_starts=need_doc_starts
    )


def split_list(text: str, flag: str) -> list[str]:
    """``"a,b,c"`` -> ``["a", "b", "c"]``; empty or repeated items are an error naming ``--flag``."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"--{flag} is empty")
    if len(set(items)) != len(items):
        raise ValueError(f"--{flag} lists a name twice: {text}")
    return items


def parse_seeds(text: str) -> list[int]:
    """``--seeds 1,2,3`` -> [1, 2, 3]."""
    try:
        seeds = [int(s) for s in split_list(text, "seeds")]
    except ValueError as exc:
        raise ValueError(f"--seeds must be comma-separated non-negative integers, got {text!r}") from exc
    if any(s < 0 for s in seeds):
        raise ValueError(f"--seeds must be comma-separated non-negative integers, got {text!r}")
    return seeds


def check_model_names(specs: list[str]) -> None:
    """Refuse an unknown model name (``NAME`` or ``NAME:ARM``) before any corpus is loaded."""
    from drmlab.models.registry import parse_model_spec

    for spec in specs:
        parse_model_spec(spec)


def model_setting_names(name: str, preset: str, vocab_size: int) -> list[str]:
    """The model's config keys (fields of ``model.config``), from a default build on the meta device."""
    from drmlab.models.registry import config_fields

    return list(config_fields(name, preset, vocab_size))


def check_seq_len(model, seq_len: int, label: str | None = None, set_prefix: str = "") -> None:
    """A window longer than the model's position table is refused, naming the setting to raise."""
    limit = getattr(getattr(model, "config", None), "n_positions", None)
    if isinstance(limit, int) and seq_len > limit:
        name = label or getattr(model, "model_name", type(model).__name__)
        raise ValueError(
            f"seq_len {seq_len} exceeds {name}'s n_positions={limit}; add --set {set_prefix}n_positions={seq_len}"
        )


def log_to_stderr(message: str) -> None:
    """A progress line of a study, to stderr at once (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


def parse_int_list(text: str, flag: str) -> list[int]:
    """``--kv 4,16`` -> [4, 16]; a non-integer or repeated item is an error naming ``--flag``."""
    items = split_list(text, flag)
    try:
        return [int(s) for s in items]
    except ValueError:
        raise ValueError(f"--{flag} must be comma-separated integers, got {text!r}") from None


def parse_value(text: str):
    """A ``--set`` value: a JSON literal when it parses (``3``, ``0.5``, ``true``, ``null``, ``[1,2]``), else the string."""
    aliases = {"True": True, "False": False, "None": None}
    if text in aliases:
        return aliases[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: list[str] | None) -> dict:
    """``["lr=3e-4", "d_state=64"]`` -> ``{"lr": 0.0003, "d_state": 64}``."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key] = parse_value(value.strip())
    return out


LM_SWEEP_HELP = (
    "sweep these rates per model (first seed, scored on a slice held out of the training data, never "
    "the validation split), then run its seeds at its best rate; instead of --lr"
)


def add_lr_grid_argument(parser, help: str = LM_SWEEP_HELP) -> None:
    parser.add_argument("--lr-grid", default=None, metavar="LR,LR,...", help=help)


def add_lr_sweep_arguments(parser: argparse.ArgumentParser, budget: str = "--tokens") -> None:
    """--lr-grid, --tune-tokens and --sweep-only: sweep the learning rate per model first (drmlab.experiments.lr_sweep)."""
    add_lr_grid_argument(parser)
    parser.add_argument(
        "--tune-tokens", default=None, metavar="N", help=f"budget of each sweep run (default: {budget})"
    )
    parser.add_argument(
        "--sweep-only",
        action="store_true",
        help="with --lr-grid: run the sweep and stop (the same command without it goes on with "
        "the paired runs at each model's best rate)",
    )


def check_sweep_only(args: argparse.Namespace) -> None:
    """--sweep-only without --lr-grid has nothing to do: refused before anything is read or written."""
    if args.sweep_only and args.lr_grid is None:
        raise ValueError("--sweep-only needs --lr-grid (it runs the sweep and stops)")


def add_accept_edited_config_argument(parser) -> None:
    parser.add_argument(
        "--accept-edited-config",
        action="store_true",
        help="use the run's config.json although it was edited after the run wrote it (refused otherwise, "
        "listing the changed fields); the edit is sealed again and recorded in its metrics.jsonl",
    )


def accept_edited_config(args: argparse.Namespace, run_dir) -> None:
    """With ``--accept-edited-config``: :func:`take_config_edits` of ``run_dir``."""
    if getattr(args, "accept_edited_config", False):
        take_config_edits(run_dir)


def take_config_edits(run_dir) -> None:
    """Take the edits of ``run_dir``'s config.json (one line saying which), as --accept-edited-config asks."""
    if run_dir is None:
        return
    from drmlab.runs import RunDir

    run = RunDir(run_dir)
    if run.has_config():
        changed = run.accept_config_edits()
        if changed:
            log_to_stderr(
                f"accepted the edited {run.config_path} ({'; '.join(changed)}); recorded in its metrics.jsonl"
            )


def say_recovered_checkpoint(run_dir) -> None:
    """One line when the run's ``checkpoint.json`` is lost or damaged and the checkpoint is read from the newest
    folder whose own manifest verifies instead (recovering is right; doing it unsaid is not). Readers do not
    rewrite the pointer: the run's next writer does (``drmlab train --resume``). Nothing for a folder that is not
    a run (an export), nor where no checkpoint verifies: the loader says that in its own line."""
    if run_dir is None:
        return
    from drmlab.runs import STATE_FILE, RunDir

    run = RunDir(run_dir)
    if not run.has_config():
        return
    try:
        _, _, note = run.resolve_checkpoint(only=(STATE_FILE,))
    except (ValueError, OSError):
        return
    if note is not None:
        log_to_stderr(f"note: {run.path}: {note}: read from there (drmlab train --resume rewrites the pointer)")
