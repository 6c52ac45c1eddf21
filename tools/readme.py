"""Repository tooling: the generated tables of the README and the results pages, and the figure, rendered
from the committed results.

Run from anywhere: ``python tools/readme.py --check`` (the default; exit 1 naming every stale table or
figure and every committed record without its provenance) or ``python tools/readme.py --write``
(rewrite them). Not part of the installed package; it imports drmlab as a library.

Every study or benchmark figure in the README's headline table, on ``docs/results.md`` (each study a
table and two sentences) and on ``docs/results-in-full.md`` (each study in full) comes from
``docs/studies/NAME/results.json`` (docs/studies/README.md describes the files). This module computes
what the tables print from those values -- means and population standard deviations from per-seed
values, bits per byte from nats (divided by ln 2), ratios of two measurements -- and renders:

* the tables, each between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``
  (:func:`render_blocks` over ``readme_tables.BLOCK_RENDERERS``, one renderer per table, in
  the package ``tools/readme_tables/``; :func:`replace_blocks` writes them into a page's text); :data:`PAGES` says
  which page holds which tables;
* the figures (``readme_figures.FIGURES``, in ``tools/readme_figures.py``): ``docs/figures/compare-tiny.png``,
  MQAR accuracy against bits per byte (:func:`drmlab.experiments.probes.compare.plot`), and
  ``docs/figures/protocol-scales.png``, bits per byte against parameters at each preset of the protocol
  (:func:`drmlab.experiments.ablate.scales.plot_bits_per_byte_by_size`), and the Zoology study's frontier
  and learning curves at length 64 (``docs/figures/zoology-l64-frontier.png``,
  ``docs/figures/zoology-l64-curves.png``; :mod:`drmlab.experiments.mqar.zoology_report`), each with the SHA-256 of the
  values it was drawn from and of its drawing functions' source (``readme_figures.drawing_source``) in its
  PNG metadata (``drmlab-source``), so a check needs no particular matplotlib version; a change to a helper
  the drawing functions call is not seen (delete the PNG, then ``--write``).

The claims the pages' prose makes about these results are tests over the same files
(``tests/studies/``), which also find each number they check in the study's sections of the pages.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts, beside it, wherever it is loaded from

import readme_figures as figures  # noqa: E402, F401 (its parts, as the tests reach them)
import readme_tables as tables  # noqa: E402, F401
from readme_figures import FIGURES, figure_is_current, render_figure  # noqa: E402
from readme_tables import BLOCK_RENDERERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDIES_DIR = Path("docs") / "studies"
README_PATH = Path("README.md")
RESULTS_PATH = Path("docs") / "results.md"
DETAILS_PATH = Path("docs") / "results-in-full.md"
REQUIRED_PROVENANCE = ("command", "commit", "date")
BLOCK = re.compile(r"<!-- generated: (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- end generated -->", re.DOTALL)


# ------------------------------------------------------------------------------- loading


def load_studies(root: str | Path = ROOT) -> dict[str, dict]:
    """Every ``docs/studies/NAME/results.json`` under the repository ``root``, by NAME."""
    folder = Path(root) / STUDIES_DIR
    files = sorted(folder.glob("*/results.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no study results")
    return {f.parent.name: json.loads(f.read_text()) for f in files}


def missing_fields(study: dict) -> list[str]:
    """The provenance fields (command, commit, date) a committed record lacks or leaves empty."""
    prov = study.get("provenance")
    if not isinstance(prov, dict):
        return ["provenance"]
    return [f"provenance.{k}" for k in REQUIRED_PROVENANCE if prov.get(k) in (None, "", {})]


# Which page holds which tables: the README its one headline table, docs/results.md one table per study (the
# first table of each), docs/results-in-full.md every study table in its place. A page holds exactly these.
PAGES: dict[Path, tuple[str, ...]] = {
    README_PATH: ("headline",),
    RESULTS_PATH: (
        "ablate-tiny-drm",
        "loop-study-tiny",
        "compare-tiny",
        "protocol-tiny",
        "protocol-tiny-field-sweep",
        "recipe-parts-tiny",
        "protocol-small",
        "distance-tiny",
        "zoology-l64",
        "pmcs-tiny",
        "asm-cm-controls",
        "asm-cm-capacity",
        "geometry-tiny",
        "bench-models",
        "bench-reference",
        "bench-decode",
        "bench-procs",
        "long-context-tiny",
    ),
    DETAILS_PATH: tuple(name for name in BLOCK_RENDERERS if name != "headline"),
}


def render_blocks(studies: dict[str, dict]) -> dict[str, str]:
    """Every generated block by name, as the text between its two markers."""
    return {name: "\n" + render(studies) + "\n" for name, render in BLOCK_RENDERERS.items()}


def find_blocks(text: str) -> dict[str, str]:
    """A page's generated blocks by name (the text between the markers)."""
    found: dict[str, str] = {}
    for match in BLOCK.finditer(text):
        if match["name"] in found:
            raise ValueError(f"a page has two generated blocks named {match['name']!r}")
        found[match["name"]] = match["body"]
    return found


def replace_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block's text replaced by ``blocks[name]``."""
    unknown = set(find_blocks(text)) - set(blocks)
    if unknown:
        raise ValueError(f"a page has generated blocks this generator does not know: {', '.join(sorted(unknown))}")
    return BLOCK.sub(lambda m: f"<!-- generated: {m['name']} -->\n{blocks[m['name']]}<!-- end generated -->", text)


# ------------------------------------------------------------------------------- check and write


def _page_problems(page: Path, present: dict[str, str], blocks: dict[str, str]) -> list[str]:
    problems = []
    for name in PAGES[page]:
        if name not in present:
            problems.append(f"{page} block {name}: no '<!-- generated: {name} -->' ... '<!-- end generated -->'")
        elif present[name] != blocks[name]:
            diff = difflib.unified_diff(present[name].splitlines(), blocks[name].splitlines(), lineterm="", n=0)
            changes = [line for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++")]
            problems.append(
                f"{page} block {name}: differs from docs/studies (run `python tools/readme.py --write`):\n  "
                + "\n  ".join(changes)
            )
    problems += [f"{page} block {name}: not a table of this page" for name in present if name not in PAGES[page]]
    return problems


def check(root: str | Path = ROOT) -> list[str]:
    """What in the pages (and the figure) does not match the committed studies, one line each; empty when
    everything matches."""
    root = Path(root)
    studies = load_studies(root)
    problems = [
        f"docs/studies/{name}/results.json: missing {', '.join(fields)}"
        for name, study in studies.items()
        if (fields := missing_fields(study))
    ]
    blocks = render_blocks(studies)
    for page in PAGES:
        problems += _page_problems(page, find_blocks((root / page).read_text()), blocks)
    for name, (path, *_) in FIGURES.items():
        if not figure_is_current(studies, root / path, name):
            problems.append(
                f"figure {path}: not drawn from docs/studies and its drawing code as they are (run `python tools/readme.py --write`)"
            )
    return problems


def write(root: str | Path = ROOT) -> list[str]:
    """Rewrite the pages' generated blocks and the figure from the committed studies; what changed
    (``PAGE: NAME`` per block, the figure's path)."""
    root = Path(root)
    studies = load_studies(root)
    blocks = render_blocks(studies)
    changed = []
    for page, names in PAGES.items():
        text = (root / page).read_text()
        present = find_blocks(text)
        missing = [name for name in names if name not in present]
        extra = [name for name in present if name not in names]
        if missing or extra:
            raise ValueError(
                f"{page} must hold the tables {', '.join(names)}"
                + (f"; it has no markers for {', '.join(missing)}" if missing else "")
                + (f"; it holds {', '.join(extra)}, which belong elsewhere" if extra else "")
                + ": add '<!-- generated: NAME -->' and '<!-- end generated -->' lines where each table goes"
            )
        stale = [name for name in names if present[name] != blocks[name]]
        if stale:
            (root / page).write_text(replace_blocks(text, blocks))
            changed += [f"{page}: {name}" for name in stale]
    for name, (path, *_) in FIGURES.items():
        if not figure_is_current(studies, root / path, name):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(render_figure(studies, name))
            changed.append(str(path))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render (--write) or check (--check, the default) the generated tables of README.md, "
        "docs/results.md and docs/results-in-full.md, and the figure, from docs/studies."
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="compare only; exit 1 if anything differs (default)")
    action.add_argument("--write", action="store_true", help="rewrite the generated blocks and the figure")
    parser.add_argument(
        "--root",
        default=str(ROOT),
        metavar="DIR",
        help="the repository root holding README.md and docs/ (default: this checkout)",
    )
    args = parser.parse_args(argv)
    if args.write:
        for name in write(args.root):
            print(f"rewrote {name}")
    problems = check(args.root)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print("the tables of README.md, docs/results.md and docs/results-in-full.md and the figure match docs/studies")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
