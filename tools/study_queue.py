"""Run a queue of study commands one after another, so that two terminals keep both cores busy from one study
to the next and a new session starts everything again with one line.

    python tools/study_queue.py studies/queue.txt                    # in one or two terminals
    python tools/study_queue.py studies/queue.txt --dry-run          # the commands, and nothing else

The queue file holds one command per line; blank lines and ``#`` comments are skipped. A worker reads it again
before each command, so a line added (or edited) while the workers run is taken up when its turn comes: the
next command is the first line this worker has not yet run; a file that no longer reads keeps the list it had,
said in one line. Each command should be
a study that two processes can share and that goes on where it stopped (``drmlab ablate``, ``drmlab mqar``,
``python tools/capacity_study.py run``): running the queue again, in this session or the next, then skips
what is finished and resumes what is not; with ``--leave-held`` a worker whose study has nothing left but
runs the other worker holds goes on to the next command instead of waiting. A worker runs the commands in
order as subprocesses, their output appended to the log (``--log``, default the queue file with ``.log`` added) under a header line naming the
command, the time and the worker's pid. A command that ends with 0 is followed by the next; one that fails is reported in one
line and the worker goes on to the next (a later study does not wait on an earlier one), exiting 1 at the
end naming each failure. SIGTERM or SIGINT is passed on to the running command, which checkpoints and stops;
the worker then starts nothing more and exits 128 + the signal. ``tools/pause_studies.py`` finds the running
``drmlab`` commands as it finds any study.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path


def read_queue(path: Path) -> list[str]:
    """The queue's commands in order: one per line, blank lines and ``#`` comments left out. A missing file or
    a line that does not parse as a shell command is one ValueError naming it."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the queue ({exc.strerror or exc})") from None
    commands = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            shlex.split(line)
        except ValueError as exc:
            raise ValueError(f"{path} line {number}: {exc}") from None
        commands.append(line)
    if not commands:
        raise ValueError(f"{path}: no commands (one per line; # starts a comment)")
    return commands


class Worker:
    """Runs the queue's commands in order, reading the file again before each; :meth:`stop` (the signal
    handler) passes the signal to the running one."""

    def __init__(self, queue: Path, commands: list[str], log: Path):
        self.queue, self.commands, self.log = queue, commands, log
        self.ran: list[str] = []  # this worker's commands, in the order it ran them
        self.child: subprocess.Popen | None = None
        self.stopped_by: int | None = None

    def stop(self, signum, frame=None) -> None:
        self.stopped_by = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def next_command(self) -> tuple[int, str] | None:
        """(its place in the queue, counted from 1; the command): the first line of the queue as it reads now
        that this worker has not run (a line run twice in the file runs twice); None when none is left."""
        try:
            self.commands = read_queue(self.queue)
        except ValueError as exc:
            print(f"study_queue: {exc}; going on with the queue as it read before", flush=True)
        left = list(self.ran)
        for index, command in enumerate(self.commands, 1):
            if command in left:
                left.remove(command)
            else:
                return index, command
        return None

    def run(self) -> int:
        failed = []
        while self.stopped_by is None:
            step = self.next_command()
            if step is None:
                break
            index, command = step
            place = f"[{index}/{len(self.commands)}]"
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            print(f"{place} {command}", flush=True)
            self.ran.append(command)
            with open(self.log, "a") as out:
                out.write(f"\n== {now}, worker {os.getpid()}: {command}\n")  # two workers share the log
                out.flush()
                self.child = subprocess.Popen(shlex.split(command), stdout=out, stderr=subprocess.STDOUT)
                code = self.child.wait()
            self.child = None
            if self.stopped_by is not None:
                print(f"{place} stopped by signal {self.stopped_by} (exit {code})", flush=True)
                break
            if code != 0:
                failed.append(f"{command} (exit {code})")
                print(f"{place} failed with exit {code}; see {self.log}", flush=True)
        if self.stopped_by is not None:
            return 128 + self.stopped_by
        if failed:
            print("failed: " + "; ".join(failed), file=sys.stderr)
            return 1
        print(f"all {len(self.ran)} commands finished", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("queue", type=Path, help="the queue file: one study command per line")
    parser.add_argument("--log", type=Path, default=None, help="where the commands' output goes (default QUEUE.log)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands in order and run nothing")
    args = parser.parse_args(argv)
    try:
        commands = read_queue(args.queue)
    except ValueError as exc:
        print(f"study_queue: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for index, command in enumerate(commands, 1):
            print(f"[{index}/{len(commands)}] {command}")
        return 0
    worker = Worker(args.queue, commands, args.log or args.queue.with_name(args.queue.name + ".log"))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, worker.stop)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
