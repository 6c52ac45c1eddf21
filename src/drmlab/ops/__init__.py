"""Pure tensor operators shared by the model families.

* ``linear_scan``: the first-order recurrence m_t = f_t * m_{t-1} + u_t (math.md section 9),
  exact in forward and backward, with a compiled C kernel and a pure-torch fallback
  (``drmlab.ops.scan``).
* ``selective_scan``: Mamba's selective scan h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t,
  y_t = C_t . h_t (Gu & Dao 2023), a fused C kernel on CPU and a chunked ``linear_scan`` path
  elsewhere (``drmlab.ops.selective``).
* ``causal_depthwise_conv1d`` / ``causal_depthwise_conv1d_step``: the causal mixer's
  depthwise convolution with left padding only (math.md section 7; ``drmlab.ops.conv``).
* ``woodbury_solve``, ``metric_energy``, ``metric_dense``, ``coupling_matrix``: the
  diagonal-plus-low-rank metric G = D + U U^T, its Woodbury inverse, the energy v^T G v and the
  direction coupling V G V^T (math.md sections 4 and 5; ``drmlab.ops.woodbury``).
"""

from .conv import causal_depthwise_conv1d, causal_depthwise_conv1d_step
from .scan import backend_for, c_kernel_available, linear_scan
from .selective import selective_scan, selective_scan_reference
from .woodbury import coupling_matrix, metric_dense, metric_energy, woodbury_solve

__all__ = [
    "linear_scan",
    "backend_for",
    "c_kernel_available",
    "selective_scan",
    "selective_scan_reference",
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_step",
    "woodbury_solve",
    "metric_energy",
    "metric_dense",
    "coupling_matrix",
]
