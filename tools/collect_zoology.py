"""Collect a Zoology MQAR study (``drmlab mqar --protocol zoology``) into docs/studies/NAME/results.json,
finished or not.

First the study's own report of what has finished: the study's command with ``--collect`` (it trains
nothing and may run beside the processes training it) writes ``STUDY/results.json``. This tool copies that
record with the provenance the committed files carry (docs/studies/README.md): the command as it was run
(with any check run beside it), the commit and date of the code that collected it, the machine and its
load, how the runs were made (processes, restarts) and where the numbers come from. A study with a cell
not yet done is committed as it stands (``"complete": false``); on the next machine the study's command
with ``--restore docs/studies/NAME/results.json`` goes on from it (docs/mqar.md section 10.9).

    drmlab mqar --protocol zoology ... --out studies/zoology-l64 --collect
    python tools/collect_zoology.py --study studies/zoology-l64 --name zoology-l64 \\
        --command "drmlab mqar --protocol zoology ..." --machine "..." --how "..."
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]


def record(study: Path, name: str, command: str, machine: str, how: str) -> dict:
    """The committed record of the study folder ``study``: its ``results.json`` with the provenance
    written out. ValueError naming the file where there is none (run the study's command with
    ``--collect`` first) or it is not a Zoology record."""
    path = study / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{path}: no readable study record ({exc.__class__.__name__}); run the study's command with --collect first"
        ) from None
    if not isinstance(results, dict) or results.get("protocol") != "zoology":
        raise ValueError(f"{path}: not a Zoology study's record (drmlab mqar --protocol zoology --collect)")
    cells = results["cells"].values()
    made = results.get("provenance") or {}
    results["provenance"] = {
        "command": command,
        "command_recorded": True,
        "commit": made.get("commit"),
        "date": made.get("date"),
        "settings": made.get("settings", results.get("study")),
        "machine": machine,
        "how": how,
        "source": f"the runs' result.json files in studies/{name} (not committed; their finished records are "
        "this file's 'finished' list, restorable with --restore; a run training on past its probe is there as "
        "its probe), collected with tools/collect_zoology.py",
        "complete": all(c["status"] in ("done", "n/a") for c in cells),
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="the study folder (drmlab mqar --protocol zoology --out)")
    parser.add_argument("--name", required=True, help="docs/studies/NAME")
    parser.add_argument("--command", required=True, help="the study's command as it was run, and any check beside it")
    parser.add_argument("--machine", required=True, help="the machine and its load while the runs trained")
    parser.add_argument("--how", required=True, help="how the runs were made (processes, threads, restarts)")
    args = parser.parse_args(argv)
    try:
        result = record(Path(args.study), args.name, args.command, args.machine, args.how)
    except ValueError as exc:
        print(f"collect_zoology: {exc}", file=sys.stderr)
        return 2
    path = ROOT / "docs" / "studies" / args.name / "results.json"
    write(path, result)
    done = sum(c["status"] == "done" for c in result["cells"].values())
    print(
        f"wrote {path.relative_to(ROOT)}: {len(result['finished'])} finished runs, {done} of "
        f"{len(result['cells'])} cells done, complete: {result['provenance']['complete']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
