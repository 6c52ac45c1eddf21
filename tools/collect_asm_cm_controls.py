"""Collect ASM_CM's recall under controls over three seeds (docs/mqar.md section 8.1)
into docs/studies/asm-cm-controls.

The study folder holds, per seed S: a J_NO_DIRECTION base run (base/J_NO_DIRECTION-seedS), its
``drmlab specialise`` runs at the recipe's rates and at ten times them (spec/recipe-seedS,
spec/x10-seedS), each read plainly at every length (SPEC/reads) and under the controls at the shorter
ones (SPEC/controls); and ASM_CM trained on the 40-token control alone by the distance protocol
(control-alone/seedS, its controls in control-alone/seedS/controls). Per run the record keeps the
language CE, each length's accuracy with its Wilson interval and the first-query accuracy with its
own, the state's bytes, and per control its verdict and the same figures (``bound_acc`` for
``keys_shuffled``).

    python tools/collect_asm_cm_controls.py --study studies/asm-cm-controls
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import distance_record  # tools/distance_record.py, beside this file
from drmlab.experiments.mqar.controls import binding_levels
from drmlab.experiments.results import provenance, write

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "asm-cm-controls" / "results.json"
READ_KEYS = ("acc", "ci95", "first_acc", "first_ci95", "state_bytes")
CONTROL_KEYS = ("acc", "ci95", "first_acc", "first_ci95", "bound_acc")
ARMS = {
    "recipe": "drmlab specialise at the recipe's rates (backbone 1e-5, memory 1e-4)",
    "x10": "drmlab specialise at ten times them (backbone 1e-4, memory 1e-3)",
    "alone": "ASM_CM trained on the 40-token control alone (the distance protocol: 2,000 steps at 1e-3)",
}
COMMANDS = {
    "base": "drmlab train --model J_NO_DIRECTION --preset tiny --tokens 2M --seed S --threads 1 --out BASE",
    "recipe": "drmlab specialise --base BASE --out SPEC --threads 1",
    "x10": "drmlab specialise --base BASE --out SPEC --backbone-lr 1e-4 --memory-lr 1e-3 --threads 1",
    "alone": "drmlab mqar --protocol distance --models ASM_CM --seeds S --lengths 40,512,4096,32768 --n-eval 128 "
    "--eval-batch 8 --chunk 32768 --read-all --out ALONE --threads 1",
    "reads": "drmlab mqar --protocol distance --ckpt SPEC --lengths 40,512,4096,32768 --n-eval 128 --eval-batch 8 "
    "--chunk 32768 --read-all --out SPEC/reads --threads 1",
    "controls": "drmlab mqar --protocol distance --ckpt RUN --lengths 40,512,4096 --n-eval 128 --eval-batch 8 "
    "--chunk 32768 --read-all --controls memory_read_off,memory_write_off,pairs_unwritten,keys_shuffled "
    "--out RUN/controls --threads 1",
}


def spec_run(spec: Path) -> dict | None:
    return distance_record.specialised(spec, READ_KEYS, CONTROL_KEYS)


def alone_run(folder: Path) -> dict | None:
    if not (folder / "controls" / "results.json").is_file():
        return None
    trained = distance_record.entry(folder)
    return {
        "steps": trained["step"],
        "milestones": trained["milestones"],
        "reads": distance_record.reads(trained, READ_KEYS),
        "controls": distance_record.controls(distance_record.entry(folder / "controls"), CONTROL_KEYS),
    }


def collect(study: Path) -> dict:
    arms = {name: {"arm": name, "what": what, "runs": {}} for name, what in ARMS.items()}
    for arm in ("recipe", "x10"):
        for spec in sorted((study / "spec").glob(f"{arm}-seed*")):
            run = spec_run(spec)
            if run is not None:
                arms[arm]["runs"][spec.name.rsplit("-seed", 1)[1]] = run
    for folder in sorted((study / "control-alone").glob("seed*")):
        run = alone_run(folder)
        if run is not None:
            arms["alone"]["runs"][folder.name[len("seed") :]] = run
    base = {}
    for run in sorted((study / "base").glob("J_NO_DIRECTION-seed*")):
        summary = json.loads((run / "summary.json").read_text())
        base[str(summary["seed"])] = {
            "val_ce": summary["val_ce"],
            "steps": summary["steps"],
            "params": summary["params"],
        }
    return {"base": base, "arms": list(arms.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("studies/asm-cm-controls"))
    parser.add_argument("--how", default="", help="the provenance's 'how' line")
    parser.add_argument("--machine", default="not stated")
    args = parser.parse_args()
    found = collect(args.study)
    seeds = sorted({int(s) for arm in found["arms"] for s in arm["runs"]})
    record = {
        "title": "ASM_CM's recall over distance under the recall controls, per seed: the specialisation recipe "
        "at its rates and at ten times them, and ASM_CM trained on the control alone",
        "provenance": provenance(COMMANDS, command="the commands in settings, per seed S")
        | {
            "machine": args.machine,
            "how": args.how,
            "source": "the runs' summary.json, specialise.json and results.json of the reads (not committed)",
        },
        "units": {
            "acc": "share of the 8 query positions per sequence answered by the argmax over the 256 logits, "
            "128 sequences (1,024 targets) per length",
            "ci95": "Wilson 95% interval",
            "first_acc": "the first query of each sequence only (128 targets)",
            "bound_acc": "keys_shuffled: share of answers naming the value the queried key now precedes",
            "ce": "nats per byte over the whole validation stream",
        },
        "no_binding_levels": binding_levels(),
        "seeds": seeds,
        **found,
    }
    write(RECORD, record)
    counts = ", ".join(f"{arm['arm']} {len(arm['runs'])}" for arm in found["arms"])
    print(f"{RECORD.relative_to(ROOT)}: runs per arm: {counts}")


if __name__ == "__main__":
    main()
