"""``import drmlab.hf``: drmlab's models in Hugging Face transformers, registered on import.

A thin public name for :mod:`drmlab.integrations.hf_models` (the ``PreTrainedModel`` classes, the
decode state as ``generate()``'s cache, the ``AutoConfig`` / ``AutoModelForCausalLM`` registration
that importing runs), :mod:`drmlab.integrations.hf_config` and :func:`export_run`
(:mod:`drmlab.integrations.hf_export`). Plain ``import drmlab`` does not register: it must not
import torch or transformers (``drmlab --help`` answers without them). docs/integrations.md.
"""

from drmlab.integrations.hf_config import (
    CONFIG_CLASSES,
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
)
from drmlab.integrations.hf_export import bytes_tokenizer_fast, export_run
from drmlab.integrations.hf_models import (
    CACHE_OUTPUT_FIELD,
    MODEL_CLASSES,
    DecodeStateCache,
    DrmlabCausalLMOutput,
    DrmlabDRMForCausalLM,
    DrmlabForCausalLM,
    DrmlabGPT2ForCausalLM,
    DrmlabLlamaForCausalLM,
    DrmlabLoopedForCausalLM,
    DrmlabMambaForCausalLM,
    DrmlabResolventForCausalLM,
    ForeignModelError,
    load_pretrained,
    map_batch_rows,
    model_class,
    register,
)

__all__ = [
    "CACHE_OUTPUT_FIELD",
    "CONFIG_CLASSES",
    "MODEL_CLASSES",
    "MODEL_TYPES",
    "DecodeStateCache",
    "DrmlabCausalLMOutput",
    "DrmlabConfig",
    "DrmlabDRMConfig",
    "DrmlabDRMForCausalLM",
    "DrmlabForCausalLM",
    "DrmlabGPT2Config",
    "DrmlabGPT2ForCausalLM",
    "DrmlabLlamaConfig",
    "DrmlabLlamaForCausalLM",
    "DrmlabLoopedConfig",
    "DrmlabLoopedForCausalLM",
    "DrmlabMambaConfig",
    "DrmlabMambaForCausalLM",
    "DrmlabResolventConfig",
    "DrmlabResolventForCausalLM",
    "ForeignModelError",
    "bytes_tokenizer_fast",
    "config_class",
    "config_for",
    "export_run",
    "load_pretrained",
    "map_batch_rows",
    "model_class",
    "register",
]
