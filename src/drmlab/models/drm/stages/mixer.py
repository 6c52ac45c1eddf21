"""The causal mixer stage (``docs/drm.md`` section 7): z <- B(z + eta_mix CausalConv(f)) over the
features f = [z~_t; z~_t - z~_{t-1}; delta_t; e_t; dimD; rho]. Stepping keeps the previous input
state and each convolution layer's left context; the fast step also keeps the block's dimD/rho part
and each layer's open partial sums (:class:`MixerStepCache`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from drmlab.ops.conv import causal_depthwise_conv1d_partials, causal_depthwise_conv1d_step_partials, conv_step_taps

from . import stepping
from .base import Block, Stage


class MixerStepCache(NamedTuple):
    """The fast step's extras: W_in's dimD/rho part at the block start [B, M] (constant over the
    block), each layer's taps (:func:`~drmlab.ops.conv.conv_step_taps`) and its open partial sums
    (:func:`~drmlab.ops.conv.causal_depthwise_conv1d_partials` of its context)."""

    scalar_part: torch.Tensor
    taps: list
    partials: list


class MixerState(NamedTuple):
    """The previous position's input state [B, 1, d], each layer's last dilation (K - 1) hidden
    vectors and the fast step's :class:`MixerStepCache` (None until a fast step or a prefill makes it)."""

    previous: torch.Tensor
    contexts: list
    cache: MixerStepCache | None = None

    # derived from the rest (recomputable); not counted as the state a sequence carries (state_nbytes)
    CACHE_FIELDS = ("cache",)


class MixerStage(Stage):
    def __init__(self, transition, mixer):
        super().__init__("mixer", transition, mixer=mixer)

    def token_part(self, e, width=None):
        return self.mixer.token_part(e)

    def forward(self, block: Block, part, state, keep):
        z, width = block.z, block.width
        diffs = None if block.delta is None else z - torch.cat([block.anchor, z[:, :-1]], dim=1)
        weights = block.once(f"{self.name}:{width}", lambda: self.mixer.state_weights(width))
        h = self.mixer.input_features(z, diffs, block.delta, block.scalars(), part, weights, width)
        if keep:
            correction, contexts = self.mixer(h, return_state=True, width=width)
        else:
            correction = self.mixer(h, width=width)
        block.z = self.transition.bound(z, block.project(correction))
        return MixerState(z[:, -1:], contexts, self._cache(block, contexts)) if keep else None

    def _cache(self, block: Block, contexts: list) -> MixerStepCache | None:
        """The block's :class:`MixerStepCache` after ``contexts`` where the fast step runs, else None."""
        mixer = self.mixer
        if not stepping.fast_step_supported(block.start) or mixer.depthwise[0].kernel_size[0] < 2:
            return None
        if block.width is not None:  # the sliced variable rank (docs/variable-rank.md section 5): the plain step
            return None
        scalar_part = F.linear(block.scalars(), mixer.in_proj.weight[:, -2:])
        taps = [conv_step_taps(conv.weight, block.start.dtype) for conv in mixer.depthwise]
        partials = [
            causal_depthwise_conv1d_partials(context, layer_taps, dilation)
            for context, layer_taps, dilation in zip(contexts, taps, mixer.dilations)
        ]
        return MixerStepCache(scalar_part, taps, partials)

    def step_token_part(self, e):
        return self.mixer.token_part(e[:, 0])

    def step(self, block: Block, part, state: MixerState | None):
        """The fast step: :meth:`step_reference`'s values (``CausalConvMixer.input_features`` and
        ``CausalConvMixer.step`` over 2-D rows, the convolutions by open partial sums)."""
        mixer, z = self.mixer, block.z
        if state is None:
            width = self.config.mixer_kernel - 1
            contexts = [
                z.new_zeros(z.shape[0], dilation * width, mixer.in_proj.out_features) for dilation in mixer.dilations
            ]
            state = MixerState(block.anchor, contexts, self._cache(block, contexts))
        elif state.cache is None:
            state = MixerState(state.previous, state.contexts, self._cache(block, state.contexts))
        cache = state.cache
        if cache is None:
            return self.step_reference(block, part.unsqueeze(1), state)  # the 2-D rows as token_part gives them
        d, w = mixer.d_state, mixer.in_proj.weight
        rows = z[:, 0]
        pre = part + cache.scalar_part + F.linear(rows, w[:, :d])
        if block.delta is not None:
            pre = (
                pre
                + F.linear(rows - state.previous[:, 0], w[:, d : 2 * d])
                + F.linear(block.delta[:, 0], w[:, 2 * d : 3 * d])
            )
        h = F.silu(pre)
        contexts, partials = [], []
        for conv, point, dilation, context, taps, open_sums in zip(
            mixer.depthwise, mixer.pointwise, mixer.dilations, state.contexts, cache.taps, cache.partials
        ):
            y, open_sums = causal_depthwise_conv1d_step_partials(h, open_sums, taps, conv.bias, dilation)
            contexts.append(torch.cat([context[:, 1:], h.unsqueeze(1)], dim=1))
            partials.append(open_sums)
            h = h + F.linear(F.silu(y), point.weight, point.bias)
        correction = F.linear(h, mixer.out_proj.weight, mixer.out_proj.bias) * stepping.scalar(mixer.scale, h)
        block.z = stepping.bound(z + block.project(correction.unsqueeze(1)), self.config)
        return MixerState(z, contexts, MixerStepCache(cache.scalar_part, cache.taps, partials))

    def step_reference(self, block: Block, part, state: MixerState | None):
        z = block.z
        previous = block.anchor if state is None else state.previous
        diffs = None if block.delta is None else z - previous
        h = self.mixer.input_features(z, diffs, block.delta, block.scalars(), part, width=block.width)[:, 0]
        if state is None:
            width = self.config.mixer_kernel - 1
            contexts = [h.new_zeros(h.shape[0], dilation * width, h.shape[-1]) for dilation in self.mixer.dilations]
        else:
            contexts = state.contexts
        correction, contexts = self.mixer.step(h, contexts, block.width)
        block.z = self.transition.bound(z + block.project(correction.unsqueeze(1)))
        return MixerState(z, contexts)
