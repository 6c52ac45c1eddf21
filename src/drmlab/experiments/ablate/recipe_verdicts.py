"""The verdicts of one protocol under two recipes, side by side (docs/guide.md, "Recipes"; docs/results.md).

Two collected ablation studies (``results.json``) of the same preset, budget, window, seeds and data, trained
under two recipes (:mod:`drmlab.training.recipes`), judged pair by pair with the promotion gate as
:func:`drmlab.experiments.ablate.scales.verdicts` judges a protocol across presets: for each pair of models
finished under both, the gate's mean gain, wins and promoted model under each recipe, and whether the verdict
holds, flips or changes from the first recipe to the second. :func:`side_by_side` first checks that the two
studies differ in nothing but their recipe, and refuses naming each other difference.
"""

from __future__ import annotations

from drmlab.experiments.ablate.scales import verdicts

# what the two studies must share for their verdicts to be compared: entries of results["study"] and of its train
SHARED = ("preset", "seeds", "tokenizer", "content_sha256")
SHARED_TRAIN = ("tokens", "batch_size", "grad_accum", "seq_len")


def differences(first: dict, second: dict) -> list[str]:
    """What besides the recipe differs between the two studies, one entry each."""
    a, b = first["study"], second["study"]
    found = [f"{key}: {a.get(key)!r} and {b.get(key)!r}" for key in SHARED if a.get(key) != b.get(key)]
    ta, tb = a.get("train", {}), b.get("train", {})
    return found + [f"{key}: {ta.get(key)!r} and {tb.get(key)!r}" for key in SHARED_TRAIN if ta.get(key) != tb.get(key)]


def recipe_of(record: dict) -> str:
    """The recipe a collected study trained under (a study from before recipes had names: the reference)."""
    from drmlab.training.recipes import DEFAULT_RECIPE

    return record["study"].get("train", {}).get("recipe", DEFAULT_RECIPE)


def side_by_side(first: dict, second: dict) -> list[dict]:
    """:func:`~drmlab.experiments.ablate.scales.verdicts` of the two studies, labelled by their recipes: per
    pair finished under both, ``a``, ``b``, ``at`` (recipe -> the gate's verdict) and ``across`` (holds, flips
    or changes). Studies that differ in more than the recipe, or not in it, are refused in one line."""
    found = differences(first, second)
    if found:
        raise ValueError("the two studies differ in more than their recipe: " + "; ".join(found))
    labels = recipe_of(first), recipe_of(second)
    if labels[0] == labels[1]:
        raise ValueError(f"both studies trained under recipe {labels[0]!r}: nothing to set side by side")
    return [r for r in verdicts(dict(zip(labels, (first, second)))) if None not in r["at"].values()]
