"""The model families, listed once, and their registration.

Each family package (``drmlab.models.<family>``) exports ``MODEL_NAMES`` and a builder ``build``
(``build(name, preset=..., vocab_size=..., seed=..., **overrides) -> nn.Module``);
:func:`register_families` imports them and registers every name. A family that fails to import
is an error, never silently missing from the registry.
"""

from __future__ import annotations

import importlib

from drmlab.models.registry import register

FAMILIES = ("drm", "gpt2", "looped", "mamba", "resolvent_lm")


def register_families(families: tuple[str, ...] = FAMILIES) -> None:
    """Import each family package and register its model names with its builder."""
    for family in families:
        module = importlib.import_module(f"drmlab.models.{family}")
        register(module.MODEL_NAMES, module.build)
