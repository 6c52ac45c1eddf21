"""Model families and their registry: ``build_model(name, preset, vocab_size, seed, **overrides)``,
``list_models()``, and ``count_parameters(model)``. The families are listed in ``families.py``
(``add_family``, in ``registry.py``, adds one defined elsewhere: docs/adding-a-model.md);
layers shared between families live in ``layers/``."""

from drmlab.models.inputs import ModelInputError
from drmlab.models.output import ModelOutput
from drmlab.models.parameters import count_parameters
from drmlab.models.registry import add_family, build_model, list_models, register

__all__ = [
    "ModelInputError",
    "ModelOutput",
    "add_family",
    "build_model",
    "count_parameters",
    "list_models",
    "register",
]
