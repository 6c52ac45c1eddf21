"""The Hugging Face configuration of a drmlab model: what the registry needs to rebuild it exactly.

One ``PretrainedConfig`` subclass per model family of :mod:`drmlab.models.families`, each with its
own ``model_type`` (:data:`MODEL_TYPES`: ``drmlab-drm``, ``drmlab-gpt2``, ``drmlab-llama``,
``drmlab-looped``, ``drmlab-mamba``, ``drmlab-resolvent``). A config holds no model settings of its own: it stores the
arguments of ``drmlab.models.build_model(registry_name, preset, vocab_size, seed, **overrides)``
and, as a check, the built model's dataclass config (``model_fields``). The model class
(:mod:`drmlab.integrations.hf_models`) rebuilds from the first and refuses to load when the second
differs (the export was made by a drmlab whose presets or defaults have changed since).
``tokenizer_name`` records the drmlab tokenizer the weights were trained with (``bytes`` or
``gpt2``). docs/integrations.md describes the files. A family added from outside drmlab
(:func:`drmlab.models.add_family`) gets a config class made for it, ``model_type``
``drmlab-FAMILY`` (:func:`config_class`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from transformers import PretrainedConfig

from drmlab.models.families import FAMILIES, all_families, family_module

# family package (drmlab.models.<family>) -> Hugging Face model_type
MODEL_TYPES = {
    "drm": "drmlab-drm",
    "gpt2": "drmlab-gpt2",
    "llama": "drmlab-llama",
    "looped": "drmlab-looped",
    "mamba": "drmlab-mamba",
    "resolvent_lm": "drmlab-resolvent",
}
assert set(MODEL_TYPES) == set(FAMILIES), "every registered family needs a Hugging Face model_type"


def family_of(registry_name: str) -> str:
    """The family package that registers ``registry_name`` (``J`` -> ``drm``); an unknown name raises
    the registry's did-you-mean ValueError."""
    from drmlab.models.registry import parse_model_spec

    name, _ = parse_model_spec(registry_name)
    for family in all_families():
        if name in family_module(family).MODEL_NAMES:
            return family
    raise ValueError(f"model {name!r} is registered but belongs to no family of drmlab.models.families")


def json_normal(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists, keys strings): how a config.json holds it."""
    return json.loads(json.dumps(value, default=str))


def model_fields(model) -> dict:
    """The dataclass config of a built drmlab model, JSON-normal ({} when it has none)."""
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return {}
    return json_normal(dataclasses.asdict(config))


class DrmlabConfig(PretrainedConfig):
    """The arguments that rebuild one registered drmlab model (the base of the per-family configs).

    ``registry_name``, ``preset``, ``vocab_size``, ``build_seed`` and ``overrides`` are passed to
    ``build_model``; ``model_fields`` is the built model's dataclass config as saved (checked on
    rebuilding); ``tokenizer_name`` is the drmlab tokenizer of the weights."""

    model_type = "drmlab"
    family = ""

    registry_name: str = ""
    preset: str = "micro"
    vocab_size: int = 256
    build_seed: int = 0
    overrides: dict | None = None
    model_fields: dict | None = None
    tokenizer_name: str | None = "bytes"
    drmlab_version: str | None = None


class DrmlabDRMConfig(DrmlabConfig):
    """A DRM variant (``A`` ... ``J``, ``SSM_CONTROL``, the component ablations)."""

    model_type = MODEL_TYPES["drm"]
    family = "drm"


class DrmlabGPT2Config(DrmlabConfig):
    """The GPT2 baseline (Hugging Face's ``GPT2LMHeadModel`` inside drmlab's wrapper)."""

    model_type = MODEL_TYPES["gpt2"]
    family = "gpt2"


class DrmlabLlamaConfig(DrmlabConfig):
    """The LLAMA baseline (Hugging Face's ``LlamaForCausalLM`` inside drmlab's wrapper)."""

    model_type = MODEL_TYPES["llama"]
    family = "llama"


class DrmlabLoopedConfig(DrmlabConfig):
    """The LOOPED model (any arm, through ``overrides={"arm": ...}``)."""

    model_type = MODEL_TYPES["looped"]
    family = "looped"


class DrmlabMambaConfig(DrmlabConfig):
    """drmlab's MAMBA (the Mamba block on drmlab's selective scan)."""

    model_type = MODEL_TYPES["mamba"]
    family = "mamba"


class DrmlabResolventConfig(DrmlabConfig):
    """The resolvent transformer and its controls (``RESOLVENT``, ``RESOLVENT_SOFTMAX``, ``RESOLVENT_ROPE``)."""

    model_type = MODEL_TYPES["resolvent_lm"]
    family = "resolvent_lm"


CONFIG_CLASSES: dict[str, type[DrmlabConfig]] = {
    cls.family: cls
    for cls in (
        DrmlabDRMConfig,
        DrmlabGPT2Config,
        DrmlabLlamaConfig,
        DrmlabLoopedConfig,
        DrmlabMambaConfig,
        DrmlabResolventConfig,
    )
}


def config_class(family: str) -> type[DrmlabConfig]:
    """The config class of ``family``: one of the classes above, or for another family (a new one in
    :data:`MODEL_TYPES`, or one added with ``add_family``) one made on first use (``Drmlab<Family>Config``,
    model_type ``drmlab-<family>`` unless :data:`MODEL_TYPES` names it), kept in :data:`CONFIG_CLASSES` and
    :data:`MODEL_TYPES` like the others."""
    if family not in CONFIG_CLASSES:
        if family not in all_families():
            raise ValueError(f"{family!r} is not a model family of drmlab.models.families")
        model_type = MODEL_TYPES.setdefault(family, "drmlab-" + family.replace("_", "-"))
        name = "Drmlab" + "".join(part.capitalize() for part in family.split("_")) + "Config"
        doc = f"A model of the {family} family."
        CONFIG_CLASSES[family] = type(
            name, (DrmlabConfig,), {"model_type": model_type, "family": family, "__doc__": doc}
        )
    return CONFIG_CLASSES[family]


def config_for(
    registry_name: str,
    preset: str,
    vocab_size: int = 256,
    seed: int = 0,
    overrides: dict | None = None,
    tokenizer_name: str | None = "bytes",
    fields: dict | None = None,
) -> DrmlabConfig:
    """The config of ``build_model(registry_name, preset, vocab_size, seed, **overrides)``, of the
    family's class. ``fields`` (the model's dataclass config) is computed by a build on the meta
    device when not given."""
    from drmlab import __version__
    from drmlab.models.registry import config_fields, parse_model_spec

    name, arm = parse_model_spec(registry_name)  # LOOPED:B -> LOOPED, arm B
    overrides = {**arm, **(overrides or {})}
    if fields is None:
        fields = json_normal(config_fields(name, preset, vocab_size=int(vocab_size), **overrides))
    cls = config_class(family_of(name))
    return cls(
        registry_name=name,
        preset=preset,
        vocab_size=int(vocab_size),
        build_seed=int(seed),
        overrides=json_normal(overrides),
        model_fields=fields,
        tokenizer_name=tokenizer_name,
        drmlab_version=__version__,
        architectures=[f"{cls.__name__[:-6]}ForCausalLM"],
    )
