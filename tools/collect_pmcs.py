"""Collect the PMCS-64 specialisations (docs/variable-rank.md section 11) into
docs/studies/pmcs-tiny.

Reads every specialisation folder STUDY/spec/MODEL-seedS (``drmlab specialise --recipe interleaved``,
then the distance reads into SPEC/reads and, where present, the controls into SPEC/controls) and
writes its entry under the arm of that model at full rank: language CE before and after the recipe,
the recipe's own last read of the 40-token control, and per length the accuracy, its Wilson interval,
the first-query accuracy and the decoding state's bytes (controls: the same, their verdict and, for
``keys_shuffled``, the share naming the value the key now precedes). Where the base run was trained
again (``STUDY/main/runs/MODEL-seedS``) and its CE differs from the language leg's committed one, the
entry says by how much. Entries already committed whose folders are not here are kept.

    python tools/collect_pmcs.py --study studies/pmcs-tiny [--how TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import distance_record  # tools/distance_record.py, beside this file
from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "pmcs-tiny" / "results.json"
READ_KEYS = ("acc", "ci95", "first_acc", "state_bytes")
CONTROL_KEYS = ("acc", "ci95", "first_acc", "bound_acc")


def spec_entry(spec: Path, language_ce: float | None) -> dict:
    result = json.loads((spec / "specialise.json").read_text())
    last = result["stages"][-1]["lengths"]
    entry = {
        "ce_before": result["before"]["ce"],
        "ce_after": result["after"]["ce"],
        "stage_control_40": last["40"]["acc"],
        "reads": distance_record.reads(distance_record.entry(spec / "reads"), READ_KEYS),
    }
    if (spec / "controls" / "results.json").is_file():
        entry["controls"] = distance_record.controls(distance_record.entry(spec / "controls"), CONTROL_KEYS)
    if language_ce is not None and entry["ce_before"] != language_ce:
        entry["base_retrained"] = {
            "ce": entry["ce_before"],
            "language_leg_ce": language_ce,
            "difference": entry["ce_before"] - language_ce,
        }
    return entry


def collect(study: Path, record: dict) -> list[str]:
    arms = {a["model"]: a for a in record["arms"] if not a.get("overrides")}
    added = []
    for spec in sorted((study / "spec").glob("*-seed*")):
        model, seed = spec.name.rsplit("-seed", 1)
        if model not in arms or not (spec / "reads" / "results.json").is_file():
            continue
        if "after" not in json.loads((spec / "specialise.json").read_text()):
            continue  # not finished
        arm = arms[model]
        language_ce = arm["language"]["per_seed"].get(seed)
        arm.setdefault("specialised", {})[seed] = spec_entry(spec, language_ce)
        arm["specialised"] = {s: arm["specialised"][s] for s in sorted(arm["specialised"], key=int)}
        added.append(f"{arm['arm']} seed {seed}")
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("studies/pmcs-tiny"))
    parser.add_argument("--how", help="replace the provenance's 'how' line")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text())
    added = collect(args.study, record)
    if args.how:
        record["provenance"]["how"] = args.how
    record["provenance"]["date"] = datetime.date.today().isoformat()
    write(RECORD, record)
    print(f"{RECORD.relative_to(ROOT)}: {', '.join(added) or 'nothing new'}")


if __name__ == "__main__":
    main()
