"""The model registry: every model family registers a builder under one or more names
(the families are listed once, in :mod:`drmlab.models.families`; they are registered on first use, and
:func:`add_family` adds one defined outside drmlab).

``build_model(name, preset, vocab_size, seed, **overrides)`` is the one way to build a
model; ``list_models()`` lists every registered name. Where a command takes model names, a
name may carry a named arm, ``NAME:ARM`` (e.g. ``LOOPED:B`` = ``build_model("LOOPED", arm="B")``;
:func:`parse_model_spec`). A builder is a callable
``builder(name, preset=..., vocab_size=..., seed=..., **overrides) -> nn.Module``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn as nn

from drmlab.models.families import ADDED, FAMILIES, FAMILY_NAMES
from drmlab.naming import unknown
from drmlab.presets import PRESETS

_BUILDERS: dict[str, Callable[..., nn.Module]] = {}
_families_registered = False


def register(names: list[str] | tuple[str, ...] | str, builder: Callable[..., nn.Module]) -> None:
    """Register ``builder`` under each of ``names`` (names are upper-case by convention)."""
    for name in [names] if isinstance(names, str) else names:
        if name in _BUILDERS and _BUILDERS[name] is not builder:
            raise ValueError(f"model name {name!r} is already registered")
        _BUILDERS[name] = builder


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


def _ensure_loaded() -> None:
    """Register the families on first use (lazily: each family package is imported then)."""
    global _families_registered
    if not _families_registered:
        register_families()
        _families_registered = True


def list_models() -> list[str]:
    _ensure_loaded()
    return sorted(_BUILDERS)


def build_model(name: str, preset: str = "tiny", vocab_size: int = 256, seed: int = 0, **overrides) -> nn.Module:
    """Build the registered model ``name`` at ``preset`` for a ``vocab_size`` vocabulary.

    The same (name, preset, vocab_size, seed, overrides) always gives identical parameters.
    """
    _ensure_loaded()
    if name not in _BUILDERS:
        raise unknown("model", name, _BUILDERS)
    if preset not in PRESETS:
        raise unknown("preset", preset, PRESETS)
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    return _BUILDERS[name](name, preset=preset, vocab_size=vocab_size, seed=seed, **overrides)


def config_fields(name: str, preset: str = "tiny", vocab_size: int = 256, **overrides) -> dict:
    """The config of ``build_model(name, preset, vocab_size, **overrides)`` as a dict, from a build
    on the meta device (no memory, no initialisation): raises whatever a real build would. A model
    whose ``config`` is not a dataclass gives {}."""
    with torch.device("meta"):
        model = build_model(name, preset, vocab_size=vocab_size, **overrides)
    config = getattr(model, "config", None)
    return dataclasses.asdict(config) if config is not None and dataclasses.is_dataclass(config) else {}


def parse_model_spec(spec: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:ARM`` -> (registered name, overrides): ``LOOPED:B`` is the looped model's
    arm B, ``({"arm": "B"})``. An unknown name raises ValueError with the nearest one; whether the
    model has that arm is checked when it is built."""
    _ensure_loaded()
    name, colon, arm = spec.strip().partition(":")
    if name not in _BUILDERS:
        raise unknown("model", name, _BUILDERS)
    if not colon:
        return name, {}
    if not arm or ":" in arm:
        raise ValueError(f"model {spec!r}: write NAME or NAME:ARM (e.g. LOOPED:B)")
    return name, {"arm": arm}


def spec_path_name(spec: str) -> str:
    """``spec`` as a file-name component (``LOOPED:B`` -> ``LOOPED-B``)."""
    return spec.replace(":", "-")
