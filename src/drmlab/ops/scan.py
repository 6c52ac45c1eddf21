r"""First-order linear scan: the selective-memory recurrence of math.md section 9.

    m_t = f_t \odot m_{t-1} + u_t,        t = 0 .. T-1,   m_{-1} = init (zeros when None),

along dim 1 of ``[B, T, D]`` tensors, real or complex.  It is the one scan shared by the DRM
memory, the SSM control, the selective-SSM mixer and the resolvent path-product corner.

Exactness: the forward is the plain sequential recurrence (the composition of the affine maps
``(f_2, u_2) o (f_1, u_1) = (f_2 f_1, u_2 + f_2 u_1)`` applied left to right).  Nothing is divided
by a cumulative product of gates and no logarithm of a gate is taken, so a zero gate cuts the past
exactly and long sequences cannot overflow.  The backward is itself a reverse scan

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   g_{T-1} = dm_{T-1},
    du_t = g_t,   df_t = g_t conj(m_{t-1}),   dinit = conj(f_0) g_0,

which is torch's convention for complex gradients (the gradient of y = f m with respect to m is
grad_y conj(f)).

Backends:

* ``"c"``: a small C99 kernel (``csrc/scan.c``, no torch headers) compiled on first use with the
  system C compiler into a per-user cache directory and loaded with ctypes.  It runs on
  contiguous CPU buffers of float32, float64, complex64 and complex128, and the work is split
  over ``torch.get_num_threads()`` threads (ctypes releases the GIL).
* ``"torch"``: a pure-torch loop over time for the forward plus the same reverse scan for the
  backward.  Used on non-CPU devices, when no compiler exists or the build fails, or when the
  environment variable ``DRMLAB_NO_CKERNEL=1`` is set.

``backend_for(tensor)`` says which one ``linear_scan`` would use; ``c_kernel_available()``
whether the C kernel is built and enabled; ``c_kernel_status()`` gives the details (cache path,
build error).  The cache directory is ``$DRMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmlab``,
else ``~/.cache/drmlab`` (falling back to ``<tmpdir>/drmlab-<uid>`` when that is not
writable); the shared object is keyed by a hash of the source, the compiler and its flags,
and written atomically (compile to a temporary name, then ``os.replace``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import torch

__all__ = [
    "linear_scan",
    "backend_for",
    "c_kernel_available",
    "c_kernel_status",
    "linear_scan_reference",
]

_DISABLE_ENV = "DRMLAB_NO_CKERNEL"
_CACHE_ENV = "DRMLAB_CACHE_DIR"
_CSRC = Path(__file__).resolve().parent / "csrc"
# one shared object built from every kernel source (drmlab.ops.selective binds its own symbols)
_SOURCES = (_CSRC / "scan.c", _CSRC / "selective_scan.c")
_CFLAGS = ["-O3", "-std=c99", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
_LDLIBS = ["-lm"]
_ABI_VERSION = 2

# Below this many elements per call the work is not split between threads.
_PARALLEL_MIN_NUMEL = 1 << 16

_C_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.complex64: "c64",
    torch.complex128: "c128",
}

_lock = threading.Lock()
_pool_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_tried = False
_lib_path: Optional[str] = None
_lib_error: Optional[str] = None
_pool: Optional[ThreadPoolExecutor] = None
_pool_size = 0


# ----------------------------------------------------------------------------------------------
# Building and loading the C kernel
# ----------------------------------------------------------------------------------------------


def _disabled_by_env() -> bool:
    return os.environ.get(_DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _find_compiler() -> Optional[str]:
    cc = os.environ.get("CC", "").strip()
    if cc:
        found = shutil.which(cc.split()[0])
        if found:
            return found
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _candidate_cache_dirs() -> list[Path]:
    dirs = []
    env = os.environ.get(_CACHE_ENV)
    if env:
        dirs.append(Path(env))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        dirs.append(Path(xdg) / "drmlab")
    try:
        dirs.append(Path.home() / ".cache" / "drmlab")
    except RuntimeError:  # no home directory
        pass
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    dirs.append(Path(tempfile.gettempdir()) / f"drmlab-{uid}")
    return dirs


class _CompileError(RuntimeError):
    """The compiler ran and failed (no point retrying in another cache directory)."""


def _compile(cc: str, sources, dest: Path) -> None:
    """Compile ``sources`` into ``dest`` atomically (temporary name in the same directory, then
    ``os.replace``), so concurrent processes never load a half-written file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.stem + ".", suffix=".tmp.so", dir=dest.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *_CFLAGS, "-o", tmp, *map(str, sources), *_LDLIBS],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise _CompileError(f"{cc} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    i = ctypes.c_longlong
    for suf in _C_DTYPES.values():
        fwd = getattr(lib, f"drm_scan_fwd_{suf}")
        fwd.restype = None
        fwd.argtypes = [p, p, p, p, i, i, i, i, i, i, i]
        bwd = getattr(lib, f"drm_scan_bwd_{suf}")
        bwd.restype = None
        bwd.argtypes = [p, p, p, p, p, p, p, i, i, i, i, i, i, i]
    lib.drm_scan_abi_version.restype = ctypes.c_int
    lib.drm_scan_abi_version.argtypes = []


def _self_test(lib: ctypes.CDLL) -> None:
    """A tiny run of every kernel against the pure-torch path (guards against a miscompile)."""
    global _lib
    gen = torch.Generator().manual_seed(0)
    old = _lib
    _lib = lib
    try:
        for dtype in _C_DTYPES:
            f = torch.randn(2, 5, 3, dtype=dtype, generator=gen)
            u = torch.randn(2, 5, 3, dtype=dtype, generator=gen)
            m0 = torch.randn(2, 3, dtype=dtype, generator=gen)
            dm = torch.randn(2, 5, 3, dtype=dtype, generator=gen)
            ref = _torch_scan_fwd(f, u, m0)
            got = _c_scan_fwd(f, u, m0)
            rdu, rdf, rdi = _torch_scan_bwd(f, ref, m0, dm, True, True)
            cdu, cdf, cdi = _c_scan_bwd(f, ref, m0, dm, True, True)
            tol = 1e-5 if dtype in (torch.float32, torch.complex64) else 1e-12
            for a, b in ((ref, got), (rdu, cdu), (rdf, cdf), (rdi, cdi)):
                if not torch.allclose(a, b, rtol=tol, atol=tol):
                    raise RuntimeError(f"C scan kernel self-test failed for {dtype}")
    finally:
        _lib = old


def _load_library() -> Optional[ctypes.CDLL]:
    """Build (if needed) and load the C kernel once per process; None when unavailable."""
    global _lib, _lib_tried, _lib_path, _lib_error
    if _lib_tried:
        return _lib
    with _lock:
        if _lib_tried:
            return _lib
        try:
            missing = [str(src) for src in _SOURCES if not src.is_file()]
            if missing:
                raise RuntimeError(f"kernel source missing: {', '.join(missing)}")
            cc = _find_compiler()
            if cc is None:
                raise RuntimeError("no C compiler found (set CC, or install gcc/clang)")
            try:
                version = subprocess.run(
                    [cc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, timeout=30,
                ).stdout
            except (OSError, subprocess.SubprocessError) as exc:
                raise RuntimeError(f"cannot run {cc}: {exc}") from exc
            key = hashlib.sha256()
            for src in _SOURCES:
                key.update(src.read_bytes())
            key.update(cc.encode())
            key.update(version.encode())
            key.update(" ".join(_CFLAGS + _LDLIBS).encode())
            key.update(f"{platform.machine()}|{sys.platform}|{_ABI_VERSION}".encode())
            name = f"drm_scan_{key.hexdigest()[:20]}.so"
            errors = []
            lib = None
            for cache_dir in _candidate_cache_dirs():
                path = cache_dir / name
                try:
                    if not path.is_file():
                        _compile(cc, _SOURCES, path)
                    lib = ctypes.CDLL(str(path))
                    _lib_path = str(path)
                    break
                except _CompileError as exc:
                    errors.append(str(exc))
                    break
                except (OSError, subprocess.SubprocessError) as exc:
                    # unwritable directory, unloadable file: try the next cache directory
                    errors.append(f"{path}: {exc}")
            if lib is None:
                raise RuntimeError("; ".join(errors) or "no usable cache directory")
            _bind(lib)
            if lib.drm_scan_abi_version() != _ABI_VERSION:
                raise RuntimeError("C scan kernel ABI version mismatch")
            _self_test(lib)
            _lib = lib
            _lib_error = None
        except Exception as exc:  # any failure means: use the pure-torch path
            _lib = None
            _lib_path = None
            _lib_error = f"{type(exc).__name__}: {exc}"
        _lib_tried = True
    return _lib


def c_kernel_available() -> bool:
    """True when the compiled C kernel is loaded and not disabled by ``DRMLAB_NO_CKERNEL``.
    The first call builds it (about a second) unless the cached build exists."""
    if _disabled_by_env():
        return False
    return _load_library() is not None


def c_kernel_status() -> dict:
    """Diagnostics: whether the kernel is enabled, the path of the shared object, the build
    error when it could not be built or loaded."""
    disabled = _disabled_by_env()
    lib = None if disabled else _load_library()
    return {
        "available": lib is not None,
        "disabled_by_env": disabled,
        "path": _lib_path,
        "error": _lib_error,
        "source": ", ".join(map(str, _SOURCES)),
    }


def _compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    dt = dtypes[0]
    for other in dtypes[1:]:
        dt = torch.promote_types(dt, other)
    if dt.is_complex:
        return torch.complex128 if dt == torch.complex128 else torch.complex64
    if not dt.is_floating_point:
        dt = torch.get_default_dtype()
    return torch.float64 if dt == torch.float64 else torch.float32


def backend_for(tensor: torch.Tensor, dtype: Optional[torch.dtype] = None) -> str:
    """The backend ``linear_scan`` uses for inputs like ``tensor``: ``"c"`` or ``"torch"``."""
    cdt = _compute_dtype(dtype if dtype is not None else tensor.dtype)
    if tensor.device.type != "cpu" or cdt not in _C_DTYPES:
        return "torch"
    return "c" if c_kernel_available() else "torch"


# ----------------------------------------------------------------------------------------------
# Kernels: C (ctypes) and pure torch.  All take contiguous [B, T, D] tensors of one dtype.
# ----------------------------------------------------------------------------------------------


def _prep(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if x is None:
        return None
    if x.is_complex():
        x = x.resolve_conj()
    return x.resolve_neg().contiguous()


def _ptr(x: Optional[torch.Tensor]) -> Optional[int]:
    return None if x is None else x.data_ptr()


def _forget_pool_after_fork() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the pool object but not its threads.
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="drmlab-scan")
            _pool_size = n
        return _pool


def _num_threads() -> int:
    return torch.get_num_threads()


def _run_split(fn, args, B: int, T: int, D: int) -> None:
    """Call ``fn(*args, B, T, D, b0, b1, d0, d1)`` over disjoint pieces on several threads."""
    n = max(1, _num_threads())
    if n == 1 or B * T * D < _PARALLEL_MIN_NUMEL:
        fn(*args, B, T, D, 0, B, 0, D)
        return
    if B >= n:
        edges = [B * k // n for k in range(n + 1)]
        pieces = [(edges[k], edges[k + 1], 0, D) for k in range(n) if edges[k + 1] > edges[k]]
    else:
        # split the channels, in blocks of 16 elements (whole cache lines, full vectors)
        blocks = (D + 15) // 16
        n = min(n, blocks)
        edges = [min(D, 16 * (blocks * k // n)) for k in range(n + 1)]
        edges[-1] = D
        pieces = [(0, B, edges[k], edges[k + 1]) for k in range(n) if edges[k + 1] > edges[k]]
    if len(pieces) == 1:
        fn(*args, B, T, D, *pieces[0])
        return
    pool = _get_pool(len(pieces) - 1)
    futures = [pool.submit(fn, *args, B, T, D, *p) for p in pieces[1:]]
    fn(*args, B, T, D, *pieces[0])
    for fut in futures:
        fut.result()


def _c_scan_fwd(f, u, init):
    f, u, init = _prep(f), _prep(u), _prep(init)
    B, T, D = u.shape
    out = torch.empty((B, T, D), dtype=u.dtype)
    if out.numel() == 0:
        return out
    fn = getattr(_lib, f"drm_scan_fwd_{_C_DTYPES[u.dtype]}")
    _run_split(fn, (_ptr(f), _ptr(u), _ptr(init), _ptr(out)), B, T, D)
    return out


def _c_scan_bwd(f, m, init, dm, need_f: bool, need_init: bool):
    f, m, init, dm = _prep(f), _prep(m), _prep(init), _prep(dm)
    B, T, D = m.shape
    du = torch.empty_like(m)
    df = torch.empty_like(m) if need_f else None
    dinit = torch.empty((B, D), dtype=m.dtype) if (need_init and init is not None) else None
    if m.numel() == 0:
        if dinit is not None:
            dinit.zero_()
        return du, df, dinit
    fn = getattr(_lib, f"drm_scan_bwd_{_C_DTYPES[m.dtype]}")
    _run_split(fn, (_ptr(f), _ptr(m), _ptr(init), _ptr(dm), _ptr(du), _ptr(df), _ptr(dinit)),
               B, T, D)
    return du, df, dinit


def _torch_scan_fwd(f, u, init):
    """Sequential loop over time; every step is one fused multiply-add over [B, D]."""
    B, T, D = u.shape
    out = torch.empty((B, T, D), dtype=u.dtype, device=u.device)
    if T == 0:
        return out
    fs, us, outs = f.unbind(1), u.unbind(1), out.unbind(1)
    if init is None:
        outs[0].copy_(us[0])
    else:
        torch.addcmul(us[0], fs[0], init, out=outs[0])
    for t in range(1, T):
        torch.addcmul(us[t], fs[t], outs[t - 1], out=outs[t])
    return out


def _torch_scan_bwd(f, m, init, dm, need_f: bool, need_init: bool):
    """The reverse scan g_t = dm_t + conj(f_{t+1}) g_{t+1}, then df and dinit."""
    B, T, D = m.shape
    du = torch.empty_like(m)
    if T == 0:
        dinit = torch.zeros_like(init) if (need_init and init is not None) else None
        return du, (torch.empty_like(m) if need_f else None), dinit
    fc = f.conj() if f.is_complex() else f
    fs, gs, us = fc.unbind(1), dm.unbind(1), du.unbind(1)
    us[T - 1].copy_(gs[T - 1])
    for t in range(T - 2, -1, -1):
        torch.addcmul(gs[t], fs[t + 1], us[t + 1], out=us[t])
    df = None
    if need_f:
        mc = m.conj() if m.is_complex() else m
        df = torch.empty_like(m)
        torch.mul(du[:, 1:], mc[:, :-1], out=df[:, 1:])
        if init is None:
            df[:, 0].zero_()
        else:
            torch.mul(du[:, 0], init.conj() if init.is_complex() else init, out=df[:, 0])
    dinit = None
    if need_init and init is not None:
        dinit = fc[:, 0] * du[:, 0]
    return du, df, dinit


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


class _LinearScanFn(torch.autograd.Function):
    """Inputs: f, u of one shape [B, T, D] and one dtype; init [B, D] or None; backend name."""

    @staticmethod
    def forward(ctx, f, u, init, backend):
        if backend == "c":
            out = _c_scan_fwd(f, u, init)
        else:
            out = _torch_scan_fwd(f, u, init)
        ctx.backend = backend
        ctx.has_init = init is not None
        ctx.save_for_backward(f, out, init)
        return out

    @staticmethod
    def backward(ctx, dm):
        f, m, init = ctx.saved_tensors
        need_f, need_u, need_init = ctx.needs_input_grad[:3]
        need_init = need_init and ctx.has_init
        if torch.is_grad_enabled():
            # create_graph=True: build the gradient from differentiable pieces (double backward)
            du, df, dinit = _differentiable_bwd(f, m, init, dm, ctx.backend)
        elif ctx.backend == "c":
            du, df, dinit = _c_scan_bwd(f, m, init, dm, need_f, need_init)
        else:
            du, df, dinit = _torch_scan_bwd(f, m, init, dm, need_f, need_init)
        return (df if need_f else None, du if need_u else None,
                dinit if need_init else None, None)


def _differentiable_bwd(f, m, init, dm, backend):
    """The same reverse scan written with differentiable ops (used under create_graph=True)."""
    if m.shape[1] == 0:
        return torch.zeros_like(m), torch.zeros_like(m), (
            None if init is None else torch.zeros_like(init))
    fc = f.conj() if f.is_complex() else f
    fnext = torch.cat([fc[:, 1:], torch.zeros_like(fc[:, :1])], dim=1)
    g = _LinearScanFn.apply(fnext.flip(1), dm.flip(1), None, backend).flip(1)
    mc = m.conj() if m.is_complex() else m
    if init is None:
        prev = torch.cat([torch.zeros_like(mc[:, :1]), mc[:, :-1]], dim=1)
    else:
        ic = init.conj() if init.is_complex() else init
        prev = torch.cat([ic.unsqueeze(1), mc[:, :-1]], dim=1)
    df = g * prev
    dinit = fc[:, 0] * g[:, 0] if init is not None else None
    return g, df, dinit


# ----------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------


def _compiler_disable(fn):
    # The scan is opaque to torch.compile (ctypes kernel, or a loop over T steps that should not
    # be unrolled into a graph): compiled callers get a graph break around it.
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


@_compiler_disable
def linear_scan(
    f: torch.Tensor,
    u: torch.Tensor,
    init: Optional[torch.Tensor] = None,
    *,
    backend: Optional[str] = None,
) -> torch.Tensor:
    r"""m_t = f_t * m_{t-1} + u_t along dim 1 (time) of ``[B, T, D]`` tensors.

    Args:
        f: gates, ``[B, T, D]`` or broadcastable to u's shape (e.g. ``[B, T, 1]``).
        u: inputs, ``[B, T, D]`` (f and u are broadcast against each other).
        init: state before t = 0, ``[B, D]`` (or broadcastable to it); None means zeros.
        backend: None / ``"auto"`` (C kernel when available, else torch), ``"c"`` (raise if the
            kernel is unavailable) or ``"torch"``.

    Real (float32, float64; float16 / bfloat16 computed in float32) or complex (complex64,
    complex128) inputs; mixed dtypes are promoted and the result has the promoted dtype.
    Differentiable in f, u and init; the gradient of a real f with complex u is real.
    Returns the states m, ``[B, T, D]``.
    """
    try:
        shape = torch.broadcast_shapes(f.shape, u.shape)
    except RuntimeError as exc:
        raise ValueError(f"f {tuple(f.shape)} and u {tuple(u.shape)} do not broadcast") from exc
    if len(shape) != 3:
        raise ValueError(f"f {tuple(f.shape)} and u {tuple(u.shape)} do not broadcast to "
                         "a [B, T, D] shape")
    B, T, D = shape
    dtypes = [f.dtype, u.dtype] + ([init.dtype] if init is not None else [])
    out_dtype = dtypes[0]
    for dt in dtypes[1:]:
        out_dtype = torch.promote_types(out_dtype, dt)
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        out_dtype = torch.get_default_dtype()
    cdt = _compute_dtype(out_dtype)
    if f.device != u.device or (init is not None and init.device != u.device):
        raise ValueError("linear_scan: f, u and init must be on one device")

    if backend in (None, "auto"):
        backend = backend_for(u, cdt)
    elif backend == "c":
        if u.device.type != "cpu" or cdt not in _C_DTYPES:
            raise ValueError("the C scan kernel runs on CPU float32/64 and complex64/128 only")
        if not c_kernel_available():
            raise RuntimeError(f"C scan kernel unavailable: {c_kernel_status()['error'] or 'disabled'}")
    elif backend != "torch":
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'c' or 'torch'")

    fc = f.to(cdt).expand(shape)
    uc = u.to(cdt).expand(shape)
    if backend == "c":
        # The C kernel needs dense buffers; torch's own path reads broadcast views directly.
        fc, uc = fc.contiguous(), uc.contiguous()
    ic = None
    if init is not None:
        ic = init.to(cdt).expand(B, D)
        if backend == "c":
            ic = ic.contiguous()
    out = _LinearScanFn.apply(fc, uc, ic, backend)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def linear_scan_reference(f: torch.Tensor, u: torch.Tensor,
                          init: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The naive sequential loop (autograd through Python indexing); for tests and benchmarks."""
    shape = torch.broadcast_shapes(f.shape, u.shape)
    f, u = f.expand(shape), u.expand(shape)
    m = torch.zeros_like(u[:, 0]) if init is None else init.expand(shape[0], shape[2])
    outs = []
    for t in range(shape[1]):
        m = f[:, t] * m + u[:, t]
        outs.append(m)
    return torch.stack(outs, dim=1)
