"""Collect an ablation study (``drmlab ablate``) into docs/studies/NAME/results.json, finished or not.

The record is ``drmlab.experiments.ablate.protocol.collect_results`` of the study folder with the
provenance the committed files carry (docs/studies/README.md): the study's command as it was run, the
commit of the code, the machine and its load, how the runs were made and where the numbers come from. A
study that is not complete is committed as it stands (``"complete": false``); on the next machine
``drmlab ablate SAME-OPTIONS --restore docs/studies/NAME/results.json`` goes on from it
(docs/drm.md A.7.2).

    python tools/collect_ablate.py --study studies/protocol-small --name protocol-small \\
        --command "drmlab ablate ..." --machine "..." --how "..."
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.experiments.ablate.protocol import collect_results
from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]
TITLE = "Paired ablation at preset {preset}: validation CE of each model at its own swept rate, {seeds} paired seeds"


def record(study: Path, name: str, command: str, machine: str, how: str) -> dict:
    results = collect_results(study)
    settings = results["study"]
    results["provenance"] = {
        "command": command,
        "command_recorded": True,
        "commit": results["provenance"]["commit"],
        "date": results["provenance"]["date"],
        "how": how,
        "machine": machine,
        "source": f"studies/{name} (config, metrics and summary of every run; checkpoints not kept; not "
        "committed), collected with tools/collect_ablate.py",
        "settings": settings,
    }
    title = TITLE.format(preset=settings["preset"], seeds=len(settings["seeds"]))
    return {"title": title, **results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="the study folder (drmlab ablate --out)")
    parser.add_argument("--name", required=True, help="docs/studies/NAME")
    parser.add_argument("--command", required=True, help="the drmlab ablate command as it was run")
    parser.add_argument("--machine", required=True, help="the machine and its load while the runs trained")
    parser.add_argument("--how", required=True, help="how the runs were made (processes, threads, restores)")
    args = parser.parse_args()
    result = record(Path(args.study), args.name, args.command, args.machine, args.how)
    path = ROOT / "docs" / "studies" / args.name / "results.json"
    write(path, result)
    done = sum(1 for _ in result["runs"])
    print(f"wrote {path.relative_to(ROOT)}: {done} finished runs, complete: {result['complete']}")


if __name__ == "__main__":
    main()
