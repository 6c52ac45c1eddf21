"""``drmlab train``: train one model on a corpus and write a run directory.

Resolution order for every setting: the preset's defaults, then the recipe's (``--recipe``,
:mod:`drmlab.training.recipes`), then the explicit flags, then ``--set key=value`` (train settings such
as ``warmup_fraction`` or model settings such as ``d_state``; unknown keys are an error naming the nearest
one). With ``--resume`` the run's own ``config.json`` supplies the model, preset, overrides, data and train
settings (its recipe included), so ``drmlab train --resume --out DIR`` is enough (``--tokens`` or
``--steps`` may raise the budget).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from drmlab.cli import common, machine, processes
from drmlab.cli.common import load_corpus_for
from drmlab.cli.train_request import DEFAULT_MODEL, DEFAULT_PRESET, RunPlace, TrainRequest, resolve_settings
from drmlab.presets import PRESET_DEFAULTS
from drmlab.training.config import SCHEDULES
from drmlab.training.recipes import describe as describe_recipe
from drmlab.training.run_info import DataInfo, RunInfo

EPILOG = """\
examples:
  drmlab train                                   # model J, preset tiny, embedded corpus (about 70 s on 2 cores)
  drmlab train --model GPT2 --preset tiny --tokens 5M --out runs/gpt2-tiny --seed 1
  drmlab train --model J --set d_state=64 --set lr=5e-4 --tokens 500k
  drmlab train --model LLAMA --recipe field      # the field's recipe: warm-up, cosine, betas (0.9, 0.95), decay 0.1
  drmlab train --data notes.txt --steps 300 --out runs/notes   # your own text, a budget of 300 optimizer steps
  drmlab train --resume --out runs/gpt2-tiny     # continue an interrupted run exactly
  drmlab train --out runs/gpt2-tiny --overwrite  # delete that run and start it again
  drmlab train --model MAMBA --compile on        # torch.compile the training forward (default: auto)
  drmlab train --tensorboard                     # also TensorBoard event files: tensorboard --logdir runs
  torchrun --no-python --nproc_per_node 8 drmlab train --model J --preset 125m --fsdp   # FSDP2, 8 GPUs

resuming: --resume continues bit-exactly (on the same device and --threads: another device or thread
count is accepted, with a note, but rounds differently) and refuses other data, tokenizer, model settings or
schedule-defining train settings. It accepts other --device/--threads/--quiet/--compile/--tensorboard,
evaluation and checkpoint cadence (--eval-every, --eval-tokens, --set checkpoint_every=...), a higher --tokens
or --steps under the constant schedule, and -- after a stop for non-finite values or divergence -- the advised
fixes --lr, --set warmup_fraction=... and --set grad_clip=...; each change is recorded in a
"resume" row of metrics.jsonl. Ctrl-C or SIGTERM finishes the current step, commits a checkpoint and
exits 130 / 143; a second Ctrl-C stops at once.

presets (tokens/step = batch x accum x seq_len; default budget if --tokens is omitted):
{presets}

files written to --out: config.json (resolved settings), metrics.jsonl (one row per step and per
evaluation), checkpoint.json naming checkpoints/step-N/ (model.safetensors, optimizer.safetensors,
trainer_state.json, manifest.json with sha256 sums), summary.json (val_ce in nats/token, val_bpb in
bits/byte, tokens, params, tokens_per_s); with --tensorboard, tensorboard/ (the rows of metrics.jsonl as
event files). A second process writing the same run is refused. `drmlab report DIR` draws a run as one HTML page.
"""


def _preset_table() -> str:
    lines = []
    for name, d in PRESET_DEFAULTS.items():
        tps = d["batch_size"] * d["grad_accum"] * d["seq_len"]
        lines.append(
            f"  {name:6s} batch {d['batch_size']} x accum {d['grad_accum']} x seq {d['seq_len']} "
            f"= {tps:,} tok/step, lr {d['lr']:g}, default {d['tokens']:,} tokens"
        )
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train one model and write a run directory (metrics, checkpoint, summary)",
        description="Train one model with AdamW on next-token prediction, evaluate it on the validation "
        "split and write everything to a run directory.",
        epilog=EPILOG.format(presets=_preset_table()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help=f"registered model name, e.g. J, SSM_CONTROL, GPT2, LLAMA (default {DEFAULT_MODEL}; see `drmlab inspect --list`)",
    )
    common.add_preset_argument(
        parser, default=None, help=f"model size and training defaults (default {DEFAULT_PRESET})"
    )
    common.add_tokens_argument(
        parser, "token budget, e.g. 5M, 500k, 5_005_312 (rounded up to whole steps; default: the preset's)"
    )
    parser.add_argument(
        "--steps",
        default=None,
        metavar="N",
        help="the budget in optimizer steps instead of --tokens (tokens = N x batch x accum x seq_len); "
        "recorded in config.json beside the tokens it makes",
    )
    common.add_out_argument(parser, "run directory (default runs/MODEL-PRESET-seedS)")
    common.add_data_arguments(parser)
    common.add_seed_argument(parser, "seed of the model init and the batch order (default 0)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sequences per micro-batch, all processes together"
    )
    parser.add_argument("--grad-accum", type=int, default=None, help="micro-batches per optimizer step")
    parser.add_argument("--seq-len", type=int, default=None, help="training window length in tokens")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    common.add_recipe_argument(parser)
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="constant (the reference) or cosine (linear warm-up, cosine decay to 0.1 lr)",
    )
    parser.add_argument(
        "--eval-every",
        default=None,
        metavar="TOKENS",
        help="tokens between sampled validation checks (default: a fifth of the budget; 0: never)",
    )
    parser.add_argument(
        "--eval-tokens",
        default=None,
        metavar="N",
        help="cap on validation tokens scored at the end, or all (default: the whole validation stream)",
    )
    common.add_set_argument(
        parser, 'override a train or model setting, repeatable (values are JSON: 3, 0.5, true, "x")'
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in --out (its config, metrics, checkpoints, summary, eval.json) and start again",
    )
    common.add_bf16_argument(parser, "bf16 autocast for the training forward")
    common.add_compile_argument(parser)
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard weights, gradients and optimizer state over the processes with "
        "FSDP2 (each block, then the root) instead of DDP; the run directory keeps the "
        "single-process format (no effect without torchrun; torchrun of one process shards over one rank)",
    )
    parser.add_argument(
        "--procs",
        default=os.environ.get(processes.PROCS_VARIABLE, processes.AUTO),
        metavar="N",
        help="train on the CPU as N processes of one thread each, data-parallel (the batch split across "
        "them); auto: one per idle core when --threads is not given and the run has "
        f"{processes.AUTO_MIN_STEPS} steps or more, one process on a busy machine or a GPU; a resume keeps "
        f"the run's own count; 1: one process (default: ${processes.PROCS_VARIABLE}, else auto)",
    )
    common.add_tensorboard_argument(parser)
    common.add_accept_edited_config_argument(parser)
    common.add_runtime_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def fast_suggestion(name: str, device: str | None, steps: int) -> str | None:
    """The first-lines hint of a long default run whose model trains much faster with --fast here."""
    from drmlab.devices import resolve_device
    from drmlab.training.fast import suggestion

    return suggestion(name, resolve_device(device), steps)


def _recorded_runtime(saved: dict | None) -> tuple[int, int | None] | None:
    """(processes, threads per process) a resumed run was trained with (``saved``: its config.json's
    ``runtime``), which a resume keeps unless --procs / --threads say otherwise; None for a new run."""
    if saved is None:
        return None
    runtime = saved.get("runtime") or {}
    world, threads = runtime.get("world_size"), runtime.get("threads")
    return (world if isinstance(world, int) and world > 0 else 1, threads if isinstance(threads, int) else None)


def procs_choice(place: RunPlace, cfg, recorded: tuple[int, int | None] | None) -> processes.ProcsChoice:
    """The processes that train this run (:func:`drmlab.cli.processes.choose_procs`) from --procs, --threads, the
    device, the machine's idle cores and, on a resume, the run's own count (``recorded``, :func:`_recorded_runtime`)."""
    from drmlab.devices import resolve_device

    return processes.choose_procs(
        processes.parse_procs(place.procs),
        threads=place.threads,
        on_cpu=resolve_device(place.device).type == "cpu",
        launched="RANK" in os.environ,
        cores=machine.cpu_cores(),
        others=machine.other_busy_tasks(),
        batch_size=cfg.batch_size,
        steps=cfg.total_steps,
        recorded=recorded,
    )


def _resume_after_torchrun_restart(request: TrainRequest, main_process: bool) -> TrainRequest:
    """The request, made a resume where under ``torchrun --max-restarts N`` (N >= 1) the unfinished run in --out
    should continue from its last checkpoint, as --resume would: after a failure torchrun starts the whole group
    again with the same command, and each restarted process must pick the run up where the group left it.

    Every process decides from what all of them see alike -- the launcher's --max-restarts and the
    checkpoint in --out -- and not from ``TORCHELASTIC_RESTART_COUNT`` alone: that count is each node's own,
    and a node whose processes were stopped only because another node failed restarts them with its count
    unchanged (torchrun counts a membership change as no retry), so on two nodes it can be 0 on one and 1
    on the other. A finished run is left to the usual refusal, a run of other settings to the resume checks.
    --overwrite is refused under restarts: a restarted process could not tell the run it was told to delete
    from the one this job has checkpointed since. Process 0 says when it resumes, and warns when torchrun
    shares its rendezvous store with the processes (torch's default since 2.5), under which a restarted
    group can read the addresses of the processes it replaces and fail to connect or hang
    (pytorch/pytorch#135712; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` avoids it). ``main_process``: this is
    process 0."""
    from drmlab.runs import RunDir

    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return request
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"] or 0)
    if max(max_restarts, restart) <= 0:
        return request
    if main_process and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        print(
            f"drmlab train: note: torchrun --max-restarts {max_restarts} with its rendezvous store shared with the "
            "processes: a restarted group may fail to connect or hang (pytorch/pytorch#135712); "
            "start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node",
            file=sys.stderr,
            flush=True,
        )
    if request.resume:
        return request
    if request.overwrite:
        raise ValueError(
            f"--overwrite under torchrun --max-restarts {max_restarts}: a restarted process could not tell the "
            "run it was told to delete from the one this job has checkpointed since; delete the old run "
            "first (rm -r its folder) or give another --out"
        )
    if request.out is None:  # the default folder, as run() names it
        name, preset, _, _, _, cfg = resolve_settings(request, None)
        request = replace(request, out=f"runs/{name}-{preset}-seed{cfg.seed}")
    run_dir = RunDir(request.out)
    if not run_dir.has_checkpoint() or run_dir.finished_summary() is not None:
        return request
    request = replace(request, resume=True)
    if main_process:
        try:
            step = run_dir.read_pointer().get("step", "?")
        except (OSError, ValueError):  # a lost or damaged pointer: the resume recovers it or says why
            step = "?"
        print(
            f"drmlab train: under torchrun --max-restarts {max_restarts} (restart {restart} on this node): "
            f"resuming {request.out} from its last checkpoint (step {step})",
            file=sys.stderr,
            flush=True,
        )
    return request


def run(args: argparse.Namespace) -> int:
    """Train the run the flags ask for; the namespace is read here once, into a request and a place."""
    from drmlab.evaluation import byte_counter, rescorer
    from drmlab.models import build_model, count_parameters
    from drmlab.runs import RunDir

    request, place = TrainRequest.from_args(args), RunPlace.from_args(args)
    main_process = place.main_process  # under torchrun only process 0 reports
    request = _resume_after_torchrun_restart(request, main_process)
    if request.resume and request.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    common.check_tensorboard(place.tensorboard)
    request = request.with_fast(place.device)
    saved = None
    if request.resume:
        if request.out is None:
            raise ValueError("--resume needs --out DIR (the run to continue)")
        resumed = RunDir(request.out)
        if not resumed.has_config():
            raise FileNotFoundError(f"nothing to resume: {resumed.config_path} does not exist")
        if request.accept_edited_config:
            common.take_config_edits(request.out)
        saved = resumed.read_config()
    name, preset, data, tokenizer, model_overrides, cfg = resolve_settings(request, saved)
    out = Path(request.out or f"runs/{name}-{preset}-seed{cfg.seed}")
    common.refuse_run_output(out, "--out")
    foreign = RunDir(out).foreign_reason() if main_process and not request.resume and out.is_dir() else None
    if foreign is not None:  # neither a plain start nor --overwrite may touch another tool's files
        raise FileExistsError(
            f"{out} is not a drmlab run ({foreign}) and drmlab deletes nothing of it, with --overwrite neither; "
            "give another --out"
        )
    if main_process and not request.resume and not request.overwrite and RunDir(out).holds_run():
        raise FileExistsError(
            f"{out} already holds {RunDir(out).describe()}; use --resume to continue it, "
            "--overwrite to delete it and start again, or another --out"
        )

    corpus = load_corpus_for(data, tokenizer, place.cache_dir)
    machine.check_model_fits(name, preset, corpus.vocab_size, model_overrides, place.device)
    recorded = _recorded_runtime(saved)
    choice = procs_choice(place, cfg, recorded)
    if choice.procs > 1:  # the corpus cache is now built once; each process reads it
        del corpus
        print(choice.note, file=sys.stderr)
        from drmlab.training.launcher import launch

        command = [sys.executable, "-m", "drmlab", *processes.child_argv(place.argv, choice.threads)]
        return launch(command, choice.procs, choice.threads)
    machine.set_threads(place.threads, place.device, recorded=recorded[1] if recorded else None)
    model = build_model(name, preset, vocab_size=corpus.vocab_size, seed=cfg.seed, **model_overrides)
    common.check_seq_len(model, cfg.seq_len)
    run_info = RunInfo(name, preset, model_overrides, data=DataInfo.of(corpus, data))
    val_bytes = corpus.meta.get("val_bytes") if isinstance(corpus.meta, dict) else None
    evaluate = rescorer(
        corpus.val,
        cfg.seq_len,
        batch_size=cfg.eval_batch_size,
        max_targets=cfg.eval_tokens,
        count_bytes=byte_counter(corpus.val, corpus.tokenizer, val_bytes),
    )
    if not place.quiet:
        print(
            f"training {name} ({preset}, {count_parameters(model):,} parameters) on "
            f"{cfg.total_steps * cfg.tokens_per_step:,} tokens ({cfg.total_steps} steps of {cfg.tokens_per_step:,}), "
            f"seed {cfg.seed}, writing to {out}\n  {describe_recipe(cfg)}",
            file=sys.stderr,
        )
    hint = (
        None if cfg.bf16 or cfg.compile is True or place.quiet else fast_suggestion(name, place.device, cfg.total_steps)
    )
    if hint is not None:
        print(f"drmlab train: {hint}", file=sys.stderr)
    summary, code = _train_reporting_stops(request, place, model, corpus, cfg, out, run_info, evaluate)
    if summary is None or not main_process:
        return code
    if summary.get("val_ce") is not None:
        print(
            f"{name} {preset} seed {cfg.seed}: val CE {summary['val_ce']:.4f} nats/token, "
            f"{summary['val_bpb']:.4f} bits/byte, ppl {summary['val_ppl']:.3f} over {summary['val_targets']:,} tokens; "
            f"{summary['tokens']:,} tokens trained"
            + (
                f" at {summary['tokens_per_s']:,.0f} tok/s"
                if summary.get("tokens_per_s")
                else " (no step in this call)"
            )
            + (
                f", {summary['gflops']:,.1f} GFLOP/s ({100 * summary['util']:.0f}% of this machine's GEMM peak)"
                if summary.get("gflops")
                else ""
            )
        )
    print(f"results in {out}/: summary.json, metrics.jsonl, config.json, checkpoints/")
    return 0


def _without_rate(argv: list[str]) -> list[str]:
    """The command ``argv`` without --resume, --overwrite and the learning rate (``--lr X``, ``--set lr=X``): the
    advice after a stop appends its own ``--overwrite --lr``, which a ``--set lr`` left in would override."""

    def sets_rate(item: str) -> bool:
        return item.partition("=")[0].strip().replace("-", "_") == "lr"

    kept, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--lr", "--set") and (arg == "--lr" or (i + 1 < len(argv) and sets_rate(argv[i + 1]))):
            i += 2
            continue
        if (
            arg not in ("--resume", "--overwrite")
            and not arg.startswith("--lr=")
            and not (arg.startswith("--set=") and sets_rate(arg[len("--set=") :]))
        ):
            kept.append(arg)
        i += 1
    return kept


def _train_reporting_stops(
    request: TrainRequest, place: RunPlace, model, corpus, cfg, out: Path, run_info, evaluate
) -> tuple[dict | None, int]:
    """(summary, 0), or (None, exit code) after one line saying why training stopped and how to go on."""
    from drmlab.runs import RunDir
    from drmlab.training.compiling import CompileError
    from drmlab.training.trainer import NonFiniteLossError, TrainingInterrupted, train

    try:
        summary = train(
            model,
            corpus.train,
            corpus.val,
            cfg,
            out,
            resume=request.resume,
            run_info=run_info,
            evaluate=evaluate,
            device=place.device,
            quiet=place.quiet,
            overwrite=request.overwrite,
            fsdp=place.fsdp,
            tensorboard=place.tensorboard,
        )
    except NonFiniteLossError as exc:
        lower = f"--lr {cfg.lr / 10:g}"
        if RunDir(out).has_checkpoint():
            advice = f"to continue from the kept checkpoint with a fix: drmlab train --resume --out {out} {lower}"
        else:  # nothing to resume: the same command again over the stopped run, at a lower rate
            again = " ".join(shlex.quote(a) for a in _without_rate(place.argv))
            advice = f"no checkpoint was written; start again with a fix: drmlab {again} --overwrite {lower}"
        print(f"drmlab train: error: {exc}\n  {advice} (or --set warmup_fraction=0.05)", file=sys.stderr)
        return None, 1
    except CompileError as exc:
        retry = (
            f"drmlab train --resume --out {out} --set compile=false"
            if RunDir(out).has_checkpoint()
            else "the same command without --compile, with --overwrite (this run wrote no checkpoint)"
        )
        print(f"drmlab train: error: {exc}\n  to train it uncompiled: {retry}", file=sys.stderr)
        return None, 2
    except TrainingInterrupted as exc:
        print(f"drmlab train: {exc}\n  continue with: drmlab train --resume --out {out}", file=sys.stderr)
        return None, 128 + exc.signal
    summary.pop("rows", None)
    return summary, 0
