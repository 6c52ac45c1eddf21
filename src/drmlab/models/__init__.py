"""Model families and their registry (``build_model``, ``list_models``)."""

from drmlab.models.registry import PRESETS, build_model, list_models, register

__all__ = ["PRESETS", "build_model", "list_models", "register"]
