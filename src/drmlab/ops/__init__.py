"""Pure tensor operators shared by the model families: one folder per operator, its plain
reference beside its fast paths and one dispatcher (the layout of flash-linear-attention's
``fla/ops``).

* ``linear_scan``: the first-order recurrence m_t = f_t * m_{t-1} + u_t (``docs/drm.md`` section 9),
  exact in forward and backward; backends ``"c"`` (a compiled C kernel) and ``"torch"``
  (``drmlab.ops.linear_scan``).
* ``selective_scan``: Mamba's selective scan h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t,
  y_t = C_t . h_t (Gu & Dao 2023); backends ``"c"`` (a fused kernel) and ``"torch"`` (chunks of
  ``linear_scan``) (``drmlab.ops.selective_scan``).
* ``delta_rule``: the gated delta rule S_t = f_t S_{t-1} + g_t k_t (v_t - S_{t-1}^T k_t)^T with the
  read o_t = S_{t-1}^T q_t, the fast-weight memory's recurrence (``docs/drm.md`` section V.2); a
  chunked WY form, exact forward and backward (``drmlab.ops.delta_rule``).
* ``causal_depthwise_conv1d`` / ``causal_depthwise_conv1d_step``: the causal mixer's
  depthwise convolution with left padding only (``docs/drm.md`` section 7; ``drmlab.ops.conv``).
* ``woodbury_solve``, ``metric_energy``, ``metric_dense``, ``coupling_matrix``: the
  diagonal-plus-low-rank metric G = D + U U^T, its Woodbury inverse, the energy v^T G v and the
  direction coupling V G V^T (``docs/drm.md`` sections 4 and 5; ``drmlab.ops.woodbury``).
* ``kernel_project``, ``pseudo_inverse_solve``, ``exact_rank``: the same metric where its floor D may
  vanish (``docs/geometry.md`` section 8); ``fisher_pullback``, ``fisher_factor``: J^T (diag p - p p^T) J
  and a factor B with B^T B equal to it (``docs/geometry.md`` sections 3 and 9; ``drmlab.ops.fisher``).
* ``decode_step``: the fused DRM decode step, one C call for a token inside an open block (``docs/drm.md``
  section A.4.5, "The fused step"; the model side is ``drmlab.models.drm.fused_step``).
* ``c_kernel_available`` / ``c_kernel_status``: whether the C kernels are built and loaded, and
  why not (``drmlab.ops.ckernels``, which compiles, caches and loads them).
* ``self_check``: the first-use check of every C and Triton backend against its operator's
  reference (forward and gradient, the exactness tests' tolerance), once per (operator, backend,
  device type, dtype) in a process; a backend that fails is replaced by the next one, said in one line
  (``drmlab.ops.self_check``; ``DRMLAB_NO_BACKEND_CHECK=1`` switches it off). Each operator's probe
  (``drmlab.ops.probes``, imported here: it fills ``self_check.PROBES``) sits above the operators it
  runs; the check, and the backend tables of ``drmlab.ops.backends`` that call it, know no operator.

Note: ``drmlab.ops.linear_scan``, ``drmlab.ops.selective_scan`` and ``drmlab.ops.delta_rule`` name
both a subpackage and, as attributes of this package, its dispatcher function; reach a
subpackage's modules with
``from drmlab.ops.linear_scan import c``, not ``import drmlab.ops.linear_scan as ...``.
"""

from . import probes  # each operator's first-use probe, into self_check.PROBES
from .ckernels import c_kernel_available, c_kernel_status
from .conv import causal_depthwise_conv1d, causal_depthwise_conv1d_step
from .delta_rule import delta_rule
from .fisher import fisher_factor, fisher_pullback
from .linear_scan import backend_for, linear_scan
from .selective_scan import selective_scan, selective_scan_reference
from .woodbury import (
    coupling_matrix,
    exact_rank,
    kernel_project,
    metric_dense,
    metric_energy,
    pseudo_inverse_solve,
    woodbury_solve,
)

__all__ = [
    "linear_scan",
    "backend_for",
    "c_kernel_available",
    "c_kernel_status",
    "selective_scan",
    "selective_scan_reference",
    "delta_rule",
    "causal_depthwise_conv1d",
    "causal_depthwise_conv1d_step",
    "woodbury_solve",
    "metric_energy",
    "metric_dense",
    "coupling_matrix",
    "exact_rank",
    "kernel_project",
    "pseudo_inverse_solve",
    "fisher_pullback",
    "fisher_factor",
]
