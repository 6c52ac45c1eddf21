"""The C kernel of :mod:`drmlab.ops.decode_step`: ``step.c`` through ctypes.

``step.c`` (plain C99, no torch headers) holds one token of the DRM block path inside an open block
and the emitter, for float32 and float64 (``docs/drm.md`` section A.4.5, "The fused step"). It takes
three flat arrays: buffer addresses (:data:`POINTER_SLOTS`, then :data:`LAYER_SLOTS` per mixer layer),
sizes and flags (:data:`INTEGER_SLOTS`, then one dilation per mixer layer) and real settings
(:data:`REAL_SLOTS`); the names here are the C enums' order, and :func:`prepare` checks the counts and
the ABI version. :mod:`drmlab.ops.ckernels` builds and loads it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import ckernels

__all__ = ["KERNEL", "SOURCE", "POINTER_SLOTS", "LAYER_SLOTS", "INTEGER_SLOTS", "REAL_SLOTS", "unavailable", "run"]

SOURCE = Path(__file__).resolve().parent / "step.c"
ABI_VERSION = 1
C_DTYPES = {torch.float32: "f32", torch.float64: "f64"}

POINTER_SLOTS = (
    "tokens", "embedding",
    "flow_w1", "flow_b1", "flow_w2", "flow_b2",
    "state_part", "gates", "directions", "damped", "u_factor", "scaled", "chol", "rho", "dim_d",
    "z_start", "delta_sum", "delta_sum_out",
    "mix_w", "mix_b", "mix_previous", "mix_out_w", "mix_out_b", "mix_previous_out",
    "res_w",
    "mem_w", "mem_b", "mem_fw", "mem_fb", "mem_ww", "mem_wb", "mem_cw", "mem_cb",
    "mem_previous", "mem_m", "mem_previous_out", "mem_m_out",
    "norm_w", "emit_w1", "emit_b1", "emit_w2", "emit_b2",
    "z_out", "logits",
)  # fmt: skip
LAYER_SLOTS = ("conv_w", "conv_b", "point_w", "point_b", "context", "context_out")
INTEGER_SLOTS = (
    "batch", "state", "token", "vocab", "flow_hidden", "flow_out", "directions", "rank",
    "mix_hidden", "mix_layers", "kernel", "mem_hidden", "emit_hidden",
    "has_prefix", "has_mixer", "has_residual", "has_memory", "bounded",
)  # fmt: skip
REAL_SLOTS = ("dt", "strength", "radius", "mix_scale", "res_scale", "mem_scale", "forget_bias", "norm_eps")


def prepare(lib: ctypes.CDLL) -> None:
    """Bind the kernels' signatures and check the ABI version and the slot counts against the names here."""
    for name in ("drm_decode_abi", "drm_decode_pointer_slots", "drm_decode_integer_slots", "drm_decode_real_slots"):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, []
    if lib.drm_decode_abi() != ABI_VERSION:
        raise RuntimeError(f"step.c ABI version {lib.drm_decode_abi()}, expected {ABI_VERSION}")
    counts = (lib.drm_decode_pointer_slots(), lib.drm_decode_integer_slots(), lib.drm_decode_real_slots())
    if counts != (len(POINTER_SLOTS), len(INTEGER_SLOTS), len(REAL_SLOTS)):
        raise RuntimeError(f"step.c slot counts {counts} differ from c.py's")
    for suffix in C_DTYPES.values():
        fn = getattr(lib, f"drm_decode_step_{suffix}")
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p] * 3


KERNEL = ckernels.register(ckernels.CKernel("decode_step", SOURCE, prepare))


def unavailable(dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run in ``dtype`` (or at all); None when it can."""
    if dtype not in C_DTYPES:
        return "the fused step's C kernel computes in float32 or float64 only"
    if ckernels.disabled_by_env():
        return f"C kernels disabled by {ckernels.DISABLE_ENV}"
    if not KERNEL.available():
        return f"the fused step's C kernel is unavailable: {KERNEL.status()['error']}"
    return None


def run(dtype: torch.dtype, pointers: list, integers: list, reals: list) -> None:
    """One call of ``drm_decode_step_<dtype>``: the addresses (0 for an absent buffer), sizes and settings
    in the slot order; every buffer contiguous, on the CPU, of ``dtype`` (tokens: int64)."""
    fn = getattr(KERNEL.library(), f"drm_decode_step_{C_DTYPES[dtype]}")
    p = (ctypes.c_void_p * len(pointers))(*pointers)
    n = (ctypes.c_longlong * len(integers))(*integers)
    r = (ctypes.c_double * len(reals))(*reals)
    if fn(p, n, r) != 0:
        raise MemoryError("the fused decode step could not allocate its work buffer")
