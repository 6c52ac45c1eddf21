"""docs/index.md says what every document in docs/ is for: each page there, and the README, is linked from it
once, and every link of the index leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"


def test_the_index_links_every_document_once_and_only_documents_that_exist():
    links = re.findall(r"\]\(([^)#]+)\)", INDEX.read_text())
    targets = [(INDEX.parent / link).resolve() for link in links]
    assert all(t.is_file() for t in targets), [link for link, t in zip(links, targets) if not t.is_file()]
    pages = sorted(p.resolve() for p in (ROOT / "docs").glob("*.md") if p != INDEX) + [(ROOT / "README.md").resolve()]
    assert sorted(set(targets) & set(pages)) == sorted(pages), sorted(set(pages) - set(targets))
    assert len(targets) == len(set(targets))
    assert "docs/index.md" in (ROOT / "README.md").read_text()
