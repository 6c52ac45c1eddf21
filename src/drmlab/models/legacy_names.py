"""Checkpoints written before the model families shared their layers (``drmlab/models/layers``) name some
parameters differently; :func:`accept_legacy_names` maps those names to today's on load, so
every earlier run directory still loads with ``strict=True`` into the same numbers."""

from __future__ import annotations

import torch.nn as nn


def accept_legacy_names(module: nn.Module, renames: tuple[tuple[str, str], ...]) -> None:
    """Rename, in every state dict loaded into ``module``, each key part ``old`` to ``new``
    (pairs applied in order, on the key after the module's own prefix)."""

    def rename(_module, state_dict, prefix, *_):
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new_key = key[len(prefix) :]
            for old, new in renames:
                new_key = new_key.replace(old, new)
            if prefix + new_key != key:
                state_dict[prefix + new_key] = state_dict.pop(key)

    module.register_load_state_dict_pre_hook(rename)
