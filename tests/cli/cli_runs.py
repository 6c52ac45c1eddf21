"""What the command-line tests of a finished run share: its training command, the corpus, the one-line check."""

from __future__ import annotations

from pathlib import Path

CORPUS = "\n\n".join(f"paragraph {i}: the quick brown fox {i * 7 % 13} jumps\n" * 4 for i in range(600))


def train_argv(out: Path, corpus: Path, *flags: str, tokens: str = "2k") -> list[str]:
    """``drmlab train`` of SSM_CONTROL at preset micro on ``corpus`` into ``out`` (its cache beside the corpus)."""
    return [
        "train", "--model", "SSM_CONTROL", "--preset", "micro", "--tokens", tokens, "--out", str(out),
        "--data", str(corpus), "--cache-dir", str(corpus.parent / "cache"), "--threads", "1", "--quiet", *flags,
    ]  # fmt: skip


def one_line(err: str) -> str:
    """The one line of ``err`` (stderr of a refused verb; the busy-machine hint aside), asserting there is one
    and no traceback."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("drmlab: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
