"""Kill campaign: drmlab as a crashing machine, a full disk, a damaged file and a second writer treat it.

One command runs the matrix of docs/runs.md ("The rows") with real ``drmlab`` verbs (``drmlab.cli.main``
in a forked child of this process: the same code as ``python -m drmlab``, without paying the imports per
child) on a preset-micro run, and prints counts:

* **syscall kills** -- SIGKILL at the K-th rename, fsync and open-for-write inside the run directory (an
  LD_PRELOAD shim compiled with gcc counts them; every K of a census run), then the follow-up a user would
  type (``--resume``; a plain start or ``--overwrite`` when nothing was committed): the run must end
  bit-exactly as the uninterrupted one (final weights' sha256, every step's loss, val CE), and never start
  again when a checkpoint had been committed;
* **ENOSPC** -- training into a real tmpfs of several sizes (needs root and mount; else the row is skipped
  with the reason): exit 0, or one line naming the path; every committed checkpoint still verifies and,
  copied to a roomy disk, resumes bit-exactly;
* **bit flips** -- a sample of bit positions of every file of a finished run, each flip under each verb
  (``train --resume`` with a higher ``--tokens``, ``eval``, ``generate``, ``export``, ``report``): exit 0 with
  the undamaged run's results, or one line; never a traceback, never a checkpoint file deleted or changed by
  a verb that failed. Files without a checksum (metrics.jsonl, summary.json, eval.json, .lock) may change what
  ``report`` shows; that is counted apart, not as a failure;
* **two writers** -- a second ``train``, ``--resume`` and ``--overwrite`` while a run trains are refused in
  one line naming the holder, two starts at the same moment leave one run, and the trained run ends
  bit-exactly;
* **readers** -- reader threads loading the checkpoint (``load_model``, ``read_checkpoint``, ``read_pointer``,
  ``read_state``, ``resolve_checkpoint``) while a writer process commits in a loop; false "missing" or
  "damaged" counted with the retry and, for comparison, without it (``READ_ATTEMPTS = 1``).

Exits 1 when any row failed. ``--quick`` runs a subset in about a minute.

    PYTHONPATH=src python benchmarks/kill_campaign.py            # the whole matrix, a few minutes
    PYTHONPATH=src python benchmarks/kill_campaign.py --quick    # every row, fewer cases
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import NamedTuple

SHIM_ENV = "DRMLAB_KILL_CAMPAIGN_SHIM"  # set (to the shim's path) once this process runs with the shim preloaded
CLASSES = ("rename", "fsync", "open-for-write")  # the shim's classes, in its numbering
SHIM_SOURCE = r"""
/* Counts, and on request SIGKILLs the process at, the K-th rename / fsync / open-for-write inside a folder. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { RENAME, FSYNC, OPEN_WRITE, CLASSES };
static char under[4096];
static size_t under_len;
static int armed_class = -1, kill_after;
static long kill_at, counts[CLASSES];

void campaign_arm(const char *folder, int klass, long at, int after) {
    strncpy(under, folder, sizeof under - 1);
    under_len = strlen(under);
    armed_class = klass; kill_at = at; kill_after = after;
    for (int i = 0; i < CLASSES; i++) counts[i] = 0;
}

long campaign_count(int klass) { return counts[klass]; }

static int inside(const char *path) {
    return under_len && path && strncmp(path, under, under_len) == 0 && (path[under_len] == 0 || path[under_len] == '/');
}

static int fd_inside(int fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    return inside(target);
}

static int before_call(int klass) {  /* count the call; SIGKILL now, or say to after it */
    long k = __atomic_add_fetch(&counts[klass], 1, __ATOMIC_SEQ_CST);
    if (klass != armed_class || k != kill_at) return 0;
    if (!kill_after) kill(getpid(), SIGKILL);
    return 1;
}

static void after_call(int die) { if (die) kill(getpid(), SIGKILL); }

#define REAL(name) static __typeof__(&name) real_##name; \
    if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

int rename(const char *a, const char *b) {
    REAL(rename);
    int die = (inside(a) || inside(b)) ? before_call(RENAME) : 0;
    int r = real_rename(a, b); after_call(die); return r;
}
int renameat(int da, const char *a, int db, const char *b) {
    REAL(renameat);
    int die = (inside(a) || inside(b)) ? before_call(RENAME) : 0;
    int r = real_renameat(da, a, db, b); after_call(die); return r;
}
int renameat2(int da, const char *a, int db, const char *b, unsigned flags) {
    REAL(renameat2);
    int die = (inside(a) || inside(b)) ? before_call(RENAME) : 0;
    int r = real_renameat2(da, a, db, b, flags); after_call(die); return r;
}
int fsync(int fd) {
    REAL(fsync);
    int die = fd_inside(fd) ? before_call(FSYNC) : 0;
    int r = real_fsync(fd); after_call(die); return r;
}
int fdatasync(int fd) {
    REAL(fdatasync);
    int die = fd_inside(fd) ? before_call(FSYNC) : 0;
    int r = real_fdatasync(fd); after_call(die); return r;
}

static int writes(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_APPEND)); }

#define MODE(flags) mode_t mode = 0; \
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
#define OPEN_WRAPPER(name) int name(const char *path, int flags, ...) { \
        REAL(name); MODE(flags) \
        int die = (writes(flags) && inside(path)) ? before_call(OPEN_WRITE) : 0; \
        int r = real_##name(path, flags, mode); after_call(die); return r; }
#define OPENAT_WRAPPER(name) int name(int dir, const char *path, int flags, ...) { \
        REAL(name); MODE(flags) \
        int die = (writes(flags) && inside(path)) ? before_call(OPEN_WRITE) : 0; \
        int r = real_##name(dir, path, flags, mode); after_call(die); return r; }
#define FOPEN_WRAPPER(name) FILE *name(const char *path, const char *how) { \
        REAL(name); \
        int die = (how && strpbrk(how, "wa+") && inside(path)) ? before_call(OPEN_WRITE) : 0; \
        FILE *r = real_##name(path, how); after_call(die); return r; }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)
FOPEN_WRAPPER(fopen)
FOPEN_WRAPPER(fopen64)
"""


# ---------------------------------------------------------------- the shim and the forked verbs


def build_shim(root: Path) -> tuple[Path | None, str]:
    """(the compiled shim, "") or (None, why not)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None, "no C compiler (gcc) to build the LD_PRELOAD shim"
    source, library = root / "kill_shim.c", root / "kill_shim.so"
    source.write_text(SHIM_SOURCE)
    done = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], capture_output=True
    )
    if done.returncode != 0:
        return None, f"the shim did not compile: {done.stderr.decode(errors='replace').strip().splitlines()[-1:]}"
    return library, ""


class Outcome(NamedTuple):
    """What a forked ``drmlab`` verb did: its exit code (None when killed), the signal that killed it, its output."""

    rc: int | None
    signal: int | None
    out: str
    err: str

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    @property
    def one_line_error(self) -> bool:
        """A non-zero exit with exactly one line on stderr and no traceback."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        return self.rc not in (0, None) and len(lines) == 1 and not self.traceback


class Campaign:
    """The campaign's folder, corpus, shim and the forked verbs."""

    def __init__(self, root: Path, model: str, shim: ctypes.CDLL | None):
        self.root, self.model, self.shim = root, model, shim
        self.corpus = root / "corpus.txt"
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        texts = ("textwrap.py", "bisect.py", "colorsys.py", "shlex.py")
        self.corpus.write_text("\n\n".join((stdlib / n).read_text() for n in texts))
        self.cache = root / "cache"
        self.calls = 0

    def train_argv(self, out: Path, tokens: str = "2k", *flags: str) -> list[str]:
        return [
            "train", "--model", self.model, "--preset", "micro", "--tokens", tokens, "--schedule", "constant",
            "--eval-every", "1k", "--eval-tokens", "512", "--set", "checkpoint_every=512", "--threads", "1",
            "--out", str(out), "--data", str(self.corpus), "--cache-dir", str(self.cache), "--quiet", *flags,
        ]  # fmt: skip

    def verb(self, argv: list[str], arm: tuple[Path, int, int, bool] | None = None) -> Outcome:
        """Run ``drmlab ARGV`` in a forked child and wait for it (:meth:`spawn`, :meth:`finish`)."""
        return self.finish(self.spawn(argv, arm))

    def spawn(self, argv: list[str], arm: tuple[Path, int, int, bool] | None = None) -> tuple[int, Path, Path]:
        """Start ``drmlab ARGV`` in a forked child; ``arm`` = (folder, class, K, after): the shim SIGKILLs the
        child at (or right after) its K-th call of that class inside the folder. Returns (pid, its stdout, stderr)."""
        self.calls += 1
        out_path, err_path = self.root / "logs" / f"{self.calls}.out", self.root / "logs" / f"{self.calls}.err"
        out_path.parent.mkdir(exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            rc = 70
            try:
                os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
                os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
                if arm is not None:
                    folder, klass, at, after = arm
                    self.shim.campaign_arm(str(folder).encode(), klass, at, int(after))
                from drmlab.cli import main as cli

                try:
                    rc = int(cli(argv) or 0)
                except SystemExit as exc:  # argparse
                    rc = exc.code if isinstance(exc.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    rc = 70
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        return pid, out_path, err_path

    @staticmethod
    def finish(child: tuple[int, Path, Path]) -> Outcome:
        pid, out_path, err_path = child
        _, status = os.waitpid(pid, 0)
        killed = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        return Outcome(rc, killed, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"))

    @staticmethod
    def running(child: tuple[int, Path, Path]) -> bool:
        """Whether the child is still running (it is not reaped: :meth:`finish` still waits for it)."""
        try:
            return os.waitid(os.P_PID, child[0], os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def census(self, out: Path) -> dict[str, int]:
        """The calls of each class a whole training run makes inside its directory (a child counting them)."""
        result = self.root / "census.json"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                self.shim.campaign_arm(str(out).encode(), -1, 0, 0)
                from drmlab.cli import main as cli

                code = int(cli(self.train_argv(out)) or 0)
                self.shim.campaign_count.restype = ctypes.c_long
                counts = {name: int(self.shim.campaign_count(i)) for i, name in enumerate(CLASSES)}
                result.write_text(json.dumps(counts))
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(f"the census run failed (status {status})")
        return json.loads(result.read_text())


def tensors_sha256(path: Path) -> str:
    """The sha256 of a safetensors file's tensors (names, dtypes, shapes, bytes): the file's own bytes are not
    reproducible across processes, as safetensors writes its metadata map in a per-process hash order."""
    import torch
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(str(path)).items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_result(run: Path) -> dict:
    """What a finished run produced: final weights' sha256, step, every train row's loss, val CE."""
    from drmlab.runs import RunDir

    rundir = RunDir(run)
    folder, pointer, _ = rundir.resolve_checkpoint()
    summary = rundir.read_summary() or {}
    losses = [r.get("loss") for r in rundir.read_metrics() if r.get("kind") == "train"]
    return {"weights": tensors_sha256(folder / "model.safetensors"), "step": pointer["step"], "losses": losses,
            "val_ce": summary.get("val_ce"), "finished": summary.get("finished")}  # fmt: skip


def checkpoint_files(run: Path) -> dict[str, bytes]:
    folder = run / "checkpoints"
    return (
        {str(p.relative_to(run)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}
    )


def verified_step(run: Path) -> int | None:
    """The step of the checkpoint that verifies (every file), or None."""
    from drmlab.runs import RunDir

    try:
        return RunDir(run).resolve_checkpoint()[1]["step"]
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- row 1: SIGKILL at the K-th syscall


def follow_up(c: Campaign, run: Path) -> tuple[Outcome, str]:
    """What a user does after a crash: ``--resume``; when nothing was committed, a plain start, or
    ``--overwrite`` when the directory already holds a run. Returns the last outcome and the path taken."""
    outcome = c.verb(c.train_argv(run, "2k", "--resume"))
    if outcome.rc == 0:
        return outcome, "resume"
    if not outcome.one_line_error or "nothing to resume" not in outcome.err:
        return outcome, "resume"
    outcome = c.verb(c.train_argv(run))
    if outcome.rc == 0 or not outcome.one_line_error or "--overwrite" not in outcome.err:
        return outcome, "start"
    return c.verb(c.train_argv(run, "2k", "--overwrite")), "overwrite"


def syscall_kills(c: Campaign, reference: dict, census: dict[str, int], every: int, after: bool) -> dict:
    rows, failures = {}, []
    for klass, name in enumerate(CLASSES):
        ks = list(range(1, census[name] + 1, every))
        counts = {"kills": 0, "bit_exact": 0, "resumed": 0, "restarted": 0, "not_killed": 0}
        for k in ks:
            for mode in ("before", "after") if after else ("before",):
                run = c.root / "kills" / f"{name}-{k}-{mode}"
                killed = c.verb(c.train_argv(run), arm=(run, klass, k, mode == "after"))
                if killed.signal != 9:
                    counts["not_killed"] += 1
                    failures.append(f"{name} #{k} {mode}: not killed (rc {killed.rc}): {killed.err.strip()[-200:]}")
                    continue
                counts["kills"] += 1
                committed = verified_step(run)
                outcome, path = follow_up(c, run)
                counts["resumed" if path == "resume" else "restarted"] += 1
                if outcome.rc != 0:
                    failures.append(f"{name} #{k} {mode}: the follow-up ({path}) failed: {outcome.err.strip()[-300:]}")
                    continue
                if committed is not None and path != "resume":
                    failures.append(f"{name} #{k} {mode}: step {committed} was committed but the run started again")
                if run_result(run) == reference:
                    counts["bit_exact"] += 1
                    shutil.rmtree(run, ignore_errors=True)  # kept when it failed, to look at
                else:
                    failures.append(f"{name} #{k} {mode}: the resumed run differs from the uninterrupted one ({run})")
        rows[name] = dict(census=census[name], tried=len(ks) * (2 if after else 1), **counts)
    return {"classes": rows, "failures": failures}


# ---------------------------------------------------------------- row 2: a full disk (a real tmpfs)


def full_disk(c: Campaign, reference: dict, sizes_kb: list[int]) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "mounting a tmpfs needs root"}
    if shutil.which("mount") is None:
        return {"skipped": "mount(8) is not installed"}
    cases, failures = [], []
    for size in sizes_kb:
        where = c.root / f"tmpfs-{size}k"
        where.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(where)], capture_output=True
        )
        if mounted.returncode != 0:
            return {"skipped": f"mount -t tmpfs failed: {mounted.stderr.decode(errors='replace').strip()}"}
        try:
            run = where / "run"
            outcome = c.verb(c.train_argv(run))
            case = {"size_kb": size, "rc": outcome.rc, "error": outcome.err.strip()}
            if outcome.rc != 0 and not (outcome.one_line_error and str(where) in outcome.err):
                failures.append(f"{size} KB: not one line naming the path: {outcome.err.strip()[-300:]}")
            leftovers = [p.name for p in run.iterdir() if p.name.startswith(".checkpoint-")] if run.is_dir() else []
            if leftovers:
                failures.append(f"{size} KB: temporary folders left: {leftovers}")
            step = verified_step(run) if run.is_dir() else None
            case["committed_step"] = step
            if outcome.rc == 0:
                case["exact"] = run_result(run) == reference
            elif step is not None or (run / "config.json").is_file():  # resume it on a roomy disk
                roomy = c.root / f"roomy-{size}k"
                shutil.copytree(run, roomy, symlinks=True)
                again, path = follow_up(c, roomy)
                case["exact"] = again.rc == 0 and run_result(roomy) == reference and (step is None or path == "resume")
            else:
                case["exact"] = None  # nothing was written to resume from
            if case["exact"] is False:
                failures.append(f"{size} KB: the run did not end bit-exactly after the full disk")
            cases.append(case)
        finally:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
    return {"cases": cases, "failures": failures}


# ---------------------------------------------------------------- row 3: bit flips of every file


UNCHECKED = ("metrics.jsonl", "summary.json", "eval.json", ".lock")  # files a run keeps without a checksum
RESUMED_FROM = 8  # the step of the finished run's checkpoint (2k tokens at 256 a step) that --resume continues


def verbs(c: Campaign, run: Path, scratch: Path) -> dict[str, list[str]]:
    return {
        "train --resume": c.train_argv(run, "3k", "--resume"),
        "eval": ["eval", "--ckpt", str(run), "--data", str(c.corpus), "--cache-dir", str(c.cache),
                 "--eval-tokens", "512", "--threads", "1", "--quiet"],
        "generate": ["generate", "--ckpt", str(run), "--prompt", "def ", "--max-tokens", "24", "--temperature", "0"],
        "export": ["export", "--ckpt", str(run), "--out", str(scratch / "hf")],
        "report": ["report", str(run)],
    }  # fmt: skip


def verb_result(verb: str, run: Path, scratch: Path, outcome: Outcome):
    """What the verb produced, to compare with the undamaged run's (None for a failed verb)."""
    if outcome.rc != 0:
        return None
    if verb == "train --resume":  # the losses before the resumed checkpoint are metrics.jsonl's kept rows
        result = run_result(run)
        from drmlab.runs import RunDir

        rows = [r for r in RunDir(run).read_metrics() if r.get("kind") == "train"]
        new = [isinstance(r.get("step"), int) and r["step"] > RESUMED_FROM for r in rows]  # a flipped key: kept
        result["losses"] = [r.get("loss") for r, is_new in zip(rows, new) if is_new]
        result["kept_losses"] = [r.get("loss") for r, is_new in zip(rows, new) if not is_new]
        return result
    if verb == "eval":
        saved = json.loads((run / "eval.json").read_text())
        return {k: saved.get(k) for k in ("ce", "bpb", "targets", "step")}
    if verb == "generate":
        return outcome.out
    if verb == "export":
        record = json.loads((scratch / "hf" / "drmlab_run.json").read_text())
        return tensors_sha256(scratch / "hf" / "model.safetensors"), record["step"], record["checkpoint_sha256"]
    page = (run / "report.html").read_text()
    return page.split("<h2>Checkpoint</h2>", 1)[1].split("<h2>", 1)[0]


def bit_flips(c: Campaign, pristine: Path, bits: int, seed: int, rotate: bool = False) -> dict:
    """Flip ``bits`` sampled bits of every file of ``pristine``, each under every verb (``rotate``: one verb per
    flip, taking turns)."""
    rng = random.Random(seed)
    files = sorted(p.relative_to(pristine) for p in pristine.rglob("*") if p.is_file())
    expected, counts, failures, unchecked_changes = {}, {}, [], []
    for verb in verbs(c, pristine, pristine):
        run, scratch = c.root / "flip" / "run", c.root / "flip" / "scratch"
        shutil.rmtree(c.root / "flip", ignore_errors=True)
        shutil.copytree(pristine, run)
        scratch.mkdir()
        outcome = c.verb(verbs(c, run, scratch)[verb])
        if outcome.rc != 0:
            raise RuntimeError(f"{verb} failed on the undamaged run: {outcome.err.strip()[-300:]}")
        expected[verb] = verb_result(verb, run, scratch, outcome)
    for name in files:
        size = (pristine / name).stat().st_size
        positions = sorted(rng.sample(range(8 * size), min(bits, 8 * size)))
        row = counts.setdefault(str(name), {"flips": len(positions), "same": 0, "refused": 0, "stated": 0,
                                             "changed_unchecked": 0, "failed": 0})  # fmt: skip
        for index, bit in enumerate(positions):
            names = list(expected)
            turn = [names[(files.index(name) + index) % len(names)]] if rotate else names
            for verb in turn:
                run, scratch = c.root / "flip" / "run", c.root / "flip" / "scratch"
                shutil.rmtree(c.root / "flip", ignore_errors=True)
                shutil.copytree(pristine, run)
                scratch.mkdir()
                data = bytearray((run / name).read_bytes())
                data[bit // 8] ^= 1 << (bit % 8)
                (run / name).write_bytes(bytes(data))
                before = checkpoint_files(run)
                outcome = c.verb(verbs(c, run, scratch)[verb])
                where = f"{name} bit {bit} / {verb}"
                if outcome.traceback or (outcome.rc != 0 and not outcome.one_line_error):
                    row["failed"] += 1
                    failures.append(f"{where}: exit {outcome.rc} with {outcome.err.strip()[-400:]!r}")
                    continue
                if outcome.rc != 0 or verb != "train --resume":  # nothing of the checkpoint may change
                    gone = [f for f, b in before.items() if checkpoint_files(run).get(f) != b]
                    if gone:
                        row["failed"] += 1
                        failures.append(f"{where}: exit {outcome.rc} but changed or deleted {gone}")
                        continue
                if outcome.rc != 0:
                    row["refused"] += 1
                    continue
                try:
                    result = verb_result(verb, run, scratch, outcome)
                except Exception as exc:  # what the verb left cannot be read back: counted, looked at
                    row["failed"] += 1
                    failures.append(f"{where}: exit 0 but its results cannot be read ({type(exc).__name__}: {exc})")
                    continue
                kept_only = verb == "train --resume" and {**result, "kept_losses": None} == {
                    **expected[verb], "kept_losses": None}  # fmt: skip
                if result == expected[verb]:
                    row["same"] += 1
                elif verb == "report" and ("Damaged: " in result or "Recovered: " in result):
                    row["stated"] += 1  # the page says the checkpoint is damaged or was recovered
                elif kept_only and "lacks the train rows" in outcome.err:
                    row["stated"] += 1  # the resume said which metrics rows were lost; its own results are the same
                elif name.name in UNCHECKED and (verb == "report" or kept_only):
                    row["changed_unchecked"] += 1  # e.g. a flipped digit of a kept loss, shown as it is
                    unchecked_changes.append(where)
                else:
                    row["failed"] += 1
                    failures.append(f"{where}: exit 0 with other results than the undamaged run")
    return {"files": counts, "failures": failures, "unchecked_changes": unchecked_changes[:8]}


# ---------------------------------------------------------------- row 4: two writers


def lock_held(run: Path) -> bool:
    path = run / ".lock"
    if not path.is_file():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def two_writers(c: Campaign, tokens: str) -> dict:
    failures, refused = [], {}
    alone = c.root / "writers" / "alone"
    if c.verb(c.train_argv(alone, tokens)).rc != 0:
        return {"failures": ["the lone run failed"]}
    expected = run_result(alone)
    run = c.root / "writers" / "shared"
    first = c.spawn(c.train_argv(run, tokens))
    deadline = time.monotonic() + 120
    while not lock_held(run) and c.running(first) and time.monotonic() < deadline:
        time.sleep(0.01)
    for label, flags in (("train", ()), ("train --resume", ("--resume",)), ("train --overwrite", ("--overwrite",))):
        second = c.verb(c.train_argv(run, tokens, *flags))
        # refused in one line: the lock's holder named, or (a plain start) the run that is already there
        ok = second.one_line_error and ("in use by process" in second.err or "already holds a run" in second.err)
        refused[label] = "one line: " + ("names the holder" if "in use by process" in second.err else "run exists")
        if not ok:
            refused[label] = f"exit {second.rc}"
        if not ok:
            failures.append(f"a second {label} while the run trains: exit {second.rc}: {second.err.strip()[-300:]}")
    raced = c.running(first)
    done = c.finish(first)
    if not raced:
        failures.append("the first writer finished before the second ones tried: nothing was raced (raise --tokens)")
    if done.rc != 0 or run_result(run) != expected:
        failures.append(f"the first writer did not end bit-exactly (exit {done.rc}): {done.err.strip()[-200:]}")
    # two starts at the same moment on an empty directory: one trains, the other is refused in one line
    pair = c.root / "writers" / "pair"
    both = [c.finish(child) for child in [c.spawn(c.train_argv(pair, tokens)) for _ in range(2)]]
    codes = sorted(o.rc for o in both)
    loser_ok = all(o.rc == 0 or o.one_line_error for o in both)
    if codes[0] != 0 or not loser_ok or run_result(pair) != expected:
        failures.append(f"two simultaneous starts: exits {codes}, {[o.err.strip()[-200:] for o in both]}")
    return {"refused_while_training": refused, "raced": raced, "simultaneous_exits": codes, "failures": failures}


# ---------------------------------------------------------------- row 5: readers racing commits


WRITER = r"""
import sys, time, torch
torch.set_num_threads(1)
from drmlab.models import build_model
from drmlab.runs import RunDir
run, seconds = RunDir(sys.argv[1]), float(sys.argv[2])
model = build_model(sys.argv[3], "micro", vocab_size=256, seed=1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()
optimizer.step()
run.create()
run.write_config({"model": sys.argv[3], "preset": "micro", "vocab_size": 256, "train": {"seed": 1}})
step, end = 0, None
while end is None or time.monotonic() < end:
    step += 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4)
    run.save_checkpoint(model, optimizer, {"step": step})
    end = end or time.monotonic() + seconds
    time.sleep(0.005)
print(step)
"""


def readers(c: Campaign, seconds: float, attempts: int | None) -> dict:
    """Reader threads against a writer process for ``seconds``; ``attempts``: the retry's attempts (None: as
    shipped). Runs in a forked child (threads never live in the parent that forks the verbs)."""
    out = c.root / f"readers-{attempts}.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _readers_child(c, seconds, attempts, out)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    return json.loads(out.read_text()) if out.is_file() else {"failures": ["the readers child crashed"]}


def _readers_child(c: Campaign, seconds: float, attempts: int | None, out: Path) -> int:
    import torch

    from drmlab.models import build_model
    from drmlab.runs import RunDir, checkpoint

    if attempts is not None:
        checkpoint.READ_ATTEMPTS = attempts
    run = RunDir(c.root / f"readers-run-{attempts}")
    env = dict(os.environ, LD_PRELOAD="")  # the writer runs without the shim
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run.path), str(seconds), c.model], stdout=subprocess.PIPE, text=True, env=env
    )
    while not run.pointer_path.is_file() and writer.poll() is None:
        time.sleep(0.01)
    stop, lock = threading.Event(), threading.Lock()
    counts, failures, steps = {}, [], set()
    names = ("load_model", "read_checkpoint", "read_pointer", "read_state", "resolve_checkpoint")

    def reader(first: int) -> None:
        model = build_model(c.model, "micro", vocab_size=256, seed=1)
        k = first
        while not stop.is_set():
            name = names[k % len(names)]
            k += 1
            try:
                if name == "load_model":
                    step = run.load_model()[2]["step"]
                elif name == "read_checkpoint":
                    step = run.read_checkpoint(model, restore_rng=False)[0]["step"]
                elif name == "read_pointer":
                    step = run.read_pointer()["step"]
                elif name == "read_state":
                    step = run.read_state()["step"]
                else:
                    _, pointer, note = run.resolve_checkpoint()
                    step = pointer["step"]
                    if note is not None:
                        raise ValueError(f"a false recovery: {note}")
                with lock:
                    counts[name] = counts.get(name, 0) + 1
                    steps.add(step)
            except Exception as exc:
                with lock:
                    failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:160]}")

    torch.set_num_threads(1)
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    written = writer.communicate()[0].split()
    stop.set()
    for thread in threads:
        thread.join()
    result = {"attempts": attempts or checkpoint.READ_ATTEMPTS, "loads": sum(counts.values()), "by_reader": counts,
              "commits": int(written[-1]) if written else 0, "steps_seen": len(steps), "false_failures": len(failures),
              "examples": failures[:3]}  # fmt: skip
    out.write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------- main


def warm_up(c: Campaign) -> None:
    """Run every verb once in this process, so that what they import on first use (at module level and inside
    functions: torch's compiler stack, transformers, matplotlib) is imported before any child is forked: each
    forked verb then starts at once. Its files go to a folder of their own."""
    import contextlib
    import io

    from drmlab.cli import main as cli

    run, scratch = c.root / "warm-up" / "run", c.root / "warm-up"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for argv in [c.train_argv(run), *verbs(c, run, scratch).values()]:
            if cli(argv) != 0:
                raise RuntimeError(f"drmlab {' '.join(argv)} failed while warming up")
    if threading.active_count() != 1:
        raise RuntimeError(f"the warm-up left {threading.active_count() - 1} threads; forking would be unsafe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset of every row, about a minute")
    parser.add_argument("--model", default="SSM_CONTROL", help="registered model (preset micro)")
    parser.add_argument(
        "--bits", type=int, default=None, help="bit positions flipped per file (default 2; quick 1, one verb each)"
    )
    parser.add_argument("--every", type=int, default=None, help="kill at every N-th call (default 1; quick 6)")
    parser.add_argument("--after", action="store_true", help="also kill right after each call, not only before")
    parser.add_argument("--readers-seconds", type=float, default=None, help="readers row length (default 20; quick 3)")
    parser.add_argument("--rows", default="kills,disk,flips,writers,readers", help="comma-separated rows to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    bits = args.bits if args.bits is not None else (1 if args.quick else 2)
    every = args.every if args.every is not None else (6 if args.quick else 1)
    seconds = args.readers_seconds if args.readers_seconds is not None else (3.0 if args.quick else 20.0)
    rows = set(args.rows.split(","))

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    if os.environ.get(SHIM_ENV) is None:  # run again with the shim preloaded (or without, saying why)
        root = Path(tempfile.mkdtemp(prefix="kill-campaign-"))
        library, why = build_shim(root)
        env = dict(os.environ, **{SHIM_ENV: str(library) if library else f"none: {why}"})
        if library is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), str(library)]))
        env["DRMLAB_KILL_CAMPAIGN_ROOT"] = str(root)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    root = Path(os.environ["DRMLAB_KILL_CAMPAIGN_ROOT"])
    shim_path = os.environ[SHIM_ENV]
    shim = None if shim_path.startswith("none") else ctypes.CDLL(shim_path)

    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    c = Campaign(root, args.model, shim)
    warm_up(c)
    reference_run = root / "reference"
    first = c.verb(c.train_argv(reference_run))
    if first.rc != 0:
        print(f"the reference run failed: {first.err}", file=sys.stderr)
        return 1
    reference = run_result(reference_run)
    report: dict = {"model": args.model, "quick": args.quick, "work_dir": str(root)}

    if "kills" in rows:
        if shim is None:
            report["syscall_kills"] = {"skipped": shim_path}
        else:
            census = c.census(root / "census-run")
            report["syscall_kills"] = syscall_kills(c, reference, census, every, args.after)
        print("syscall kills:", json.dumps(report["syscall_kills"].get("classes", report["syscall_kills"])), flush=True)
    if "disk" in rows:
        sizes = [160, 480] if args.quick else [8, 16, 64, 160, 320, 480, 640, 1024]
        report["full_disk"] = full_disk(c, reference, sizes)
        print("full disk:", json.dumps(report["full_disk"].get("cases", report["full_disk"])), flush=True)
    if "flips" in rows:
        pristine = root / "pristine"
        shutil.copytree(reference_run, pristine)
        assert c.verb(verbs(c, pristine, root)["eval"]).rc == 0  # the run with an eval.json, as users have it
        report["bit_flips"] = bit_flips(c, pristine, bits, args.seed, rotate=args.quick)
        print("bit flips:", json.dumps(report["bit_flips"]["files"]), flush=True)
    if "writers" in rows:
        report["two_writers"] = two_writers(c, "6k" if args.quick else "10k")
        print("two writers:", json.dumps({k: v for k, v in report["two_writers"].items() if k != "failures"}))
    if "readers" in rows:
        report["readers"] = {
            "with_retry": readers(c, seconds, None),
            "without_retry": readers(c, seconds / 2, 1),
        }
        print("readers:", json.dumps(report["readers"]), flush=True)
    report["seconds"] = round(time.perf_counter() - t0, 1)

    failures = []
    for name in ("syscall_kills", "full_disk", "bit_flips", "two_writers"):
        failures += [f"{name}: {f}" for f in report.get(name, {}).get("failures", [])]
    if "readers" in report and report["readers"]["with_retry"].get("false_failures", 1) != 0:
        failures.append(f"readers: {report['readers']['with_retry']}")
    print(json.dumps(summary_counts(report), indent=1))
    for failure in failures[:40]:
        print("FAILED", failure)
    if not args.keep and not failures:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


def summary_counts(report: dict) -> dict:
    """The campaign's counts, one entry per row."""
    out = {"model": report["model"], "quick": report["quick"], "seconds": report.get("seconds")}
    kills = report.get("syscall_kills", {})
    if "classes" in kills:
        out["syscall_kills"] = {
            name: f"{row['kills']} kills of {row['census']} calls, {row['bit_exact']} bit-exact "
            f"({row['resumed']} resumed, {row['restarted']} restarted: nothing committed yet)"
            for name, row in kills["classes"].items()
        }
    elif kills:
        out["syscall_kills"] = kills
    disk = report.get("full_disk", {})
    if "cases" in disk:
        out["full_disk"] = {
            f"{case['size_kb']} KB": ("exit 0" if case["rc"] == 0 else "one line")
            + f", committed step {case['committed_step']}, exact {case['exact']}"
            for case in disk["cases"]
        }
    elif disk:
        out["full_disk"] = disk
    flips = report.get("bit_flips", {})
    if "files" in flips:
        total = {k: sum(row[k] for row in flips["files"].values()) for k in next(iter(flips["files"].values()))}
        runs = sum(total[k] for k in ("same", "refused", "stated", "changed_unchecked", "failed"))
        out["bit_flips"] = {
            "files": len(flips["files"]),
            "flipped_bits": total.pop("flips"),
            "verb_runs": runs,
            **total,
        }
    if "two_writers" in report:
        out["two_writers"] = {k: v for k, v in report["two_writers"].items() if k != "failures"}
    if "readers" in report:
        out["readers"] = {
            k: f"{r.get('false_failures')} false failures in {r.get('loads')} loads racing {r.get('commits')} commits"
            f" ({r.get('attempts')} read attempts)"
            for k, r in report["readers"].items()
        }
    out["failures"] = sum(len(report.get(k, {}).get("failures", [])) for k in ("syscall_kills", "full_disk",
                                                                                "bit_flips", "two_writers"))  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
