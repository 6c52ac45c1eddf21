r"""The Triton backend ("triton") of :func:`drmlab.ops.linear_scan`: the recurrence of
``docs/drm.md`` section 9,

    m_t = f_t m_{t-1} + u_t,        m_{-1} = init (zeros when None),

and its reverse-scan backward (the formulas of :mod:`.function`),

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   du_t = g_t,   df_t = g_t conj(m_{t-1}),
    dinit = conj(f_0) g_0,

as two Triton kernels.  **Layout of the work**: one program per (batch row, block of
:data:`BLOCK_D` channels) walks the time axis in order (the forward) or from the end (the
backward), holding the running state of its channels in registers; the B x ceil(D / BLOCK_D)
programs run in parallel.  Work O(B T D), one read of every input and one write of every output,
nothing stored per step besides the outputs.  Exact in the sense of the sequential loop: the same
multiply-adds in the same order, no division by a cumulative gate product, no logarithm of a gate
(a zero gate cuts the past exactly).

**Dtypes.**  Real inputs run as one lane, complex inputs as two (the real and imaginary parts of
``torch.view_as_real``, multiplied out by hand; the conjugates of the backward are sign flips of
the imaginary lane).  The kernels load whatever floating dtype they are given and accumulate in
float64 for float64 / complex128 inputs, else in float32: bfloat16 / float16 in, float32
accumulation.  (Through :func:`drmlab.ops.linear_scan` the dispatcher has already cast
bfloat16 / float16 to float32; calling :func:`forward` directly with bfloat16 tensors keeps
them bfloat16 in memory and returns float32 states.)  Gates and inputs may be strided or
broadcast (stride-0) views; states and gradients are written dense.

**Where it runs.**  On CUDA tensors when ``triton`` imports (``pip install drmlab[gpu]``), where
it is the default; on CPU tensors only under Triton's interpreter -- ``TRITON_INTERPRET=1`` in
the environment before the first Triton call of the process (the kernels are built, interpreted
or compiled, on first use) -- and only when asked for by name, never by ``"auto"``.  Anywhere
else :func:`unavailable` says why, and the dispatcher's error names the backends that can run.

**What has been run.**  Nothing of this module has run on a GPU: ``tests/ops/test_ops_triton.py``
runs both kernels under the interpreter on CPU tensors (small shapes, float64 and complex128
against the float64 reference loop, float32 and bfloat16 against it with float32 tolerances),
forward and backward, and has Triton's compiler build every kernel variant into PTX and a cubin
for sm_90 and sm_80 (no GPU needed: that proves the compiled path type-checks and lowers, not
that it runs).  The interpreter executes the kernels' semantics, not the compiled GPU code:
results on a GPU, register pressure, the speed of the time loop and float64 throughput are
unmeasured, and so is :data:`BLOCK_D`'s choice.

The helpers :func:`triton_unavailable` and :func:`jit_kernels` are shared with
:mod:`drmlab.ops.selective_scan.triton`.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "forward",
    "backward",
    "unavailable",
    "DENSE_INPUTS",
    "BLOCK_D",
    "AUTO_DEVICES",
    "FP_FUSION",
    "triton_unavailable",
    "jit_kernels",
    "interpreting",
]

# reads strided and broadcast (stride-0) views of f and u as they are
DENSE_INPUTS = False
# channels per program (a power of two; registers hold a few vectors of this length)
BLOCK_D = 128
# the device types on which "auto" may choose this backend (the CPU only by name, interpreted)
AUTO_DEVICES = ("cuda",)
# let the GPU compiler contract a * b + c into one fused multiply-add (one rounding, not two);
# said explicitly because Triton's default changes in 3.10
FP_FUSION = True

# ``triton.language``, bound by :func:`jit_kernels` on first use: importing this module imports
# no triton, so ``import drmlab`` stays light and TRITON_INTERPRET may be set until the first call.
tl = None

_LOCK = threading.Lock()
_STATE: dict = {}


def _triton_installed() -> bool:
    if "installed" not in _STATE:
        _STATE["installed"] = importlib.util.find_spec("triton") is not None
    return _STATE["installed"]


def interpreting() -> bool:
    """Whether Triton kernels of this process run in the interpreter: decided when the kernels
    are first built (``TRITON_INTERPRET`` at that moment), read from the environment before."""
    if "interpreted" in _STATE:
        return _STATE["interpreted"]
    import triton

    return bool(triton.knobs.runtime.interpret)


def triton_unavailable(device: torch.device) -> str | None:
    """Why Triton kernels cannot run on tensors of ``device``; None when they can."""
    if not _triton_installed():
        return "triton is not installed (pip install 'drmlab[gpu]')"
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if interpreting():
            return None
        return (
            "Triton runs on CPU tensors only in its interpreter: set TRITON_INTERPRET=1 "
            "before the first Triton call of the process"
        )
    return f"Triton kernels run on CUDA tensors (or CPU under its interpreter), not {device.type}"


def jit_kernels(module_globals: dict, names: Sequence[str]) -> dict[str, Callable]:
    """The Triton kernels of a module, built on first use: the plain functions ``names`` of
    ``module_globals`` under ``triton.jit`` (interpreted when TRITON_INTERPRET is set now),
    with the module's ``tl`` bound to ``triton.language``."""
    with _LOCK:
        import triton
        import triton.language

        module_globals["tl"] = triton.language
        _STATE.setdefault("interpreted", bool(triton.knobs.runtime.interpret))
        return {name: triton.jit(module_globals[name]) for name in names}


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton scan cannot run on ``device`` / compute ``dtype``; None when it can."""
    if dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        return "the Triton scan computes in float32, float64, complex64 or complex128 only"
    return triton_unavailable(device)


# --------------------------------------------------------------------------- the kernels
# Plain functions here, built by jit_kernels on first use.  Complex tensors arrive as their
# real views [..., 2]: element (b, t, d) has its real part at offset b*sb + t*st + d*sd and its
# imaginary part one element further.  Pointers step along time by adding the time stride (64-bit
# pointer arithmetic, so no product t * stride can overflow 32 bits).


def _forward_kernel(
    f_ptr,
    u_ptr,
    init_ptr,
    m_ptr,
    T,
    D,
    f_sb,
    f_st,
    f_sd,
    u_sb,
    u_st,
    u_sd,
    HAS_INIT: tl.constexpr,
    COMPLEX: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """m_t = f_t m_{t-1} + u_t over t = 0 .. T-1 for one batch row and BLOCK channels.
    init and m are dense ([B, D] and [B, T, D], times 2 lanes when COMPLEX)."""
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = d < D
    lanes = 2 if COMPLEX else 1
    f_ptrs = f_ptr + b * f_sb + d * f_sd
    u_ptrs = u_ptr + b * u_sb + d * u_sd
    m_ptrs = m_ptr + b * T * D * lanes + d * lanes
    m_re = tl.zeros([BLOCK], dtype=ACC)
    m_im = tl.zeros([BLOCK], dtype=ACC)
    if HAS_INIT:
        i_ptrs = init_ptr + b * D * lanes + d * lanes
        m_re = tl.load(i_ptrs, mask=mask, other=0.0).to(ACC)
        if COMPLEX:
            m_im = tl.load(i_ptrs + 1, mask=mask, other=0.0).to(ACC)
    for _ in range(T):
        f_re = tl.load(f_ptrs, mask=mask, other=0.0).to(ACC)
        u_re = tl.load(u_ptrs, mask=mask, other=0.0).to(ACC)
        if COMPLEX:
            f_im = tl.load(f_ptrs + 1, mask=mask, other=0.0).to(ACC)
            u_im = tl.load(u_ptrs + 1, mask=mask, other=0.0).to(ACC)
            new_re = f_re * m_re - f_im * m_im + u_re
            m_im = f_re * m_im + f_im * m_re + u_im
            m_re = new_re
            tl.store(m_ptrs + 1, m_im.to(m_ptr.dtype.element_ty), mask=mask)
        else:
            m_re = f_re * m_re + u_re
        tl.store(m_ptrs, m_re.to(m_ptr.dtype.element_ty), mask=mask)
        f_ptrs += f_st
        u_ptrs += u_st
        m_ptrs += D * lanes


def _backward_kernel(
    f_ptr,
    m_ptr,
    init_ptr,
    dm_ptr,
    du_ptr,
    df_ptr,
    dinit_ptr,
    T,
    D,
    f_sb,
    f_st,
    f_sd,
    f_last,
    dense_last,
    HAS_INIT: tl.constexpr,
    NEED_F: tl.constexpr,
    NEED_INIT: tl.constexpr,
    COMPLEX: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The reverse scan g_t = dm_t + conj(f_{t+1}) g_{t+1} from t = T-1 down to 0, with
    du_t = g_t, df_t = g_t conj(m_{t-1}) (m_{-1} = init or 0) and dinit = conj(f_0) g_0.
    m, dm, du, df are dense [B, T, D] (times 2 lanes), init and dinit dense [B, D]; f_last and
    dense_last are the offsets of step T-1 in f and in a dense row (from the host: 64-bit when
    they need it)."""
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = d < D
    lanes = 2 if COMPLEX else 1
    row = D * lanes
    last = b * T * row + dense_last + d * lanes  # offset of (b, T-1, d) in dense tensors
    f_ptrs = f_ptr + b * f_sb + f_last + d * f_sd
    init_re = tl.zeros([BLOCK], dtype=ACC)
    init_im = tl.zeros([BLOCK], dtype=ACC)
    if HAS_INIT:
        i_off = b * row + d * lanes
        init_re = tl.load(init_ptr + i_off, mask=mask, other=0.0).to(ACC)
        if COMPLEX:
            init_im = tl.load(init_ptr + i_off + 1, mask=mask, other=0.0).to(ACC)
    g_re = tl.zeros([BLOCK], dtype=ACC)
    g_im = tl.zeros([BLOCK], dtype=ACC)
    fn_re = tl.zeros([BLOCK], dtype=ACC)  # f_{t+1}; zero past the end
    fn_im = tl.zeros([BLOCK], dtype=ACC)
    dm_ptrs, du_ptrs, df_ptrs, m_ptrs = dm_ptr + last, du_ptr + last, df_ptr + last, m_ptr + last
    for i in range(T):
        t = T - 1 - i
        dm_re = tl.load(dm_ptrs, mask=mask, other=0.0).to(ACC)
        if COMPLEX:
            dm_im = tl.load(dm_ptrs + 1, mask=mask, other=0.0).to(ACC)
            new_re = dm_re + fn_re * g_re + fn_im * g_im
            g_im = dm_im + fn_re * g_im - fn_im * g_re
            g_re = new_re
            tl.store(du_ptrs + 1, g_im.to(du_ptr.dtype.element_ty), mask=mask)
        else:
            g_re = dm_re + fn_re * g_re
        tl.store(du_ptrs, g_re.to(du_ptr.dtype.element_ty), mask=mask)
        if NEED_F:
            # m_{t-1}: the state one step back, or init at t = 0 (that load is masked off)
            # (t as a vector: a scalar condition is a Python bool in the interpreter)
            has_prev = (tl.zeros([BLOCK], dtype=tl.int32) + t) > 0
            later = mask & has_prev
            mp_re = tl.where(has_prev, tl.load(m_ptrs - row, mask=later, other=0.0).to(ACC), init_re)
            if COMPLEX:
                mp_im = tl.where(has_prev, tl.load(m_ptrs - row + 1, mask=later, other=0.0).to(ACC), init_im)
                tl.store(df_ptrs, (g_re * mp_re + g_im * mp_im).to(df_ptr.dtype.element_ty), mask=mask)
                tl.store(df_ptrs + 1, (g_im * mp_re - g_re * mp_im).to(df_ptr.dtype.element_ty), mask=mask)
            else:
                tl.store(df_ptrs, (g_re * mp_re).to(df_ptr.dtype.element_ty), mask=mask)
        fn_re = tl.load(f_ptrs, mask=mask, other=0.0).to(ACC)
        if COMPLEX:
            fn_im = tl.load(f_ptrs + 1, mask=mask, other=0.0).to(ACC)
        f_ptrs -= f_st
        dm_ptrs -= row
        du_ptrs -= row
        df_ptrs -= row
        m_ptrs -= row
    if NEED_INIT:
        # after the loop fn holds f_0
        di_off = b * row + d * lanes
        tl.store(dinit_ptr + di_off, (fn_re * g_re + fn_im * g_im).to(dinit_ptr.dtype.element_ty), mask=mask)
        if COMPLEX:
            tl.store(dinit_ptr + di_off + 1, (fn_re * g_im - fn_im * g_re).to(dinit_ptr.dtype.element_ty), mask=mask)


def _kernels() -> dict[str, Callable]:
    if "kernels" not in _STATE:
        _STATE["kernels"] = jit_kernels(globals(), ["_forward_kernel", "_backward_kernel"])
    return _STATE["kernels"]


# --------------------------------------------------------------------------- host side


def _lanes(x: torch.Tensor) -> torch.Tensor:
    """The tensor the kernels read: a real tensor as it is, a complex one as its real view
    [..., 2] (conjugate and negative views resolved first: view_as_real refuses them)."""
    if x.is_complex():
        return torch.view_as_real(x.resolve_conj().resolve_neg())
    return x.resolve_neg()


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype in (torch.float64, torch.complex128) else tl.float32


def _result_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 / complex types as they are; float32, float16, bfloat16 -> float32."""
    if dtype.is_complex or dtype == torch.float64:
        return dtype
    return torch.float32


def _block(D: int) -> int:
    """Channels per program: BLOCK_D, or the power of two at or above D when D is smaller."""
    return min(BLOCK_D, 1 << max(0, (D - 1).bit_length()))


def forward(f: torch.Tensor, u: torch.Tensor, init: torch.Tensor | None) -> torch.Tensor:
    """The states m [B, T, D] from gates f and inputs u ([B, T, D], one dtype, any strides) and
    init ([B, D] or None); float32 states for float16 / bfloat16 inputs."""
    kernels = _kernels()
    B, T, D = u.shape
    complex_ = u.is_complex()
    out = torch.empty((B, T, D), dtype=_result_dtype(u.dtype), device=u.device)
    if out.numel() == 0:
        return out
    fl, ul, ol = _lanes(f), _lanes(u), _lanes(out)
    il = None if init is None else _lanes(init.contiguous())
    block = _block(D)
    kernels["_forward_kernel"][(B, -(-D // block))](
        fl,
        ul,
        il if il is not None else ol,
        ol,
        T,
        D,
        fl.stride(0),
        fl.stride(1),
        fl.stride(2),
        ul.stride(0),
        ul.stride(1),
        ul.stride(2),
        HAS_INIT=init is not None,
        COMPLEX=complex_,
        ACC=_acc_dtype(u.dtype),
        BLOCK=block,
        enable_fp_fusion=FP_FUSION,
    )
    return out


def backward(
    f: torch.Tensor, m: torch.Tensor, init: torch.Tensor | None, dm: torch.Tensor, need_f: bool, need_init: bool
):
    """(du, df or None, dinit or None) from the gates f, the states m, init and the gradient dm
    of the states (the reverse scan above)."""
    kernels = _kernels()
    B, T, D = m.shape
    need_init = need_init and init is not None
    dtype = _result_dtype(m.dtype)
    du = torch.empty((B, T, D), dtype=dtype, device=m.device)
    df = torch.empty((B, T, D), dtype=dtype, device=m.device) if need_f else None
    dinit = torch.zeros((B, D), dtype=dtype, device=m.device) if need_init else None
    if du.numel() == 0:
        return du, df, dinit
    fl = _lanes(f)
    ml, dml = _lanes(m.contiguous()), _lanes(dm.contiguous())
    il = None if init is None else _lanes(init.contiguous())
    dul = _lanes(du)
    dfl = dul if df is None else _lanes(df)
    dil = dul if dinit is None else _lanes(dinit)
    block = _block(D)
    kernels["_backward_kernel"][(B, -(-D // block))](
        fl,
        ml,
        il if il is not None else ml,
        dml,
        dul,
        dfl,
        dil,
        T,
        D,
        fl.stride(0),
        fl.stride(1),
        fl.stride(2),
        (T - 1) * fl.stride(1),
        (T - 1) * dul.stride(1),
        HAS_INIT=init is not None,
        NEED_F=need_f,
        NEED_INIT=need_init,
        COMPLEX=m.is_complex(),
        ACC=_acc_dtype(m.dtype),
        BLOCK=block,
        enable_fp_fusion=FP_FUSION,
    )
    return du, df, dinit
