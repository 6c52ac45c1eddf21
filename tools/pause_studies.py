"""Pause the study processes on this machine while a benchmark takes its figures, then let them go on.

    python tools/pause_studies.py list     # the study processes: pid, state, command
    python tools/pause_studies.py stop     # suspend them (and their children)
    python tools/pause_studies.py cont     # let them go on

A study process is a ``drmlab`` study verb (ablate, mqar, specialise, loop-study) or this repository's
study drivers (``tools/capacity_study.py``). ``stop`` sends each SIGTSTP, which drmlab's pause clock
(:mod:`drmlab.training.pauses`) answers by stopping itself and leaving the suspended time out of the run's
step times, tokens/s and ``train_seconds``; their children (Inductor's compile workers, a driver's
``drmlab`` subprocesses) get SIGSTOP. ``cont`` sends SIGCONT to all of them. A process of code older than
the pause clock ignores SIGTSTP when it runs in the background; ``stop`` then says so and sends it SIGSTOP
(its suspended time then counts as running time). Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

STUDY_VERBS = ("ablate", "mqar", "specialise", "loop-study")
DRIVERS = ("capacity_study.py",)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, T stopped, ...); "" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[0]


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def is_drmlab_study(argv: list[str]) -> bool:
    """Whether a command line is ``drmlab VERB`` (or ``python -m drmlab VERB``) with a study verb."""
    words = [Path(w).name for w in argv]
    return any(word == "drmlab" and words[i + 1] in STUDY_VERBS for i, word in enumerate(words[:-1]))


def is_driver(argv: list[str]) -> bool:
    """Whether a command line runs one of this repository's study drivers (tools/)."""
    return any(Path(w).name in DRIVERS for w in argv[:3])


def study_processes() -> list[int]:
    """The pids of the study processes and drivers on this machine (not this one)."""
    pids = [int(p.name) for p in Path("/proc").glob("[0-9]*") if int(p.name) != os.getpid()]
    commands = {pid: _cmdline(pid) for pid in pids}  # read once: a process may end between two reads
    return sorted(pid for pid, argv in commands.items() if is_drmlab_study(argv) or is_driver(argv))


def _family(pid: int) -> list[int]:
    """``pid``'s descendants."""
    out, todo = [], _children(pid)
    while todo:
        kid = todo.pop(0)
        out.append(kid)
        todo += _children(kid)
    return out


def stop(pids: list[int], wait: float = 5.0) -> list[str]:
    """Suspend each drmlab study process with SIGTSTP (SIGSTOP if it does not answer in ``wait`` seconds),
    each driver and every other descendant with SIGSTOP; lines saying what."""
    lines, studies = [], [pid for pid in pids if is_drmlab_study(_cmdline(pid))]
    for pid in studies:
        os.kill(pid, signal.SIGTSTP)
    deadline = time.monotonic() + wait
    while any(_state(pid) not in ("T", "t", "") for pid in studies) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in studies:
        if _state(pid) in ("T", "t", ""):
            lines.append(f"{pid}: suspended by SIGTSTP")
        else:
            os.kill(pid, signal.SIGSTOP)
            lines.append(f"{pid}: did not answer SIGTSTP in {wait:g} s (code older than the pause clock?): SIGSTOP")
    others = [pid for pid in pids if pid not in studies]
    others += [kid for pid in pids for kid in _family(pid) if kid not in pids]
    for pid in dict.fromkeys(others):
        os.kill(pid, signal.SIGSTOP)
        if pid in pids:
            lines.append(f"{pid}: suspended (a driver)")
    return lines


def cont(pids: list[int]) -> list[str]:
    """SIGCONT to every descendant of the study processes, then to them."""
    for kid in dict.fromkeys(kid for pid in pids for kid in _family(pid)):
        os.kill(kid, signal.SIGCONT)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    return [f"{pid}: going on" for pid in pids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("list", "stop", "cont"))
    args = parser.parse_args(argv)
    if not Path("/proc/self/stat").is_file():
        print("pause_studies: needs Linux's /proc", file=sys.stderr)
        return 2
    pids = study_processes()
    if args.action == "list":
        lines = [f"{pid} {_state(pid)} {' '.join(_cmdline(pid))}" for pid in pids]
    else:
        lines = (stop if args.action == "stop" else cont)(pids)
    print("\n".join(lines) if lines else "no study processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
