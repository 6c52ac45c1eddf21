"""Imports every model family so that each registers itself (see ``registry``)."""

import importlib

for _module in (
    "drmlab.models.drm",
    "drmlab.models.gpt2",
    "drmlab.models.looped",
    "drmlab.models.mamba",
    "drmlab.models.resolvent_lm",
):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _exc:  # a family not written yet
        if _exc.name != _module:
            raise
