"""Training recipes: named sets of optimizer and schedule settings, recorded by name (docs/guide.md, "Recipes").

``reference`` is the DRM reference implementation's recipe (notes on the seed's protocol; docs/drm.md
section A.7): AdamW at a constant rate with no warm-up, betas (0.9, 0.999), weight decay 0.01 on every
tensor, gradient-norm clip 1.0. It reproduces the seed's claims, and every study recorded before recipes
had names was trained with it: :class:`~drmlab.training.config.TrainConfig`'s defaults are this recipe.

``field`` is how the papers this family is judged against compare architectures (Mamba, GLA, DeltaNet,
Zoology, after GPT-3 and Chinchilla): AdamW betas (0.9, 0.95), weight decay 0.1 on tensors of two or
more dimensions only (not on norms' gains nor biases), a linear warm-up over the first 5% of the steps,
then a cosine decay to 10% of the peak at the last step, gradient-norm clip 1.0. The warm-up share:
Adam's second-moment average at beta2 0.95 has a time constant of 1 / (1 - 0.95) = 20 steps, and 5% of
tiny's 611-step protocol is 31 steps, about one and a half of those; the share scales with the budget,
so a longer run warms up for longer as its schedule stretches (Pythia and GPT-3 warm up for 0.1-1% of
much longer runs, whose first steps are a smaller share of the whole).

A run's settings are layered: the preset's defaults, then the recipe, then each flag or ``--set KEY=VALUE``
(which may change a recipe's own setting: :func:`departures` lists what differs from the named recipe).
"""

from __future__ import annotations

from drmlab.naming import unknown

DEFAULT_RECIPE = "reference"

# The train settings each recipe fixes (TrainConfig fields); every recipe names the same keys.
RECIPES: dict[str, dict] = {
    "reference": dict(
        schedule="constant",
        warmup_fraction=None,  # no warm-up under a constant rate
        min_lr_ratio=0.1,  # unused by a constant rate
        beta1=0.9,
        beta2=0.999,
        weight_decay=0.01,
        decay_all_params=True,
        grad_clip=1.0,
    ),
    "field": dict(
        schedule="cosine",
        warmup_fraction=0.05,
        min_lr_ratio=0.1,
        beta1=0.9,
        beta2=0.95,
        weight_decay=0.1,
        decay_all_params=False,
        grad_clip=1.0,
    ),
}

SUMMARIES = {
    "reference": "the DRM reference's: constant rate, no warm-up, AdamW betas (0.9, 0.999), decay 0.01 on every tensor, clip 1.0",
    "field": "the field's: warm-up 5% then cosine to 10% of the peak, AdamW betas (0.9, 0.95), decay 0.1 on matrices only, clip 1.0",
}

RECIPE_KEYS = tuple(RECIPES[DEFAULT_RECIPE])


def recipe_settings(name: str) -> dict:
    """The train settings of recipe ``name``; an unknown name is refused in one line listing the known ones."""
    if name not in RECIPES:
        raise unknown("recipe", name, RECIPES)
    return dict(RECIPES[name])


def departures(settings) -> dict:
    """The recipe settings of ``settings`` (a TrainConfig or a dict with ``recipe``) that differ from its
    named recipe, as ``{key: value}``: what a flag or ``--set`` changed of it. {} for the recipe as it is."""
    values = settings if isinstance(settings, dict) else vars(settings)
    recipe = recipe_settings(values.get("recipe", DEFAULT_RECIPE))
    return {key: values[key] for key in RECIPE_KEYS if key in values and values[key] != recipe[key]}


def describe(settings) -> str:
    """One line: the recipe's name, what it is, and what differs from it (``recipe field (...); changed: ...``)."""
    values = settings if isinstance(settings, dict) else vars(settings)
    name = values.get("recipe", DEFAULT_RECIPE)
    changed = departures(values)
    tail = f"; changed: {', '.join(f'{k}={v!r}' for k, v in changed.items())}" if changed else ""
    return f"recipe {name} ({SUMMARIES[name]}){tail}"
