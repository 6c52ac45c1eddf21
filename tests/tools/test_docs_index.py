"""docs/index.md says what every document in docs/ is for: each page there, and the README, is linked from it
once, and every link of the index leads to a file that exists. And what the code and the docs cite, a reader
of the repository can open: no project issue by number."""

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


# "issue N" (N a number) names a project issue that a reader of the repository cannot open: say what it stands
# for instead -- the doc section, the test, the study record (docs/studies/NAME) or the fact in a few words.
# Scanned: src/, tests/, tools/, benchmarks/ and docs/*.md; docs/studies/ holds the committed records as they
# were written and is left out.
ISSUE_NUMBER = re.compile(r"\bissues?[\s#-]*\d", re.IGNORECASE)
SCANNED_SUFFIXES = (".py", ".md", ".c", ".h", ".txt")


def _scanned_files() -> list[Path]:
    files = [
        p
        for top in ("src", "tests", "tools", "benchmarks")
        for p in (ROOT / top).rglob("*")
        if p.is_file()
        and p.suffix in SCANNED_SUFFIXES
        and not any(part == "__pycache__" or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
    ]
    return sorted(files + list((ROOT / "docs").glob("*.md")))


def issue_numbers(text: str) -> list[int]:
    """The lines of ``text`` (1-based) that cite an issue by number: "issue", "Issue" or "issues", then a number
    (after spaces, "#" or "-")."""
    return [n for n, line in enumerate(text.splitlines(), 1) if ISSUE_NUMBER.search(line)]


def test_no_file_cites_a_project_issue_by_number():
    found = []
    for path in _scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        all_lines = text.splitlines()
        found += [f"{path.relative_to(ROOT).as_posix()}:{n}: {all_lines[n - 1].strip()}" for n in issue_numbers(text)]
    why = "cites a project issue by number; say what it stands for (doc section, test, study record, the fact)"
    assert not found, why + ":\n" + "\n".join(found)


def test_the_issue_rule_sees_every_form_and_spares_other_words():
    issue = "issue"  # spelled apart, so this file cites none
    text = "\n".join(
        [
            f"the fast setting ({issue} 33 item 2)",
            f"{issue.title()} 23 item 7: readers",
            f"since {issue} 33's decision",
            f"{issue}s 3 and 4",
            f"{issue} #12",
            "a tissue 5 cm wide, an issue with the rate, issued 3 times",
        ]
    )
    assert issue_numbers(text) == [1, 2, 3, 4, 5]
