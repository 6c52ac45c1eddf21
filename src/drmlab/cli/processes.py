"""``drmlab train --procs``: one run trained on the CPU cores as N processes of one thread each, data-parallel
over gloo (the DDP path a ``torchrun`` launch takes, :mod:`drmlab.training.distributed`), each process taking
its share of the same global micro-batch, so the run computes the optimisation of one process up to the
order of the gradient sum (docs/guide.md, "Every core").

Torch's threads scale poorly on these small models: on a 2-core AMD EPYC one J tiny run trained slower with
2 threads than with 1, while two one-thread processes did 1.92x the work of one. ``--procs auto`` (the
default) therefore trains a CPU run as one process per idle core when nothing chose otherwise
(:func:`choose_procs`); a busy machine, ``--threads``, a GPU or a short run keep one process.

:func:`drmlab.training.launcher.launch` starts the processes and passes signals on to them.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
# the environment's default for --procs (a shared machine's owner, or a test suite, sets it to 1)
PROCS_VARIABLE = "DRMLAB_PROCS"
# --procs auto keeps one process for a run of fewer steps: starting a process (importing torch, reading the
# corpus, joining the group) costs a few seconds, which a short run does not win back
AUTO_MIN_STEPS = 20


@dataclass(frozen=True)
class ProcsChoice:
    """How many processes train the run, with how many threads each, and the one line that says why
    (None when one process trains it as before)."""

    procs: int
    threads: int
    note: str | None = None


def parse_procs(text: str | None) -> int | str:
    """``--procs``: ``auto`` (or nothing) or a positive whole number of processes."""
    if text is None or str(text).strip().lower() == AUTO:
        return AUTO
    try:
        value = int(str(text))
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"--procs must be a positive whole number of processes or 'auto', got {text!r}")
    return value


def divisors_up_to(batch_size: int, limit: int) -> list[int]:
    """The process counts that split a micro-batch of ``batch_size`` rows evenly, up to ``limit``."""
    return [n for n in range(1, max(1, limit) + 1) if batch_size % n == 0]


def choose_procs(
    requested: int | str,
    *,
    threads: int | None,
    on_cpu: bool,
    launched: bool,
    cores: int,
    others: int | None,
    batch_size: int,
    steps: int,
    recorded: tuple[int, int | None] | None = None,
) -> ProcsChoice:
    """The processes of a run. ``requested``: --procs (a count or ``auto``); ``threads``: --threads (None when
    not given); ``on_cpu``: the run trains on the CPU; ``launched``: this process is already one of a group
    (torchrun or --procs); ``cores`` and ``others``: the machine's cores and the other tasks busy on them
    (None where unknown); ``recorded``: a resumed run's (processes, threads per process), which ``auto`` keeps
    so that the run continues bit for bit. A count that cannot train the run is one ValueError."""
    if requested != AUTO:
        if requested == 1:
            return ProcsChoice(1, threads or 0)
        if launched:
            raise ValueError("--procs starts its own processes: leave it out under torchrun (each rank is one)")
        if not on_cpu:
            raise ValueError(
                "--procs trains on CPU cores; on GPUs launch one process per GPU: "
                "torchrun --no-python --nproc_per_node N drmlab train ..."
            )
        if batch_size % requested:
            fits = ", ".join(str(n) for n in divisors_up_to(batch_size, max(requested, cores)))
            raise ValueError(
                f"--procs {requested} does not split the micro-batch of {batch_size} sequences evenly "
                f"(--batch-size); process counts that do: {fits}"
            )
        return ProcsChoice(requested, threads or 1, _note(requested, threads or 1, "--procs"))
    if launched or not on_cpu:
        return ProcsChoice(1, threads or 0)
    if recorded is not None:
        procs, per_process = recorded
        if procs > 1:
            per = threads or per_process or 1
            return ProcsChoice(procs, per, _note(procs, per, "as the run was started: a resume keeps them"))
        return ProcsChoice(1, threads or 0)
    if threads is not None or steps < AUTO_MIN_STEPS:
        return ProcsChoice(1, threads or 0)
    idle = cores - (others or 0) if others is not None else 1  # unknown load: do not guess
    procs = max(divisors_up_to(batch_size, idle))
    if procs < 2:
        return ProcsChoice(1, 0)
    return ProcsChoice(procs, 1, _note(procs, 1, f"{idle} idle core{'s' if idle != 1 else ''} of {cores}"))


def _note(procs: int, threads: int, why: str) -> str:
    return (
        f"drmlab train: training on {procs} processes of {threads} thread{'s' if threads != 1 else ''} each, "
        f"data-parallel ({why}); --procs 1 trains in one process"
    )


def child_argv(argv: list[str], threads: int) -> list[str]:
    """The command each process runs: ``argv`` (the verb and its flags) without --procs and --threads, with
    ``--threads threads`` instead."""
    kept, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--procs", "--threads"):
            i += 2
            continue
        if not arg.startswith(("--procs=", "--threads=")):
            kept.append(arg)
        i += 1
    return [*kept, "--threads", str(threads)]
