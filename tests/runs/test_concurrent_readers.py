"""Readers racing a writer's commits (what it guards against: 3 false "checkpoint missing" in 977 loads).

A writer process commits checkpoints in a loop (``RunDir.save_checkpoint``: temporary folder, one rename,
the pointer replaced, the superseded folder removed) while reader threads of this process load them through
every reader: ``load_checkpoint`` (what ``load_model`` calls), ``read_checkpoint``, ``read_pointer``,
``read_state`` and ``resolve_checkpoint``. Every read must succeed with a committed step and no recovery note;
the longer count is ``benchmarks/kill_campaign.py``'s ``readers`` row.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import torch
import torch.nn as nn

from drmlab.runs import RunDir

WRITER = textwrap.dedent("""
    import sys, time, torch, torch.nn as nn
    torch.set_num_threads(1)
    from drmlab.runs import RunDir
    run, seconds = RunDir(sys.argv[1]), float(sys.argv[2])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()  # the optimizer holds state, so its file is read too
    step, end = 0, None
    while end is None or time.monotonic() < end:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3)
        run.save_checkpoint(model, optimizer, {"step": step})
        end = end or time.monotonic() + seconds  # the clock starts at the first commit
        time.sleep(0.005)
    print(step)
""")


def _model():
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))


def _read(run: RunDir, verb: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """One read through ``verb`` (into ``model`` and its ``optimizer``); returns the step it read."""
    if verb == "load_checkpoint":
        return run.load_checkpoint(model)["step"]
    if verb == "load_checkpoint+optimizer":
        return run.load_checkpoint(model, optimizer, restore_rng=False)["step"]
    if verb == "read_checkpoint":
        return run.read_checkpoint(model, restore_rng=False)[0]["step"]
    if verb == "read_pointer":
        return run.read_pointer()["step"]
    if verb == "read_state":
        return run.read_state()["step"]
    _, pointer, note = run.resolve_checkpoint()
    assert note is None, f"a false recovery while racing a commit: {note}"
    return pointer["step"]


VERBS = ("load_checkpoint", "load_checkpoint+optimizer", "read_checkpoint", "read_pointer", "read_state", "resolve")


def test_readers_racing_commits_never_see_a_missing_or_damaged_checkpoint(tmp_path):
    run = RunDir(tmp_path / "run")
    models = [_model() for _ in range(3)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]  # built first: torch.optim imports lazily
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run.path), "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not run.pointer_path.is_file():
        assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
        time.sleep(0.01)
    failures, steps, loads = [], set(), [0]

    def reader(first: int) -> None:
        model, optimizer, k = models[first], optimizers[first], first
        while writer.poll() is None:
            verb = VERBS[k % len(VERBS)]
            k += 1
            try:
                steps.add(_read(run, verb, model, optimizer))
                loads[0] += 1
            except Exception as exc:  # a false failure: every step read was committed and intact
                failures.append(f"{verb}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    out, err = writer.communicate(timeout=120)
    for thread in threads:
        thread.join()
    assert writer.returncode == 0, err
    assert failures == []
    written = int(out.split()[-1])
    assert loads[0] >= 60 and len(steps) >= 10 and max(steps) <= written  # the reads raced many commits
    assert run.read_state()["step"] == written


def test_a_model_of_other_shapes_is_refused_as_not_fitting(tmp_path):
    """The loader tells a model that does not fit (a one-line ValueError) from a file it cannot read."""
    run = RunDir(tmp_path)
    run.save_checkpoint(_model(), None, {"step": 1})
    other = nn.Sequential(nn.Embedding(64, 8), nn.Linear(8, 64))
    try:
        run.load_checkpoint(other)
    except ValueError as exc:
        assert "model.safetensors does not fit this model" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a model of other shapes was loaded")
