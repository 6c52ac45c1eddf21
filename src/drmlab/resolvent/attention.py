r"""The batched, differentiable resolvent operator, :func:`resolvent_attention`: the dispatcher
over the torch paths (``docs/resolvent.md`` section 6; choosing a path: section 6.3). One module
per path (:mod:`.dense`, :mod:`.sdpa`, :mod:`.flash`, :mod:`.flex`, :mod:`.scan`), the refusals
in :mod:`.checks`, the float64 numpy reference in :mod:`.reference`.
"""

from __future__ import annotations

import functools

import torch

from drmlab.resolvent.checks import refuse_non_finite
from drmlab.resolvent.common import Switch, as_switch, blend_gates, compute_dtype, fixed_at
from drmlab.resolvent.dense import dense_resolvent, resolvent_weights
from drmlab.resolvent.flash import flash_resolvent
from drmlab.resolvent.flex import flex_available, flex_resolvent
from drmlab.resolvent.scan import scan_resolvent
from drmlab.resolvent.sdpa import sdpa_resolvent

__all__ = [
    "resolvent_attention",
    "resolvent_weights",
    "select_path",
    "blend_gates",
    "PATHS",
]

PATHS = ("auto", "dense", "sdpa", "flash", "flex", "scan")


# ----------------------------------------------------------------------------- choosing a path


def select_path(phase: torch.Tensor | None, beta: Switch, qk: Switch, g: Switch) -> str:
    """The path ``resolvent_attention(path="auto")`` takes for these gates and switches (before
    the CUDA-only swap of a phase-free ``flash`` for ``flex``)."""
    if fixed_at(g, 0.0) and fixed_at(beta, 1.0):
        return "sdpa"
    if fixed_at(qk, 0.0):
        return "scan"
    return "flash"


@functools.lru_cache(maxsize=1)
def _has_flex() -> bool:
    return flex_available()


def _phase_free(phase: torch.Tensor | None, g: Switch) -> bool:
    """True when the blended phase is zero everywhere (no phase, ``g = 0``, or an all-zero phase
    without gradient)."""
    if phase is None or fixed_at(g, 0.0):
        return True
    if torch.compiler.is_compiling():  # a traced graph cannot read the phases: take the general path
        return False
    return not phase.requires_grad and not bool((phase != 0).any())


def _choose_path(path: str, q: torch.Tensor, phase, beta, qk, g, free: bool) -> str:
    """``path`` itself when forced; for ``"auto"``, :func:`select_path`, with a phase-free
    ``flash`` on CUDA in float32/bf16/fp16 becoming ``flex``."""
    if path != "auto":
        return path
    chosen = select_path(phase, beta, qk, g)
    if (
        chosen == "flash"
        and free
        and q.device.type == "cuda"
        and compute_dtype(q.dtype) == torch.float32
        and _has_flex()
    ):
        chosen = "flex"  # never run on a GPU when written: see drmlab.resolvent.flex
    return chosen


# ----------------------------------------------------------------------------- validating inputs


def _check_shapes(q, k, v, magnitude, phase, path) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must be one [B, H, S, d] shape, got {tuple(q.shape)}, {tuple(k.shape)}")
    B, H, S, d = q.shape
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, H, S, e] with [B, H, S] = {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    for name, t in (("magnitude", magnitude), ("phase", phase)):
        if t is None:
            continue
        if t.dim() != 3 or t.shape[0] != B or t.shape[1] not in (1, H) or t.shape[2] != S:
            raise ValueError(f"{name} must be [B, H or 1, S] = [{B}, {H} or 1, {S}], got {tuple(t.shape)}")
    if S > 0 and d == 0:
        raise ValueError("head_dim = 0 with a non-empty sequence")
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; use one of {PATHS}")


def _check_corner(chosen: str, free: bool, beta, qk, g) -> None:
    """A forced fast path outside its corner is refused."""
    if chosen == "sdpa" and not (fixed_at(g, 0.0) and fixed_at(beta, 1.0)):
        raise ValueError("path='sdpa' needs constant g = 0 and beta = 1")
    if chosen == "flex" and not free:
        raise ValueError("path='flex' needs a phase-free head (no phase, or g = 0)")
    if chosen == "scan" and not fixed_at(qk, 0.0):
        raise ValueError("path='scan' needs constant qk = 0")


# ----------------------------------------------------------------------------- calling it


def _run_path(chosen, q, k, v, magnitude, phase, beta, qk, g, free, block_q, block_k, block_bh):
    """``(Re O, Im O or None)`` of the chosen path, in the compute dtype (``sdpa``: the input dtype)."""
    if chosen == "sdpa":
        return sdpa_resolvent(q, k, v, qk)
    B, H = q.shape[:2]
    cdt = compute_dtype(q.dtype)
    beta_t, qk_t, g_t = (as_switch(x, B, H, cdt, q.device) for x in (beta, qk, g))
    # computed in cdt as documented, under an autocast too (its bf16 matmuls would round the
    # scores and overflow the flash tiles' float32 floor)
    with torch.autocast(device_type=q.device.type, enabled=False):
        if chosen == "dense":
            return dense_resolvent(q, k, v, magnitude, None if free else phase, beta_t, qk_t, g_t, cdt)
        if chosen == "flex":
            return flex_resolvent(q, k, v, magnitude, beta_t, qk_t, g_t, cdt, block_q)
        if chosen == "flash":
            return flash_resolvent(q, k, v, magnitude, phase, beta_t, qk_t, g_t, cdt, free, block_q, block_k, block_bh)
        return scan_resolvent(v, magnitude, phase, beta_t, g_t, cdt, free)


def _readout(re, im, dtype, return_imag):
    re = re.to(dtype)
    if not return_imag:
        return re
    im = torch.zeros_like(re) if im is None else im.to(dtype)
    return re, im


def resolvent_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    magnitude: torch.Tensor,
    phase: torch.Tensor | None,
    beta: Switch,
    qk: Switch,
    g: Switch,
    path: str = "auto",
    *,
    return_imag: bool = False,
    block_q: int = 128,
    block_k: int = 1024,
    block_bh: int | None = None,
    check_finite: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Causal resolvent attention, batched over ``[B, H]`` (``docs/resolvent.md`` section 6).

    Args:
        q, k: ``[B, H, S, d]`` queries and keys (``s_ij = q_i.k_j / sqrt(d)``).
        v: ``[B, H, S, e]`` real values.
        magnitude: ``[B, H or 1, S]`` raw gate magnitudes ``u`` (the blend clamps
            ``lerp(1, u, g)`` to [0, 1]; produce ``u`` with a parameterisation from
            :mod:`drmlab.resolvent.gates`, e.g. a sigmoid, so that gates keep gradient).
        phase: ``[B, H or 1, S]`` gate phases ``theta``, or None for zero phase.
        beta, qk, g: the switches, each a number or a tensor of shape ``[]``, ``[H]`` or
            ``[B, H]`` (learnable: gradients flow to tensors that require grad).
        path: ``"auto"`` (default), ``"dense"``, ``"sdpa"``, ``"flash"``, ``"flex"`` or ``"scan"``
            (sections 6.2 and 6.3). A forced fast path outside its corner raises ValueError.
        return_imag: also return the imaginary part of the readout.
        block_q, block_k, block_bh: tile of the ``flash`` path: query positions, key positions
            and rows of ``B * H`` per step (memory per step ~ ``block_bh*block_q*block_k``);
            ``block_bh=None`` sizes tiles to about 2^21 elements. ``block_q`` is also the
            sparsity block of the ``flex`` path.
        check_finite: raise :class:`drmlab.resolvent.reference.NonFinite`, as the float64
            reference does, for a non-finite switch, q, k, magnitude or phase, an overflowing
            blended phase or an overflowing causal logit (section 6.5). Off by default: it reads
            every input once more and can cost a pass over the logits.

    Returns:
        ``Re O`` of shape ``[B, H, S, e]`` in the input dtype, or ``(Re O, Im O)`` when
        ``return_imag``. ``a_0`` (position 0's gate) is never read.
    """
    _check_shapes(q, k, v, magnitude, phase, path)
    if check_finite:
        refuse_non_finite(q, k, magnitude, phase, beta, qk, g, compute_dtype(q.dtype))
    if q.shape[2] == 0:
        empty = v.new_zeros(v.shape, dtype=q.dtype)
        return (empty, empty.clone()) if return_imag else empty
    free = _phase_free(phase, g)
    chosen = _choose_path(path, q, phase, beta, qk, g, free)
    _check_corner(chosen, free, beta, qk, g)
    re, im = _run_path(chosen, q, k, v, magnitude, phase, beta, qk, g, free, block_q, block_k, block_bh)
    return _readout(re, im, q.dtype, return_imag)
