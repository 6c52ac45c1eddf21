"""Where the optional shared data of the tests lies (../shared/data beside the checkout, or inside it, or
$DRMLAB_GPT2_DIR): tests that need it skip cleanly without it. Importable from every test folder, since
pytest puts this folder (the one of the root conftest.py) on sys.path."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_data_dirs() -> list[Path]:
    return [REPO / "shared" / "data", REPO.parent / "shared" / "data"]


def find_gpt2_dir() -> Path | None:
    """$DRMLAB_GPT2_DIR or shared/data/gpt2 if it holds encoder.json and vocab.bpe, else None."""
    cands = [Path(os.environ["DRMLAB_GPT2_DIR"])] if os.environ.get("DRMLAB_GPT2_DIR") else []
    cands += [d / "gpt2" for d in shared_data_dirs()]
    return next((c for c in cands if (c / "encoder.json").is_file() and (c / "vocab.bpe").is_file()), None)


def find_tinyshakespeare() -> Path | None:
    return next((d / "tinyshakespeare.txt" for d in shared_data_dirs() if (d / "tinyshakespeare.txt").is_file()), None)
