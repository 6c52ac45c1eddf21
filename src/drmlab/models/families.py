"""The model families, listed once.

Each family package (``drmlab.models.<family>``) exports ``MODEL_NAMES`` and a builder ``build``
(``build(name, preset=..., vocab_size=..., seed=..., **overrides) -> nn.Module``), its
``PRESET_DIMS`` (one entry per preset, in :data:`drmlab.presets.PRESETS`' order) and
``closed_form_parameter_count(config)`` (:data:`FAMILY_NAMES`); the registry
(:func:`drmlab.models.registry.register_families`) imports them and registers every name. A family that
fails to import is an error, never silently missing from the registry.

A family defined outside this package (a module offering the same four names) joins the registry with
:func:`drmlab.models.add_family`, which records it in :data:`ADDED`; the Hugging Face integration then
gives it its own ``model_type`` (``drmlab-FAMILY``). docs/adding-a-model.md walks through both. This
module imports nothing of the registry: the registry imports it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES = ("drm", "gpt2", "llama", "looped", "mamba", "resolvent_lm")
FAMILY_NAMES = ("MODEL_NAMES", "build", "PRESET_DIMS", "closed_form_parameter_count")
ADDED: dict[str, ModuleType] = {}  # families added from outside drmlab.models (add_family), by name


def family_module(family: str) -> ModuleType:
    """The module of ``family``: its package in drmlab.models, or the module :func:`~drmlab.models.registry.add_family` was given."""
    return ADDED[family] if family in ADDED else importlib.import_module(f"drmlab.models.{family}")


def all_families() -> tuple[str, ...]:
    """drmlab's families (:data:`FAMILIES`), then those added with :func:`~drmlab.models.registry.add_family`."""
    return FAMILIES + tuple(ADDED)
