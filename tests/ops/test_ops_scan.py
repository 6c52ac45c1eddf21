"""linear_scan (drmlab.ops.linear_scan) against its sequential reference loop in float64, on
every backend; the backend table; the C kernel's loader (drmlab.ops.ckernels)."""

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drmlab.ops import backend_for, c_kernel_available, c_kernel_status, ckernels, linear_scan, threads
from drmlab.ops.backends import BackendUnavailable
from drmlab.ops.linear_scan import BACKENDS as SCAN_BACKENDS
from drmlab.ops.linear_scan import c as scan_c
from drmlab.ops.linear_scan import linear_scan_reference, log_depth

BACKENDS = ["c", "torch"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "c":
        request.getfixturevalue("c_kernel")  # tests/conftest.py
    return request.param


def loop64(f, u, init=None):
    """The reference loop (linear_scan_reference) in float64 / complex128."""
    cdt = (
        torch.complex128
        if (f.is_complex() or u.is_complex() or (init is not None and init.is_complex()))
        else torch.float64
    )
    return linear_scan_reference(f.to(cdt), u.to(cdt), None if init is None else init.to(cdt))


def test_every_backend_is_tested():
    # a backend added to the dispatcher's table must join the parametrised tests below
    # ("triton" is tested under Triton's interpreter in tests/ops/test_ops_triton.py)
    assert set(SCAN_BACKENDS.names) == set(BACKENDS) | {"triton"}


def test_reference_is_the_recurrence():
    f = torch.tensor([[[0.5], [2.0], [0.0]]], dtype=torch.float64)
    u = torch.tensor([[[1.0], [3.0], [4.0]]], dtype=torch.float64)
    init = torch.tensor([[8.0]], dtype=torch.float64)
    # m0 = 0.5 * 8 + 1 = 5, m1 = 2 * 5 + 3 = 13, m2 = 0 * 13 + 4 = 4
    assert linear_scan_reference(f, u, init).flatten().tolist() == [5.0, 13.0, 4.0]
    assert linear_scan_reference(f, u).flatten().tolist() == [1.0, 5.0, 4.0]


def rand_inputs(B, T, D, dtype=torch.float64, seed=0, complex_=False):
    g = torch.Generator().manual_seed(seed)
    if complex_:
        mag = torch.rand(B, T, D, generator=g, dtype=torch.float64)
        ph = 2 * torch.pi * torch.rand(B, T, D, generator=g, dtype=torch.float64)
        f = torch.polar(mag, ph).to(dtype)
        u = torch.randn(B, T, D, generator=g, dtype=torch.complex128).to(dtype)
        init = torch.randn(B, D, generator=g, dtype=torch.complex128).to(dtype)
    else:
        f = torch.sigmoid(2 * torch.randn(B, T, D, generator=g, dtype=torch.float64)).to(dtype)
        u = torch.randn(B, T, D, generator=g, dtype=torch.float64).to(dtype)
        init = torch.randn(B, D, generator=g, dtype=torch.float64).to(dtype)
    return f, u, init


def grads(fn, f, u, init, dm):
    leaves = [x.detach().clone().requires_grad_() for x in (f, u)]
    i = None if init is None else init.detach().clone().requires_grad_()
    out = fn(leaves[0], leaves[1], i)
    wrt = leaves + ([i] if i is not None else [])
    return out, torch.autograd.grad(out, wrt, dm.to(out.dtype))


def check_against_loop(f, u, init, backend, tol=1e-12):
    dm = torch.randn(
        torch.broadcast_shapes(f.shape, u.shape), dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    if f.is_complex() or u.is_complex():
        dm = torch.complex(dm, dm.flip(-1))
    out, g = grads(lambda a, b, c: linear_scan(a, b, c, backend=backend), f, u, init, dm)
    ref, gr = grads(loop64, f, u, init, dm)
    assert out.shape == ref.shape
    assert torch.isfinite(torch.view_as_real(out) if out.is_complex() else out).all()
    assert (out.to(ref.dtype) - ref).abs().max().item() <= tol
    for a, b in zip(g, gr):
        assert a.shape == b.shape
        assert (a.to(b.dtype) - b).abs().max().item() <= tol
    return out, g


@pytest.mark.parametrize("with_init", [False, True])
def test_random_real(backend, with_init):
    f, u, init = rand_inputs(3, 37, 19)
    check_against_loop(f, u, init if with_init else None, backend)


@pytest.mark.parametrize("with_init", [False, True])
def test_complex_gates(backend, with_init):
    f, u, init = rand_inputs(2, 41, 9, dtype=torch.complex128, complex_=True)
    check_against_loop(f, u, init if with_init else None, backend)


def test_real_gates_complex_inputs(backend):
    f, _, _ = rand_inputs(2, 13, 5)
    _, u, init = rand_inputs(2, 13, 5, dtype=torch.complex128, complex_=True)
    out, (df, du, dinit) = check_against_loop(f, u, init, backend)
    assert out.dtype == torch.complex128
    assert df.dtype == torch.float64 and du.dtype == torch.complex128


def test_zero_gates_cut_the_past_exactly(backend):
    f, u, init = rand_inputs(2, 30, 8)
    f = f.clone()
    f[:, 10] = 0.0
    f[1, 20, 3] = 0.0
    init = init * 1e30  # a huge past must not leak through a zero gate
    check_against_loop(f, u, init, backend, tol=1e-12 * 1e30)
    fr = f.clone().requires_grad_()
    ur = u.clone().requires_grad_()
    ir = init.clone().requires_grad_()
    out = linear_scan(fr, ur, ir, backend=backend)
    assert torch.equal(out[:, 10], u[:, 10])
    assert out[1, 20, 3].item() == u[1, 20, 3].item()
    # after the cut, the outputs do not depend on anything before it
    (out[:, 10:].sum()).backward()
    assert torch.count_nonzero(ur.grad[:, :10]) == 0
    assert torch.count_nonzero(ir.grad) == 0
    assert torch.count_nonzero(fr.grad[:, :10]) == 0


def test_unit_gates_give_cumsum(backend):
    _, u, init = rand_inputs(2, 50, 6)
    f = torch.ones_like(u)
    out, _ = check_against_loop(f, u, init, backend)
    ref = init.unsqueeze(1) + torch.cumsum(u, 1)
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_init", [False, True])
def test_single_step(backend, with_init):
    f, u, init = rand_inputs(3, 1, 4)
    check_against_loop(f, u, init if with_init else None, backend)


def test_long_sequence_no_overflow(backend):
    # gates close to 1 and exact zeros over T = 4096: a cumulative product would underflow to
    # 0 (and dividing by it overflow); the direct recurrence stays finite and exact.
    g = torch.Generator().manual_seed(3)
    B, T, D = 2, 4096, 3
    f = 0.9 + 0.1 * torch.rand(B, T, D, generator=g, dtype=torch.float64)
    f[:, ::997] = 0.0
    f[0, :, 0] = 1e-3  # cumulative product ~ 1e-12288
    u = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    init = torch.randn(B, D, generator=g, dtype=torch.float64)
    out, _ = check_against_loop(f, u, init, backend, tol=1e-11)
    out32 = linear_scan(f.float(), u.float(), init.float(), backend=backend)
    assert torch.isfinite(out32).all()
    assert torch.allclose(out32.double(), out, rtol=1e-4, atol=1e-4)


def test_broadcast_gates(backend):
    f, u, init = rand_inputs(3, 17, 6)
    f1 = f[..., :1].contiguous()  # [B, T, 1]
    _, (df, du, dinit) = check_against_loop(f1, u, init, backend)
    assert df.shape == (3, 17, 1)
    fshared = f[:1]  # [1, T, D]
    _, (df, _, _) = check_against_loop(fshared, u, init, backend)
    assert df.shape == (1, 17, 6)
    # init broadcast from [D]
    _, (_, _, dinit) = check_against_loop(f, u, init[0], backend)
    assert dinit.shape == (6,)


def test_non_contiguous_and_conj_views(backend):
    f, u, init = rand_inputs(4, 12, 6, dtype=torch.complex128, complex_=True)
    fv = f.transpose(0, 2).contiguous().transpose(0, 2)  # non-contiguous
    assert not fv.is_contiguous()
    out = linear_scan(fv.conj()[:, :, ::2], u[:, :, ::2], init[:, ::2].conj(), backend=backend)
    ref = loop64(f.conj().resolve_conj()[:, :, ::2], u[:, :, ::2], init[:, ::2].conj().resolve_conj())
    assert (out - ref).abs().max().item() <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("with_init", [False, True])
def test_gradcheck(backend, dtype, with_init):
    f, u, init = rand_inputs(2, 6, 3, dtype=dtype, complex_=dtype.is_complex)
    args = [f.requires_grad_(), u.requires_grad_()]
    if with_init:
        args.append(init.requires_grad_())
    fn = lambda *a: linear_scan(*a, backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args)
    if with_init:  # double backward (create_graph=True) goes through the same scan
        assert torch.autograd.gradgradcheck(fn, args)


def test_bfloat16_and_float32(backend):
    f, u, init = rand_inputs(2, 64, 8)
    ref = loop64(f, u, init)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.1)):
        fl = f.to(dtype).requires_grad_()
        ul = u.to(dtype).requires_grad_()
        out = linear_scan(fl, ul, init.to(dtype), backend=backend)
        assert out.dtype == dtype
        assert (out.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())
        out.float().sum().backward()
        assert fl.grad.dtype == dtype and torch.isfinite(fl.grad.float()).all()
        assert ul.grad.dtype == dtype


def test_complex64(backend):
    f, u, init = rand_inputs(2, 64, 8, dtype=torch.complex128, complex_=True)
    out = linear_scan(f.to(torch.complex64), u.to(torch.complex64), init.to(torch.complex64), backend=backend)
    assert out.dtype == torch.complex64
    assert (out.to(torch.complex128) - loop64(f, u, init)).abs().max().item() < 1e-4


def test_empty_time_axis(backend):
    f = torch.rand(2, 0, 3, requires_grad=True)
    u = torch.rand(2, 0, 3, requires_grad=True)
    init = torch.rand(2, 3, requires_grad=True)
    out = linear_scan(f, u, init, backend=backend)
    assert out.shape == (2, 0, 3)
    out.sum().backward()
    assert torch.count_nonzero(init.grad) == 0
    (gi,) = torch.autograd.grad(linear_scan(f, u, init, backend=backend).sum(), init, create_graph=True)
    assert gi.shape == init.shape and torch.count_nonzero(gi) == 0


def test_backends_agree_float32(c_kernel):
    f, u, init = rand_inputs(4, 200, 40, dtype=torch.float32)
    a = linear_scan(f, u, init, backend="c")
    b = linear_scan(f, u, init, backend="torch")
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the "torch" backend:
# a log-depth scan (drmlab.ops.linear_scan.log_depth)


def count_dispatched_ops(fn) -> int:
    """How many aten operations ``fn()`` sends through the dispatcher (views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return Counter.calls


def log_depth_fwd_bwd(T):
    """One forward + backward of the "torch" backend's scan at [1, T, 2] with init, called
    directly: through linear_scan the backend runs inside one custom operator, whose inner
    operations a dispatch mode does not see."""
    f, u, init = rand_inputs(1, T, 2)

    def run():
        m = log_depth.forward(f, u, init)
        log_depth.backward(f, m, init, torch.ones_like(m), True, True)

    return run


def test_torch_backend_dispatches_log_many_ops():
    # the pure-torch backend composes steps pairwise over ceil(log2 T) levels: its forward +
    # backward dispatches a fixed number of operations per level, not per step (the loop it
    # replaced dispatched 537 kernels at T = 256 and 8,217 at T = 4,096)
    short, long = (count_dispatched_ops(log_depth_fwd_bwd(T)) for T in (256, 4096))
    assert long <= 3 * short, (short, long)
    # log depth: each doubling of T adds the same few operations, one level more each way (an
    # addcmul_ up, a mul for the coarser links, an addcmul_ down, and their strided views)
    per_level = [
        count_dispatched_ops(log_depth_fwd_bwd(2 * T)) - count_dispatched_ops(log_depth_fwd_bwd(T))
        for T in (1024, 2048)
    ]
    assert per_level[0] == per_level[1] <= 24, per_level


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_torch_backend_every_length(dtype):
    # every pairing pattern of the odd-even scan -- odd and even lengths at each of the first
    # levels, and 2^k - 1, 2^k, 2^k + 1 -- forward and reverse (the backward), with exact zero
    # gates and gates broadcast over batch or channels, against the float64 loop
    complex_ = dtype.is_complex
    for T in [*range(1, 67), 127, 128, 129, 255, 257]:
        f, u, init = rand_inputs(2, T, 3, dtype=dtype, seed=T, complex_=complex_)
        f = f.clone()
        f[0, T // 3] = 0.0
        gates = f if T % 3 else (f[:1] if T % 2 else f[..., :1])
        kept = [x.clone() for x in (gates, u, init)]
        check_against_loop(gates, u, init, "torch")
        check_against_loop(gates, u, None, "torch")
        for x, before in zip((gates, u, init), kept):  # the gates are read as views, never written
            assert torch.equal(x, before)


def test_torch_backend_keeps_only_gates_states_and_init():
    # memory: the backward needs f, m and init -- nothing per level of the scan is kept
    f, u, init = (x.requires_grad_() for x in rand_inputs(2, 1000, 3))
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = linear_scan(f, u, init, backend="torch")
    assert sorted(saved) == sorted(x.untyped_storage().data_ptr() for x in (f, out, init))
    assert sum(saved.values()) == sum(x.untyped_storage().nbytes() for x in (f, out, init))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_threaded_split_matches(backend, n_threads, monkeypatch):
    # the C path splits the work between threads: over B when B >= threads, else over blocks of
    # 16 channels (with a ragged last block)
    monkeypatch.setattr(scan_c, "PARALLEL_MIN_NUMEL", 0)
    monkeypatch.setattr(threads, "thread_count", lambda: n_threads)
    for B, D in ((5, 7), (2, 50), (1, 37), (1, 5)):
        f, u, init = rand_inputs(B, 9, D)
        check_against_loop(f, u, init, backend)
        fc, uc, ic = rand_inputs(B, 9, D, dtype=torch.complex128, complex_=True)
        check_against_loop(fc, uc, ic, backend)


def test_env_var_forces_fallback(monkeypatch):
    x = torch.zeros(1, 2, 3)
    monkeypatch.setenv("DRMLAB_NO_CKERNEL", "1")
    assert backend_for(x) == "torch"
    assert not c_kernel_available()
    f, u, init = rand_inputs(2, 9, 4)
    check_against_loop(f, u, init, None)
    monkeypatch.delenv("DRMLAB_NO_CKERNEL")
    if c_kernel_status()["linear_scan"]["available"]:
        assert backend_for(x) == "c"
        assert backend_for(x.to(torch.bfloat16)) == "c"  # computed in float32
    assert backend_for(x.to(torch.int64)) in ("c", "torch")


def _fresh_kernel_without_compiler(monkeypatch):
    """Put a not-yet-loaded linear-scan kernel in place of the real one, on a machine that has
    no C compiler; the real kernel stays loaded for the other tests."""
    monkeypatch.delenv(ckernels.DISABLE_ENV, raising=False)
    monkeypatch.setattr(ckernels, "find_compiler", lambda: None)
    fresh = ckernels.CKernel("linear_scan", scan_c.SOURCE, scan_c.prepare)
    monkeypatch.setattr(scan_c, "KERNEL", fresh)
    return fresh


def test_no_compiler_falls_back(monkeypatch):
    # without DRMLAB_REQUIRE_CKERNEL the pure-torch path runs, and the reason is kept
    monkeypatch.delenv(ckernels.REQUIRE_ENV, raising=False)
    kernel = _fresh_kernel_without_compiler(monkeypatch)
    assert not kernel.available()
    status = kernel.status()
    assert not status["available"] and "compiler" in status["error"]
    assert backend_for(torch.zeros(1, 1, 1)) == "torch"
    f, u, init = rand_inputs(2, 9, 4)
    check_against_loop(f, u, init, None)
    with pytest.raises(BackendUnavailable, match="compiler.*available here: 'torch'"):
        linear_scan(f, u, init, backend="c")


def test_required_kernel_raises_instead_of_falling_back(monkeypatch):
    # DRMLAB_REQUIRE_CKERNEL=1: the same missing compiler is an error at the first use, from
    # the loader (so no caller can quietly take the torch path); the status still reports it
    monkeypatch.setenv(ckernels.REQUIRE_ENV, "1")
    kernel = _fresh_kernel_without_compiler(monkeypatch)
    with pytest.raises(ckernels.CKernelUnavailable, match="compiler"):
        kernel.available()
    with pytest.raises(ckernels.CKernelUnavailable):
        linear_scan(*rand_inputs(2, 9, 4))
    assert "compiler" in kernel.status()["error"]
    # DRMLAB_NO_CKERNEL wins: a kernel switched off on purpose is not an error
    monkeypatch.setenv(ckernels.DISABLE_ENV, "1")
    assert backend_for(torch.zeros(1, 1, 1)) == "torch"


def test_require_env_var_end_to_end(tmp_path):
    """A fresh process whose compiler always fails (CC=false), with an empty kernel cache: the
    kernel cannot be built. Without DRMLAB_REQUIRE_CKERNEL linear_scan falls back to torch; with
    it, the same call raises CKernelUnavailable."""
    script = (
        "import torch\n"
        "from drmlab.ops import backend_for, c_kernel_status, linear_scan\n"
        "x = torch.ones(1, 3, 2)\n"
        "linear_scan(x, x)\n"
        "print(backend_for(x), c_kernel_status()['linear_scan']['error'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (ckernels.REQUIRE_ENV, ckernels.DISABLE_ENV)}
    env.update(CC="false", DRMLAB_CACHE_DIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path))

    def run(extra):
        return subprocess.run(
            [sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=300
        )

    lenient = run({})
    assert lenient.returncode == 0, lenient.stderr
    assert lenient.stdout.startswith("torch ") and "false failed" in lenient.stdout
    strict = run({ckernels.REQUIRE_ENV: "1"})
    assert strict.returncode != 0
    assert "CKernelUnavailable" in strict.stderr and "DRMLAB_REQUIRE_CKERNEL" in strict.stderr


def test_backend_table_names_the_backends_that_can_run():
    f, u, init = rand_inputs(2, 5, 3)
    with pytest.raises(ValueError, match="unknown backend 'nope'.*'c'.*'torch'"):
        linear_scan(f, u, init, backend="nope")
    meta = torch.zeros(2, 5, 3, device="meta")
    assert backend_for(meta) == "torch"
    with pytest.raises(BackendUnavailable, match="'c' is not available on meta.*CPU.*available here: 'torch'"):
        linear_scan(meta, meta, backend="c")


def test_concurrent_builds_are_atomic(tmp_path, c_kernel):
    """Two builds of the same kernel into one cache path at once (as two test processes would
    do): each compiles to a temporary name and os.replace()s it, so the result is one complete
    shared object and no temporary leftovers."""
    import ctypes
    import threading

    cc = ckernels.find_compiler()
    dest = tmp_path / "cache" / "drm_linear_scan_test.so"
    errors = []

    def build():
        try:
            ckernels.compile_shared_object(cc, scan_c.SOURCE, dest)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    builders = [threading.Thread(target=build) for _ in range(2)]
    for t in builders:
        t.start()
    for t in builders:
        t.join()
    assert not errors
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]
    lib = ctypes.CDLL(str(dest))
    scan_c.prepare(lib)  # binds, checks the ABI version, runs the self-test against torch
    assert lib.drm_scan_abi_version() == scan_c.ABI_VERSION


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_uses_torch_path():
    f, u, init = rand_inputs(2, 33, 5)
    fc, uc, ic = (x.cuda() for x in (f, u, init))
    # "auto" on CUDA: the Triton kernels when triton imports (tests/ops/test_ops_triton.py), else torch
    assert backend_for(uc) == ("triton" if importlib.util.find_spec("triton") else "torch")
    out = linear_scan(fc, uc, ic)
    assert (out.cpu() - loop64(f, u, init)).abs().max().item() <= 1e-12


PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


def _plant(tmp_path, directory, name):
    """A shared library named like the kernel's build, whose constructor writes a marker file."""
    cc = ckernels.find_compiler()
    if cc is None:
        pytest.skip("no C compiler to build the planted library")
    marker = tmp_path / "planted-ran"
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_C)
    subprocess.run(
        [cc, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(directory / name), str(source)],
        check=True,
        capture_output=True,
    )
    return marker


def _kernel_in(monkeypatch, cache_dir, safe_dir):
    """A fresh linear-scan kernel whose cache directories are ``cache_dir`` then ``safe_dir``."""
    monkeypatch.setattr(ckernels, "cache_dirs", lambda: [cache_dir, safe_dir])
    fresh = ckernels.CKernel("linear_scan", scan_c.SOURCE, scan_c.prepare)
    monkeypatch.setattr(scan_c, "KERNEL", fresh)
    return fresh


@pytest.mark.parametrize("how", ["writable by others", "another user's", "a symbolic link"])
def test_a_library_planted_in_an_unsafe_cache_is_never_loaded(tmp_path, monkeypatch, c_kernel, how):
    shared, safe = tmp_path / "shared", tmp_path / "safe"
    shared.mkdir()
    name = ckernels._shared_object_name("linear_scan", ckernels.find_compiler(), scan_c.SOURCE)
    marker = _plant(tmp_path, shared, name)
    cache = shared
    if how == "writable by others":
        shared.chmod(0o777)
    elif how == "another user's":
        if os.getuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(shared, 65534, 65534)  # nobody's, as a directory another user made first would be
    else:
        cache = tmp_path / "link"
        cache.symlink_to(shared, target_is_directory=True)
    kernel = _kernel_in(monkeypatch, cache, safe)
    status = kernel.status()
    assert not marker.exists(), "the planted library was executed"
    assert status["available"], status["error"]
    assert Path(status["path"]).parent != shared.resolve()


def test_a_private_cache_is_used_and_an_unsafe_shared_object_in_it_is_refused(tmp_path, monkeypatch, c_kernel):
    cache = tmp_path / "cache"
    kernel = _kernel_in(monkeypatch, cache, tmp_path / "unused")
    assert kernel.available() and Path(kernel.status()["path"]).parent == cache
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # created private
    # the same build made writable by others is refused at the next load, in one line naming it
    built = Path(kernel.status()["path"])
    built.chmod(0o666)
    again = _kernel_in(monkeypatch, cache, tmp_path / "other")
    assert again.available()
    assert Path(again.status()["path"]).parent == tmp_path / "other"
    assert ckernels.unsafe_reason(built) == "is writable by others (mode 666)"
