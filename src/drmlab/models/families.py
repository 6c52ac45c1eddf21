"""The model families, listed once, and their registration.

Each family package (``drmlab.models.<family>``) exports ``MODEL_NAMES`` and a builder ``build``
(``build(name, preset=..., vocab_size=..., seed=..., **overrides) -> nn.Module``), its
``PRESET_DIMS`` (one entry per preset, in :data:`drmlab.presets.PRESETS`' order) and
``closed_form_parameter_count(config)``; :func:`register_families` imports them and registers every
name. A family that fails to import is an error, never silently missing from the registry.

A family defined outside this package (a module offering the same four names) joins the registry with
:func:`add_family`; the Hugging Face integration then gives it its own ``model_type``
(``drmlab-FAMILY``). docs/adding-a-model.md walks through both.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from drmlab.models.registry import list_models, register
from drmlab.presets import PRESETS

FAMILIES = ("drm", "gpt2", "llama", "looped", "mamba", "resolvent_lm")
FAMILY_NAMES = ("MODEL_NAMES", "build", "PRESET_DIMS", "closed_form_parameter_count")
ADDED: dict[str, ModuleType] = {}  # families added from outside drmlab.models (add_family), by name


def register_families(families: tuple[str, ...] = FAMILIES) -> None:
    """Import each family package and register its model names with its builder."""
    for family in families:
        module = importlib.import_module(f"drmlab.models.{family}")
        register(module.MODEL_NAMES, module.build)


def add_family(family: str, module: ModuleType) -> None:
    """Register the family ``family`` defined by ``module`` outside drmlab.models: its ``MODEL_NAMES`` join the
    registry with its ``build``. Refused in one line: a module without the four names of a family package, one
    that does not size every preset, a family or model name already taken."""
    missing = [name for name in FAMILY_NAMES if not hasattr(module, name)]
    if missing:
        raise ValueError(f"family {family!r}: {module.__name__} lacks {', '.join(missing)} (docs/adding-a-model.md)")
    if tuple(module.PRESET_DIMS) != PRESETS:
        raise ValueError(
            f"family {family!r}: PRESET_DIMS sizes {', '.join(module.PRESET_DIMS)}; it must size {', '.join(PRESETS)}"
        )
    if family in FAMILIES or ADDED.get(family, module) is not module:
        raise ValueError(f"family {family!r} already exists")
    taken = sorted(set(module.MODEL_NAMES) & set(list_models()) - set(getattr(ADDED.get(family), "MODEL_NAMES", ())))
    if taken:
        raise ValueError(f"family {family!r}: model name {taken[0]!r} is already registered")
    register(module.MODEL_NAMES, module.build)
    ADDED[family] = module


def family_module(family: str) -> ModuleType:
    """The module of ``family``: its package in drmlab.models, or the module :func:`add_family` was given."""
    return ADDED[family] if family in ADDED else importlib.import_module(f"drmlab.models.{family}")


def all_families() -> tuple[str, ...]:
    """drmlab's families (:data:`FAMILIES`), then those added with :func:`add_family`."""
    return FAMILIES + tuple(ADDED)
