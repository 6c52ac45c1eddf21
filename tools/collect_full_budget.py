"""Collect a protocol's rates checked at the full budget into docs/studies/NAME/results.json: several
``drmlab ablate --sweep-only`` folders (one per group of models, each with its own grid around the rate the
protocol's short sweep chose), each a part of the record, finished or not.

Each part is ``drmlab.experiments.ablate.protocol.collect_results`` of its folder without its provenance; the
record carries one provenance for all (docs/studies/README.md): the commands as they were run, the commit of the
code that trained (``--commit``: the studies run from a fixed worktree, so the collecting checkout's commit is not
theirs), the machine and its load, and how the runs were made.

    python tools/collect_full_budget.py --name protocol-tiny-field-fullbudget --protocol protocol-tiny-field \\
        --part transformers=studies/protocol-tiny-field-fullbudget --part resolvent=studies/fullbudget-resolvent \\
        --commit 8b57326 --command "drmlab ablate ..." --machine "..." --how "..." [--rates-out F]

``--rates-out F`` also writes the complete checks' choices where ``drmlab ablate --lr-from F`` reads them.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from drmlab.experiments.ablate.protocol import collect_results
from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]


def part(folder: Path) -> dict:
    """One sweep folder's results, without the provenance (the record holds one for all its parts)."""
    results = collect_results(folder)
    results.pop("provenance", None)
    return results


def record(args) -> dict:
    parts = {}
    for item in args.part:
        name, _, folder = item.partition("=")
        if not name or not folder:
            raise SystemExit(f"collect_full_budget: --part wants NAME=FOLDER, got {item!r}")
        parts[name] = part(Path(folder))
    first = next(iter(parts.values()))["study"]
    protocol = json.loads((ROOT / "docs" / "studies" / args.protocol / "results.json").read_text())
    return {
        "title": f"{args.protocol}'s rates checked at the full budget: each model swept again around its chosen rate "
        f"for {first['train']['tokens']:,} tokens (seed {first['tune_seed']}, the same held-out slice), "
        f"recipe {first['train'].get('recipe', 'reference')}",
        "provenance": {
            "command": args.command,
            "command_recorded": True,
            "commit": args.commit,
            "date": datetime.date.today().isoformat(),
            "how": args.how,
            "machine": args.machine,
            "source": "studies/PART (config, metrics and summary of every run; checkpoints not kept; not committed), "
            "collected with tools/collect_full_budget.py",
        },
        "units": "sweep scores: CE in nats per byte on the held-out slice of the training split",
        "protocol": {
            "name": args.protocol,
            "preset": first["preset"],
            "tokens": first["train"]["tokens"],
            "tune_seed": first["tune_seed"],
            "short_tune_tokens": protocol["study"].get("tune_tokens"),
        },
        "parts": parts,
    }


def chosen_rates(result: dict) -> dict:
    """The full-budget choices as ``drmlab ablate --lr-from`` reads them (``models[M]["lr"]`` and the study's
    recipe): one entry per model whose check is complete; a model still training is left out, so that a study
    taking its rate from here refuses it by name."""
    first = next(iter(result["parts"].values()))["study"]
    models = {
        model: {"lr": sweep["lr"], "edge": sweep["edge"]}
        for part in result["parts"].values()
        for model, sweep in (part.get("lr_sweep") or {}).items()
        if sweep.get("complete") and sweep.get("lr") is not None
    }
    return {
        "title": f"the rates {result['protocol']['name']}'s full-budget check chose (for drmlab ablate --lr-from)",
        "provenance": result["provenance"],
        "study": {"preset": first["preset"], "train": {"recipe": first["train"].get("recipe", "reference")}},
        "models": models,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="docs/studies/NAME")
    parser.add_argument("--protocol", required=True, help="the protocol study whose rates are checked (docs/studies)")
    parser.add_argument("--part", action="append", required=True, metavar="NAME=FOLDER", help="a sweep folder")
    parser.add_argument("--commit", required=True, help="the commit of the code that trained the runs")
    parser.add_argument("--command", required=True, help="the drmlab ablate commands as they were run")
    parser.add_argument("--machine", required=True, help="the machine and its load while the runs trained")
    parser.add_argument("--how", required=True, help="how the runs were made (processes, threads, order)")
    parser.add_argument(
        "--rates-out", type=Path, help="also write the complete checks' choices here, for drmlab ablate --lr-from"
    )
    args = parser.parse_args()
    result = record(args)
    path = ROOT / "docs" / "studies" / args.name / "results.json"
    write(path, result)
    if args.rates_out is not None:
        rates = chosen_rates(result)
        write(args.rates_out, rates)
        print(f"wrote {args.rates_out}: " + ", ".join(f"{m} {r['lr']:g}" for m, r in rates["models"].items()))
    done = {
        name: sum(len(s["scores"]) for s in (p.get("lr_sweep") or {}).values()) for name, p in result["parts"].items()
    }
    print(f"wrote {path.relative_to(ROOT)}: rates scored per part {done}")


if __name__ == "__main__":
    main()
