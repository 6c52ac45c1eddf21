"""drmlab models as Hugging Face ``PreTrainedModel`` classes, with their decode state as the cache.

One class per model family (:data:`MODEL_CLASSES`), each holding the registry's own ``nn.Module``
as its submodule ``model``: the class rebuilds it with ``drmlab.models.build_model`` from its
config (:mod:`drmlab.integrations.hf_config`) and adds no model code of its own. So
``save_pretrained`` writes the drmlab state dict under ``model.`` (safetensors, tied weights once)
and ``from_pretrained`` reads it back into the same module, bit for bit.

**Generation.** ``generate()`` threads a :class:`DecodeStateCache` through ``forward``: the first
call (no cache) is the model's parallel prefill, ``model(tokens, return_state=True)``, which returns
the logits and the decode state after the prompt (:func:`drmlab.generation.prefill`); every later
call steps the new token(s) through ``model.step(token, state)``. That is exactly the path of
``drmlab generate`` (:func:`drmlab.generation.generate`), so greedy decoding gives the same tokens.
transformers 5.24 passes the cache as ``cache`` and reads it back from the output's ``cache`` field
(``GenerationMixin._update_model_kwargs_for_generation``); earlier 5.x releases use the name
``past_key_values`` both ways, so the output fills the field of that name where the installed
release does not know ``cache`` (:data:`CACHE_OUTPUT_FIELD`); a model whose
``_supports_default_dynamic_cache()`` is False gets no ``DynamicCache`` of transformers' own
(``GenerationMixin._prepare_cache_for_generation``), so the first forward sees ``cache=None``.
What the state holds per family (constant-size for the recurrent ones) is in docs/integrations.md.
Beam search works too: the cache reorders the batch rows of every state tensor (``reorder_cache``).
Padding is refused (an ``attention_mask`` with zeros): a recurrent state cannot skip a pad token.

**Registration.** Importing this module registers every config with ``AutoConfig`` and every model
with ``AutoModelForCausalLM`` (``import drmlab.hf`` does it too); after that
``AutoModelForCausalLM.from_pretrained(DIR)`` loads any drmlab export.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from drmlab.integrations.hf_config import (
    MODEL_TYPES,
    DrmlabConfig,
    DrmlabDRMConfig,
    DrmlabGPT2Config,
    DrmlabLlamaConfig,
    DrmlabLoopedConfig,
    DrmlabMambaConfig,
    DrmlabResolventConfig,
    config_class,
    config_for,
    family_of,
    json_normal,
    model_fields,
)
from drmlab.models.families import all_families

if int(transformers.__version__.split(".")[0]) < 5:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"drmlab's Hugging Face classes need transformers>=5 (found {transformers.__version__}): "
        "pip install -U 'transformers>=5'"
    )

from drmlab.training.trainer import IGNORE_INDEX  # noqa: E402  (-100: a label that is not scored, as in transformers)


class ForeignModelError(ValueError):
    """A directory holds a model that is not the drmlab model type asked for; the message names it."""


# ---------------------------------------------------------------- the cache


def map_batch_rows(state, fn):
    """``state`` with ``fn`` applied to every tensor in it (dataclasses, tuples, lists and dicts are
    rebuilt; numbers and None kept). Every drmlab decode state holds the batch in dim 0 of each tensor,
    except the caches a state type lists in ``CACHE_FIELDS`` (the DRM fast step's block constants, which
    also hold weight-derived tensors): those are dropped (None) and the next step recomputes them."""
    if isinstance(state, torch.Tensor):
        return fn(state)
    caches = getattr(type(state), "CACHE_FIELDS", ())
    if caches and hasattr(state, "_fields"):
        state = state._replace(**{name: None for name in caches})
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.replace(
            state, **{f.name: map_batch_rows(getattr(state, f.name), fn) for f in dataclasses.fields(state) if f.init}
        )
    if isinstance(state, (tuple, list)):
        items = [map_batch_rows(item, fn) for item in state]
        return type(state)(items) if not hasattr(state, "_fields") else type(state)(*items)
    if isinstance(state, dict):
        return {key: map_batch_rows(value, fn) for key, value in state.items()}
    return state


class DecodeStateCache:
    """The drmlab decode state after ``seen_tokens`` tokens, as ``generate()``'s cache.

    ``state`` is whatever the model's ``forward(..., return_state=True)`` and ``step`` return (a
    recurrent state of constant size for DRM and MAMBA; key/value tensors that grow with the text
    for the attention families). ``get_seq_length()`` counts the tokens it has seen, and
    ``is_linear`` is False, so a cache passed back into ``generate()`` gets only the unseen tokens."""

    is_compileable = False
    is_croppable = False

    def __init__(self, state, seen_tokens: int):
        self.state = state
        self.seen_tokens = int(seen_tokens)

    @property
    def is_linear(self) -> tuple[bool]:
        return (False,)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the batch rows ``beam_idx`` (beam search)."""
        self.state = map_batch_rows(self.state, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def __repr__(self) -> str:
        return f"DecodeStateCache({type(self.state).__name__}, seen_tokens={self.seen_tokens})"


def _cache_output_field() -> str:
    """The output field ``generate()`` reads the cache back from: ``cache`` from transformers 5.24
    (where it leads ``ALL_CACHE_NAMES``), ``past_key_values`` before."""
    from transformers.generation import utils as generation_utils

    return "cache" if "cache" in getattr(generation_utils, "ALL_CACHE_NAMES", ()) else "past_key_values"


CACHE_OUTPUT_FIELD = _cache_output_field()


@dataclass
class DrmlabCausalLMOutput(ModelOutput):
    """``loss`` (next-token CE plus the model's auxiliary loss, when ``labels`` are given), ``logits``
    [B, T, vocab] and ``cache`` (the decode state after the last token, when asked for), under the
    name the installed transformers reads (:data:`CACHE_OUTPUT_FIELD`; the other field stays None)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    cache: DecodeStateCache | None = None
    past_key_values: DecodeStateCache | None = None


# ---------------------------------------------------------------- the models


class DrmlabForCausalLM(PreTrainedModel, GenerationMixin):
    """A registered drmlab model behind the Hugging Face causal-LM interface (the per-family
    classes below are what ``AutoModelForCausalLM`` maps to).

    ``DrmlabXForCausalLM(config)`` builds the model from the registry with the config's seed (the
    same weights as ``build_model``); ``from_drmlab(module, ...)`` wraps a model already built or
    trained."""

    config_class = DrmlabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # no assisted generation: a state cannot be rolled back
    supports_gradient_checkpointing = False

    def __init__(self, config: DrmlabConfig, module: torch.nn.Module | None = None):
        super().__init__(config)
        if type(self).config_class is not DrmlabConfig and not isinstance(config, type(self).config_class):
            raise ForeignModelError(
                f"{type(self).__name__} takes a {type(self).config_class.__name__}, "
                f"got a {type(config).__name__} (model_type {config.model_type!r})"
            )
        family = family_of(config.registry_name)
        if config.family and family != config.family:
            raise ForeignModelError(
                f"model {config.registry_name!r} belongs to the {family} family, not to {config.model_type!r}"
            )
        if module is None:
            from drmlab.models import build_model

            module = build_model(
                config.registry_name,
                config.preset,
                vocab_size=int(config.vocab_size),
                seed=int(config.build_seed),
                **dict(config.overrides or {}),
            )
        self._check_fields(config, module)
        self.model = module
        self.post_init()

    @staticmethod
    def _check_fields(config: DrmlabConfig, module: torch.nn.Module) -> None:
        """Refuse a model whose dataclass config differs from the one the config recorded."""
        saved, built = json_normal(config.model_fields or {}), model_fields(module)
        if saved and built != saved:
            differ = sorted(k for k in set(saved) | set(built) if saved.get(k, "<absent>") != built.get(k, "<absent>"))
            shown = ", ".join(
                f"{k}: saved {saved.get(k, '<absent>')!r}, built {built.get(k, '<absent>')!r}" for k in differ[:3]
            )
            raise ValueError(
                f"the config of {config.registry_name} preset {config.preset} differs from what this "
                f"drmlab builds from its name, preset and overrides ({shown}"
                f"{', ...' if len(differ) > 3 else ''}); it was saved by another drmlab version "
                f"({config.drmlab_version})"
            )

    @classmethod
    def from_drmlab(
        cls,
        module: torch.nn.Module,
        registry_name: str,
        preset: str,
        *,
        seed: int = 0,
        overrides: dict | None = None,
        tokenizer_name: str | None = "bytes",
    ) -> DrmlabForCausalLM:
        """Wrap ``module``, built as ``build_model(registry_name, preset, seed=seed, **overrides)`` and
        perhaps trained since, in the family's class (its weights are kept, not copied)."""
        vocab = int(getattr(getattr(module, "config", None), "vocab_size", 256))
        config = config_for(registry_name, preset, vocab, seed, overrides, tokenizer_name, fields=model_fields(module))
        model = model_class(family_of(config.registry_name))(config, module=module)
        return model.train(module.training)

    # -- Hugging Face hooks

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: the registry's builder initialises every weight from the config's seed."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is the model's own decode state, made by the first forward

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """Tied weights ``{target: source}``: those of any Hugging Face model inside the drmlab one
        (GPT2 and LLAMA tie their head to the token embedding), under their full names."""
        tied = {}
        for prefix, sub in self.model.named_modules():
            if isinstance(sub, PreTrainedModel):
                path = f"model.{prefix}." if prefix else "model."
                tied.update({path + k: path + v for k, v in sub.get_expanded_tied_weights_keys(False).items()})
        return tied

    def get_input_embeddings(self):
        return None  # the families name their embeddings differently; nothing here resizes them

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """``PreTrainedModel.from_pretrained``, refusing a directory of another model type and any
        missing, unexpected or mis-shaped weight (Hugging Face would initialise or drop them)."""
        path = Path(str(pretrained_model_name_or_path))
        if path.is_dir():
            check_model_type(path, cls.config_class.model_type if cls.config_class is not DrmlabConfig else None)
            if cls.config_class is DrmlabConfig:  # the base class: dispatch on the directory's model_type
                cls = model_class(_family_of_type(read_model_type(path)))
            if not (path / "model.safetensors").is_file() and not (path / "model.safetensors.index.json").is_file():
                pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
                found = f" ({', '.join(pickles[:3])} is a pickle, never loaded)" if pickles else ""
                raise FileNotFoundError(
                    f"{path} holds no model.safetensors{found}: drmlab loads weights only from safetensors"
                )
        if kwargs.get("use_safetensors") is False:
            raise ValueError(
                "use_safetensors=False: drmlab loads weights only from safetensors (a pickle can run code)"
            )
        kwargs["use_safetensors"] = True
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        problems = {
            k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v
        }
        if problems:
            detail = "; ".join(
                f"{k.replace('_', ' ')}: {', '.join(map(str, v[:3]))}{', ...' if len(v) > 3 else ''}"
                for k, v in problems.items()
            )
            raise ValueError(
                f"{pretrained_model_name_or_path}: the weights do not fit the model its config.json "
                f"describes ({detail})"
            )
        return (model, info) if want_info else model

    # -- the forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        cache: DecodeStateCache | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: DecodeStateCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **unused,
    ) -> DrmlabCausalLMOutput:
        """Logits [B, T, vocab] of ``input_ids`` [B, T]; with a ``cache``, ``input_ids`` are the tokens
        after the ones it has seen and are stepped through it; without one and ``use_cache``, the
        parallel prefill makes one. ``labels`` (Hugging Face's convention: the inputs, shifted here)
        give ``loss``."""
        cache = cache if cache is not None else past_key_values
        if input_ids is None or inputs_embeds is not None:
            raise ValueError(f"{type(self).__name__} takes input_ids (token ids), not inputs_embeds")
        if output_attentions or output_hidden_states:
            raise ValueError(f"{type(self).__name__} has no attention weights or hidden states to output")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError(
                f"{type(self).__name__} cannot skip padding (attention_mask holds zeros): a recurrent "
                "state reads every token; give prompts of one length, or one prompt at a time"
            )
        extra = sorted(k for k, v in unused.items() if v is not None and k not in ("position_ids", "logits_to_keep"))
        if extra:
            raise ValueError(f"{type(self).__name__}.forward got arguments it does not take: {', '.join(extra)}")
        if cache is not None:
            if not isinstance(cache, DecodeStateCache):
                raise ValueError(
                    f"{type(self).__name__} takes its own DecodeStateCache as cache, got {type(cache).__name__}"
                )
            steps = []
            state = cache.state
            for t in range(input_ids.shape[1]):
                logits_t, state = self.model.step(input_ids[:, t], state)
                steps.append(logits_t)
            cache.state, cache.seen_tokens = state, cache.seen_tokens + input_ids.shape[1]
            logits = torch.stack(steps, dim=1)
            out = None
        else:
            use_cache = self.config.use_cache if use_cache is None and hasattr(self.config, "use_cache") else use_cache
            out = self.model(input_ids, return_state=bool(use_cache))
            logits = out.logits
            if use_cache:
                cache = DecodeStateCache(out.state, input_ids.shape[1])
        loss = None
        if labels is not None:
            if out is None:
                raise ValueError("labels are scored on a parallel forward, not while stepping a cache")
            targets = labels[:, 1:].reshape(-1).to(logits.device)
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets, ignore_index=IGNORE_INDEX
            )
            aux = out.aux.get("loss_aux") if out.aux else None
            if aux is not None:
                loss = loss + aux.float()
        returned = cache if use_cache or cache is not None else None
        return DrmlabCausalLMOutput(loss=loss, logits=logits, **{CACHE_OUTPUT_FIELD: returned})


class DrmlabDRMForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabDRMConfig


class DrmlabGPT2ForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabGPT2Config


class DrmlabLlamaForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabLlamaConfig


class DrmlabLoopedForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabLoopedConfig


class DrmlabMambaForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabMambaConfig


class DrmlabResolventForCausalLM(DrmlabForCausalLM):
    config_class = DrmlabResolventConfig


MODEL_CLASSES: dict[str, type[DrmlabForCausalLM]] = {
    cls.config_class.family: cls
    for cls in (
        DrmlabDRMForCausalLM,
        DrmlabGPT2ForCausalLM,
        DrmlabLlamaForCausalLM,
        DrmlabLoopedForCausalLM,
        DrmlabMambaForCausalLM,
        DrmlabResolventForCausalLM,
    )
}


# ---------------------------------------------------------------- directories


def read_model_type(path: str | Path) -> str | None:
    """The ``model_type`` in ``path/config.json`` (None when absent); a missing or damaged file
    raises an error naming it."""
    from drmlab.runs import read_json

    config = read_json(Path(path) / "config.json")
    return config.get("model_type") if isinstance(config, dict) else None


def _family_of_type(model_type: str | None) -> str:
    register()  # families added since drmlab.hf was imported
    for family, known in MODEL_TYPES.items():
        if model_type == known:
            return family
    raise ForeignModelError(f"model_type {model_type!r} is not a drmlab model type ({', '.join(MODEL_TYPES.values())})")


def check_model_type(path: str | Path, expected: str | None = None) -> str:
    """The drmlab model_type of the Hugging Face directory ``path``; a directory of another model type
    (or of another drmlab family than ``expected``) raises :class:`ForeignModelError` in one line."""
    path = Path(path)
    found = read_model_type(path)
    register()  # families added since drmlab.hf was imported
    if found not in MODEL_TYPES.values():
        raise ForeignModelError(
            f"{path} holds a Hugging Face model of type {found!r}, not a drmlab export "
            f"(model types {', '.join(MODEL_TYPES.values())})"
        )
    if expected is not None and found != expected:
        raise ForeignModelError(
            f"{path} holds a {found!r} model, not {expected!r}: load it with "
            "AutoModelForCausalLM.from_pretrained or drmlab.hf.load_pretrained"
        )
    return found


def load_pretrained(path: str | Path, device: str | torch.device | None = "cpu") -> DrmlabForCausalLM:
    """The drmlab model of the Hugging Face directory ``path`` (any family), in eval mode on ``device``;
    a directory of another model type is refused in one line."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no config.json: it is not a Hugging Face model directory")
    family = _family_of_type(check_model_type(path))
    model = model_class(family).from_pretrained(str(path))
    if device is not None:
        from drmlab.devices import resolve_device

        model.to(resolve_device(str(device)))
    return model.eval()


# ---------------------------------------------------------------- registration


def model_class(family: str) -> type[DrmlabForCausalLM]:
    """The ``PreTrainedModel`` class of ``family``: drmlab's own, or for a family added with
    :func:`drmlab.models.add_family` one made on first use over its config class
    (:func:`drmlab.integrations.hf_config.config_class`) and registered with the Auto classes."""
    if family not in MODEL_CLASSES:
        config = config_class(family)
        MODEL_CLASSES[family] = type(
            config.__name__[:-6] + "ForCausalLM", (DrmlabForCausalLM,), {"config_class": config}
        )
        AutoConfig.register(config.model_type, config, exist_ok=True)
        AutoModelForCausalLM.register(config, MODEL_CLASSES[family], exist_ok=True)
    return MODEL_CLASSES[family]


def register() -> None:
    """Register every drmlab config with ``AutoConfig`` and model with ``AutoModelForCausalLM``, those of
    families added with ``add_family`` included (idempotent; runs when this module is imported: call it again
    after adding a family, or load through :func:`load_pretrained`, which does)."""
    for family in all_families():
        cls = model_class(family)
        AutoConfig.register(cls.config_class.model_type, cls.config_class, exist_ok=True)
        AutoModelForCausalLM.register(cls.config_class, cls, exist_ok=True)


register()

__all__ = [
    "DecodeStateCache",
    "DrmlabCausalLMOutput",
    "DrmlabForCausalLM",
    "DrmlabDRMForCausalLM",
    "DrmlabGPT2ForCausalLM",
    "DrmlabLlamaForCausalLM",
    "DrmlabLoopedForCausalLM",
    "DrmlabMambaForCausalLM",
    "DrmlabResolventForCausalLM",
    "ForeignModelError",
    "MODEL_CLASSES",
    "check_model_type",
    "load_pretrained",
    "map_batch_rows",
    "model_class",
    "read_model_type",
    "register",
]
