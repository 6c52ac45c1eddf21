"""Collect the field recipe's parts at tiny into docs/studies/recipe-parts-tiny (docs/guide.md, "Recipes").

Which part of the field recipe (drmlab.training.recipes) moves a model's loss? Each arm is the field recipe
with one part put back to the reference's: the betas (0.9, 0.999), the constant rate with no warm-up, or
weight decay 0.01 on every tensor. Each arm is a ``drmlab ablate --sweep-only`` study of the same models at
the same rates, one seed, scored as the protocol's sweep is (validation CE on the held-out slice of the
training split, nats per byte), so its scores sit beside the sweeps of the two whole recipes (protocol-tiny:
the reference; protocol-tiny-field: the field), which the record names and does not copy.

    python tools/collect_recipe_parts.py --machine "..." --how "..."
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drmlab.experiments.ablate.protocol import collect_results
from drmlab.experiments.results import write

ROOT = Path(__file__).resolve().parents[1]
NAME = "recipe-parts-tiny"
# arm -> (its study folder under studies/, the settings it puts back, what that is)
ARMS = {
    "betas": ("recipe-parts-betas", {"beta2": 0.999}, "the field recipe with the reference's betas (0.9, 0.999)"),
    "schedule": (
        "recipe-parts-schedule",
        {"schedule": "constant", "warmup_fraction": 0},
        "the field recipe at a constant rate with no warm-up",
    ),
    "decay": (
        "recipe-parts-decay",
        {"weight_decay": 0.01, "decay_all_params": True},
        "the field recipe with the reference's decay, 0.01 on every tensor",
    ),
}
COMMAND = (
    "drmlab ablate --models J_NO_DIRECTION,GPT2 --seeds 1 --preset tiny --recipe field --lr-grid 1e-3,8e-3 "
    "--tune-tokens 1M --sweep-only --threads 1 --quiet --leave-held {sets} --out studies/{folder}"
)


def arm_record(studies: Path, folder: str, settings: dict, what: str) -> dict:
    """One arm: what it is, the settings it puts back, its command and per model its score at each rate."""
    results = collect_results(studies / folder)
    train = results["study"]["train"]
    for key, value in settings.items():
        if train.get(key) != value:
            raise ValueError(f"studies/{folder}: {key} is {train.get(key)!r}, the arm puts back {value!r}")
    sets = " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items())
    return {
        "what": what,
        "puts_back": settings,
        "command": COMMAND.format(sets=sets, folder=folder),
        "commit": results["provenance"]["commit"],
        "date": results["provenance"]["date"],
        "complete": all(s["complete"] for s in results["lr_sweep"].values()),
        "scores": {model: s["scores"] for model, s in results["lr_sweep"].items()},
        "study": results["study"],
    }


def record(studies: Path, machine: str, how: str) -> dict:
    arms = {arm: arm_record(studies, folder, settings, what) for arm, (folder, settings, what) in ARMS.items()}
    first = next(iter(arms.values()))
    return {
        "title": "The field recipe's parts at tiny: each arm the field recipe with one part put back to the "
        "reference's, 1M tokens, one seed, beside the two whole recipes' sweeps",
        "provenance": {
            "command": "; ".join(a["command"] for a in arms.values()),
            "command_recorded": True,
            "commit": first["commit"],
            "date": first["date"],
            "how": how,
            "machine": machine,
            "source": "studies/recipe-parts-* (the sweep runs' config, metrics and summary; not committed), "
            "collected with tools/collect_recipe_parts.py",
        },
        "units": "tuning CE: nats per byte on the held-out slice of the training split after 1M tokens (seed 1), "
        "as in the protocol's sweeps",
        "beside": {"reference": "protocol-tiny", "field": "protocol-tiny-field"},
        "complete": all(a["complete"] for a in arms.values()),
        "arms": {arm: {k: v for k, v in a.items() if k not in ("commit", "date", "study")} for arm, a in arms.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", default="studies", help="the folder holding the arms' study folders")
    parser.add_argument("--machine", required=True, help="the machine and its load while the runs trained")
    parser.add_argument("--how", required=True, help="how the runs were made (processes, threads)")
    args = parser.parse_args()
    result = record(Path(args.studies), args.machine, args.how)
    path = ROOT / "docs" / "studies" / NAME / "results.json"
    write(path, result)
    print(f"wrote {path.relative_to(ROOT)}: complete: {result['complete']}")


if __name__ == "__main__":
    main()
