"""tools/study_queue.py: the commands of a queue run in order, a failure does not stop the ones after it, and a
signal reaches the running command and starts nothing more."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_collectors import _tool

sq = _tool("study_queue")
TOOL = Path(__file__).resolve().parents[2] / "tools" / "study_queue.py"
PY = shlex.quote(sys.executable)


def _writes(path: Path, text: str, code: int = 0) -> str:
    """A command that appends ``text`` to ``path`` and exits with ``code``."""
    script = f"open({str(path)!r}, 'a').write({text!r}); raise SystemExit({code})"
    return f"{PY} -c {shlex.quote(script)}"


def test_the_queue_runs_in_order_skips_comments_and_goes_on_past_a_failure(tmp_path, capsys):
    trace = tmp_path / "trace"
    queue = tmp_path / "queue.txt"
    queue.write_text(
        "# the studies of this session\n\n"
        + "\n".join([_writes(trace, "a"), _writes(trace, "b", code=3), "  " + _writes(trace, "c")])
        + "\n"
    )
    assert len(sq.read_queue(queue)) == 3
    assert sq.main([str(queue)]) == 1
    assert trace.read_text() == "abc"  # the failure did not stop the third
    out, err = capsys.readouterr()
    assert "[2/3] failed with exit 3" in out and err.startswith("failed: ") and "(exit 3)" in err
    log = (tmp_path / "queue.txt.log").read_text()
    assert log.count("\n== ") == 3  # a header per command
    # all well: 0, and the dry run runs nothing
    queue.write_text(_writes(trace, "d") + "\n")
    assert sq.main([str(queue), "--log", str(tmp_path / "other.log")]) == 0
    assert sq.main([str(queue), "--dry-run"]) == 0
    assert trace.read_text() == "abcd"


def test_a_bad_queue_is_one_line(tmp_path, capsys):
    assert sq.main([str(tmp_path / "missing.txt")]) == 2
    assert capsys.readouterr().err.startswith(f"study_queue: error: {tmp_path / 'missing.txt'}: cannot read")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    assert sq.main([str(empty)]) == 2
    assert "no commands" in capsys.readouterr().err
    broken = tmp_path / "broken.txt"
    broken.write_text("drmlab ablate --out 'unclosed\n")
    assert sq.main([str(broken)]) == 2
    err = capsys.readouterr().err
    assert "broken.txt line 1:" in err and err.count("\n") == 1


def test_sigterm_reaches_the_running_command_and_starts_nothing_more(tmp_path):
    trace = tmp_path / "trace"
    handler = (
        "import signal, sys, time\n"
        f"def stop(s, f):\n    open({str(trace)!r}, 'a').write('checkpointed'); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(trace)!r}, 'a').write('started;')\n"
        "time.sleep(60)\n"
    )
    study = tmp_path / "study.py"  # a stand-in study: checkpoints and stops on SIGTERM
    study.write_text(handler)
    queue = tmp_path / "queue.txt"
    queue.write_text(f"{PY} {shlex.quote(str(study))}\n" + _writes(trace, ";never") + "\n")
    worker = subprocess.Popen([sys.executable, str(TOOL), str(queue)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (trace.exists() and trace.read_text() == "started;"):
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM
    assert trace.read_text() == "started;checkpointed"  # the second command never started
    assert "stopped by signal" in out


def test_a_line_added_while_the_worker_runs_is_taken_up_and_a_broken_edit_keeps_the_old_list(tmp_path, capsys):
    trace, queue = tmp_path / "trace", tmp_path / "queue.txt"
    # the first command adds a third line to the queue (as a person would, mid-run) and repeats the second
    added = _writes(trace, "c")
    adds = f"open({str(queue)!r}, 'a').write({(added + chr(10))!r}); open({str(trace)!r}, 'a').write('a')"
    first = f"{PY} -c {shlex.quote(adds)}"
    queue.write_text(f"{first}\n{_writes(trace, 'b')}\n")
    assert sq.main([str(queue)]) == 0
    assert trace.read_text() == "abc"
    assert "all 3 commands finished" in capsys.readouterr().out
    # an edit that breaks the file: the worker goes on with the list it read before, and says so
    trace.write_text("")
    breaks = f"open({str(queue)!r}, 'a').write(\"bad 'quote\\n\"); open({str(trace)!r}, 'a').write('x')"
    queue.write_text(f"{PY} -c {shlex.quote(breaks)}\n{_writes(trace, 'y')}\n")
    assert sq.main([str(queue)]) == 0
    assert trace.read_text() == "xy"
    assert "going on with the queue as it read before" in capsys.readouterr().out
