"""Pure tensor operators shared by the model families.

* ``linear_scan``: the first-order recurrence m_t = f_t * m_{t-1} + u_t (math.md section 9),
  exact in forward and backward, with a compiled C kernel and a pure-torch fallback
  (``drmlab.ops.scan``).
* ``causal_depthwise_conv1d`` / ``causal_depthwise_conv1d_step``: the causal mixer's
  depthwise convolution with left padding only (math.md section 7; ``drmlab.ops.conv``).
* ``woodbury_solve``, ``metric_energy``, ``metric_dense``, ``coupling_matrix``: the
  diagonal-plus-low-rank metric G = D + U U^T, its Woodbury inverse, the energy v^T G v and the
  direction coupling V G V^T (math.md sections 4 and 5; ``drmlab.ops.woodbury``).
"""

from .conv import causal_depthwise_conv1d, causal_depthwise_conv1d_step
from .scan import backend_for, c_kernel_available, linear_scan
from .woodbury import coupling_matrix, metric_dense, metric_energy, woodbury_solve

__all__ = [
    "linear_scan",
    "backend_for",
    "c_kernel_available",
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_step",
    "woodbury_solve",
    "metric_energy",
    "metric_dense",
    "coupling_matrix",
]
