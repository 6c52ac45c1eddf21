"""The causal depthwise convolution over time (the causal mixer of ``docs/drm.md`` section 7), whole
sequence (the same map with a hand-written backward, and by the C kernel of :mod:`.c`) and one decoding
step (over the context, or over the open partial sums: the same sums), in :mod:`.causal_depthwise`; its
plain autograd reference in :mod:`.reference`."""

from .causal_depthwise import (
    causal_depthwise_conv1d,
    causal_depthwise_conv1d_partials,
    causal_depthwise_conv1d_step,
    causal_depthwise_conv1d_step_partials,
    conv_context_size,
    conv_step_taps,
)
from .reference import causal_depthwise_conv1d_reference

__all__ = [
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_partials",
    "causal_depthwise_conv1d_reference",
    "causal_depthwise_conv1d_step",
    "causal_depthwise_conv1d_step_partials",
    "conv_context_size",
    "conv_step_taps",
]
