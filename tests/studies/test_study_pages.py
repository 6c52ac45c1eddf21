"""The short forms of the studies (docs/results.md, the README's results) say nothing the full text does not:
every number in a study's summary sentences is also in that study's section of docs/results-in-full.md,
where the tests of tests/studies/ check it against the committed results. The tables are rendered from
the results (tools/readme.py), so only the prose around them is read here."""

from __future__ import annotations

import re

import pytest
from study_results import MARKER, PAGES, study_text

NUMBER = re.compile(r"(?<![\w.])-?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e-?\d+)?")
SHORT_PAGES = [page for page in PAGES if page.name != "results-in-full.md"]
FULL = next(page for page in PAGES if page.name == "results-in-full.md")


def _prose(text: str) -> str:
    text = re.sub(r"<!-- generated: .*?<!-- end generated -->", "", text, flags=re.DOTALL)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "!")))


def _sections(page):
    text = page.read_text()
    marks = list(MARKER.finditer(text))
    for mark, after in zip(marks, marks[1:] + [None]):
        if mark[1]:
            yield mark[1].split(), text[mark.end() : after.start() if after else len(text)]


@pytest.mark.parametrize("page", SHORT_PAGES, ids=lambda p: p.name)
def test_every_number_of_a_summary_is_in_the_full_text(page):
    missing = []
    for names, section in _sections(page):
        if page.name == "README.md" and "first-train-run" in names:
            continue  # the set-up's own figures, tested by test_study_benchmarks
        full = study_text(*names, pages=(FULL,))
        for number in sorted(set(NUMBER.findall(_prose(section)))):
            if not re.search(r"(?<![\d.])" + re.escape(number) + r"(?!\d)", full):
                missing.append(f"{names[0]}: {number}")
    assert missing == []
