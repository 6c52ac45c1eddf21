"""The causal mixer stage (``docs/drm.md`` section 7): z <- B(z + eta_mix CausalConv(f)) over the
features f = [z~_t; z~_t - z~_{t-1}; delta_t; e_t; dimD; rho]. Stepping keeps the previous input
state and each convolution layer's left context."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .base import Block, Stage


class MixerState(NamedTuple):
    """The previous position's input state [B, 1, d] and each layer's last dilation (K - 1) hidden vectors."""

    previous: torch.Tensor
    contexts: list


class MixerStage(Stage):
    def __init__(self, transition, mixer):
        super().__init__("mixer", transition, mixer=mixer)

    def token_part(self, e, width=None):
        return self.mixer.token_part(e)

    def forward(self, block: Block, part, state, keep):
        z, width = block.z, block.width
        diffs = None if block.delta is None else z - torch.cat([block.anchor, z[:, :-1]], dim=1)
        h = self.mixer.input_features(z, diffs, block.delta, block.scalars(), part, width)
        if keep:
            correction, contexts = self.mixer(h, return_state=True, width=width)
        else:
            correction = self.mixer(h, width=width)
        block.z = self.transition.bound(z + block.project(correction))
        return MixerState(z[:, -1:], contexts) if keep else None

    def step(self, block: Block, part, state: MixerState | None):
        z = block.z
        previous = block.anchor if state is None else state.previous
        diffs = None if block.delta is None else z - previous
        h = self.mixer.input_features(z, diffs, block.delta, block.scalars(), part, block.width)[:, 0]
        if state is None:
            width = self.config.mixer_kernel - 1
            contexts = [h.new_zeros(h.shape[0], dilation * width, h.shape[-1]) for dilation in self.mixer.dilations]
        else:
            contexts = state.contexts
        correction, contexts = self.mixer.step(h, contexts, block.width)
        block.z = self.transition.bound(z + block.project(correction.unsqueeze(1)))
        return MixerState(z, contexts)
