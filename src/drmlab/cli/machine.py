"""What the machine gives a run: torch's CPU threads beside other busy tasks (``--threads``), the cores a
data-parallel CPU run may use (``--procs``, chosen by :mod:`drmlab.cli.processes`, started by
:mod:`drmlab.training.launcher`) and whether a model's training state fits in memory. The thread and process rules are in docs/guide.md, "Every core".

Nothing here imports torch at module level; the helpers that need the library import it when called.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def apply_threads(args: argparse.Namespace, recorded: int | None = None) -> None:
    """:func:`set_threads` from the parsed ``--threads`` and ``--device``."""
    set_threads(getattr(args, "threads", None), getattr(args, "device", "cpu"), recorded=recorded)


def set_threads(threads: int | None, device: str | None, recorded: int | None = None) -> None:
    """Set torch's intra-op threads: ``threads`` (``--threads``) when given; else ``recorded`` (the thread count
    a resumed run was started with: a resume keeps it unless told otherwise, so it continues bit for bit);
    else, on the CPU, torch's default -- fewer when other tasks already keep cores busy
    (:func:`busy_thread_choice`, said in one line). The choice is recorded in the run's config.json
    (``runtime.threads``)."""
    if threads is not None and threads <= 0:
        raise ValueError(f"--threads must be a positive integer, got {threads}")
    import torch

    if threads is None and isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        threads = recorded
    if threads is not None:
        torch.set_num_threads(threads)
        return
    if device == "cpu" or (device in ("auto", None) and not torch.cuda.is_available()):
        cores = cpu_cores()
        default, others = torch.get_num_threads(), other_busy_tasks()
        choice = busy_thread_choice(default, cores, others)
        if choice is not None:
            torch.set_num_threads(choice)
            print(busy_machine_note(default, choice, cores, others), file=sys.stderr)


def other_busy_tasks(looks: int = 3, gap: float = 0.01) -> int | None:
    """How many tasks besides this process are running or waiting for a CPU now: Linux's count of
    runnable tasks (/proc/loadavg), the fewest over a few looks, less this process; None elsewhere."""
    counts = []
    try:
        for look in range(looks):
            if look:
                time.sleep(gap)
            with open("/proc/loadavg") as handle:
                counts.append(int(handle.read().split()[3].split("/")[0]))
    except (OSError, ValueError, IndexError):
        return None
    return max(0, min(counts) - 1)


def busy_thread_choice(threads: int, cores: int, others: int | None) -> int | None:
    """The thread count to use instead of torch's ``threads`` when the ``others`` busy tasks and those
    threads outnumber the ``cores`` (the cores the others leave, at least one); None to keep torch's.

    Torch's CPU threads wait for each other at the end of every operation; when one of them has no
    core, every operation waits for the scheduler. Measured on 2 cores beside one busy process: J at
    preset micro trained at 72 tokens/s with torch's 2 threads and 19,944 with --threads 1 (the CLI
    also makes waiting threads sleep instead of spin: ``drmlab.cli``'s OMP_WAIT_POLICY)."""
    if others is None or threads <= 1 or threads + others <= cores:
        return None
    return max(1, min(threads, cores - others))


def busy_machine_note(threads: int, choice: int, cores: int, others: int) -> str:
    """The one line saying that the run uses ``choice`` threads instead of torch's ``threads``."""
    return (
        f"drmlab: {others} other task{'s' if others != 1 else ''} already busy on this {cores}-core machine: "
        f"using {choice} thread{'s' if choice != 1 else ''} instead of torch's {threads} (threads that wait for "
        "each other on a busy CPU can make training a hundred times slower); pass --threads N to choose"
    )


TRAINING_BYTES_PER_PARAMETER = 16  # float32 weight, gradient and AdamW's two moments


def available_memory_bytes(device: str | None) -> int | None:
    """Memory free for a new model on ``device``: the GPU's free memory, else MemAvailable of /proc/meminfo
    (None where neither can be read)."""
    import torch

    from drmlab.devices import resolve_device

    target = resolve_device(device)
    if target.type == "cuda":
        return int(torch.cuda.mem_get_info(target)[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_model_fits(name: str, preset: str, vocab_size: int, overrides: dict, device: str | None) -> None:
    """Refuse in one line a model whose training state cannot fit in memory, before allocating it: the model
    is built on the meta device (no memory) and its parameters counted. ``--set d_state=100000000`` hung in
    the allocation, then failed with a traceback."""
    import torch

    from drmlab.models import build_model, count_parameters

    with torch.device("meta"):
        params = count_parameters(build_model(name, preset, vocab_size=vocab_size, seed=0, **overrides))
    need, free = params * TRAINING_BYTES_PER_PARAMETER, available_memory_bytes(device)
    if free is not None and need > free:
        settings = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "its preset"
        raise ValueError(
            f"{name} ({preset}, {settings}) has {params:,} parameters: training needs at least "
            f"{need / 2**30:,.1f} GiB (weights, gradients, AdamW state), and {free / 2**30:,.1f} GiB "
            "is available"
        )
