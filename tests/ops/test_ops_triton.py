"""The Triton backends (backend "triton") of linear_scan and selective_scan
(drmlab/ops/linear_scan/triton.py, drmlab/ops/selective_scan/triton.py) against the float64
reference loops, forward and backward.

Without a GPU the kernels run in Triton's CPU interpreter, which is chosen when the kernels are
first built with TRITON_INTERPRET=1 in the environment.  So that no other test sees that
setting, every interpreted check runs in ONE child process (this file run as a script with
TRITON_INTERPRET=1): it runs the cases of :func:`run_cases` and prints, per case and quantity,
the largest error and the reference's scale; the tests below read that report and hold each
number to its tolerance here.  Shapes are tiny (the interpreter is slow) and the block sizes are
lowered (:func:`small_blocks`) so that D and E are not multiples of the block and T spans
several recompute segments.  With CUDA present, ``test_cases_on_cuda`` runs the same cases on
the compiled kernels; without it, that test is skipped and nothing here has run on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from drmlab.ops.backends import BackendUnavailable
from drmlab.ops.linear_scan import BACKENDS as SCAN_BACKENDS
from drmlab.ops.linear_scan import linear_scan, linear_scan_reference
from drmlab.ops.selective_scan import BACKENDS as SSCAN_BACKENDS
from drmlab.ops.selective_scan import selective_scan, selective_scan_reference

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not TRITON_INSTALLED, reason="triton is not installed (extra 'gpu')")

# tolerances on max |error| / max(1, max |reference|)
F64 = 1e-12
F32 = 2e-5
# bfloat16 outputs / gradients: one bfloat16 rounding (2^-9 relative) plus the float32 scan
BF16 = 2.0**-7


# --------------------------------------------------------------------------- the cases


def small_blocks() -> None:
    """Blocks of 4 channels and segments of 3 steps: D = 5 and E = 5 need two blocks (one
    partly masked), T = 7 needs three segments (the last one step long)."""
    from drmlab.ops.linear_scan import triton as scan_triton
    from drmlab.ops.selective_scan import triton as sscan_triton

    scan_triton.BLOCK_D = 4
    sscan_triton.BLOCK_E = 4
    sscan_triton.SEGMENT_STEPS = 3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _scan_inputs(B, T, D, complex_=False, seed=0):
    g = _gen(seed)
    if complex_:
        f = torch.polar(
            torch.rand(B, T, D, generator=g, dtype=torch.float64),
            2 * torch.pi * torch.rand(B, T, D, generator=g, dtype=torch.float64),
        )
        u, dm = (torch.randn(B, T, D, generator=g, dtype=torch.complex128) for _ in range(2))
        init = torch.randn(B, D, generator=g, dtype=torch.complex128)
    else:
        f = torch.sigmoid(2 * torch.randn(B, T, D, generator=g, dtype=torch.float64))
        u, dm = (torch.randn(B, T, D, generator=g, dtype=torch.float64) for _ in range(2))
        init = torch.randn(B, D, generator=g, dtype=torch.float64)
    return f, u, init, dm


def _errors(got, ref) -> list:
    """[max |got - ref|, max(1, max |ref|)] in float64 / complex128."""
    ref = ref.detach()
    wide = torch.complex128 if ref.is_complex() else torch.float64
    err = (got.detach().to(wide) - ref.to(wide)).abs().max().item() if ref.numel() else 0.0
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    return [err, scale]


def _scan_case(f, u, init, dm, device, dtype=None):
    """linear_scan(backend="triton") and its gradients against the reference loop in float64 /
    complex128 on the same (rounded) values; ``dtype`` casts the inputs first."""
    cast = (lambda t: t) if dtype is None else (lambda t: t if t is None else t.to(dtype))
    f, u, init = cast(f), cast(u), cast(init)
    leaves = [t.detach().to(device).requires_grad_() for t in (f, u) + (() if init is None else (init,))]
    out = linear_scan(*leaves[:2], leaves[2] if init is not None else None, backend="triton")
    grads = torch.autograd.grad(out, leaves, dm.to(device).to(out.dtype))
    wide = torch.complex128 if out.is_complex() else torch.float64
    refs = [
        t.detach().to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_()
        for t in (f, u) + (() if init is None else (init,))
    ]
    ref = linear_scan_reference(*refs[:2], refs[2] if init is not None else None)
    # the reference is weighted by the same (rounded) output gradient
    ref_grads = torch.autograd.grad(ref, refs, dm.to(out.dtype).to(wide))
    report = {"m": _errors(out.cpu(), ref)}
    for name, got, want in zip(("df", "du", "dinit"), grads, ref_grads):
        report[name] = _errors(got.cpu(), want)
    report["dtypes"] = [str(out.dtype)] + [str(g.dtype) for g in grads]
    return report


def _sscan_inputs(B, T, E, N, seed=0):
    g = _gen(seed)
    x = torch.randn(B, T, E, generator=g, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(B, T, E, generator=g, dtype=torch.float64))
    A = -2 * torch.rand(E, N, generator=g, dtype=torch.float64)
    Bm, Cm = (torch.randn(B, T, N, generator=g, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(B, E, N, generator=g, dtype=torch.float64)
    dy = torch.randn(B, T, E, generator=g, dtype=torch.float64)
    dh = torch.randn(B, E, N, generator=g, dtype=torch.float64)
    return [x, dt, A, Bm, Cm, h0], dy, dh


def _sscan_case(inputs, dy, dh, device, dtype=torch.float64):
    """selective_scan(backend="triton") and its gradients (dy on y, dh on the last state; either
    may be None) against the reference loop in float64 on the same (rounded) values."""
    inputs = [None if t is None else t.to(dtype) for t in inputs]
    leaves = [None if t is None else t.detach().to(device).requires_grad_() for t in inputs]
    y, h = selective_scan(*leaves, backend="triton")
    refs = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    y_ref, h_ref = selective_scan_reference(*refs)
    loss = sum((out * w.to(device).to(out.dtype)).sum() for out, w in ((y, dy), (h, dh)) if w is not None)
    loss_ref = sum((out * w.to(y.dtype).double()).sum() for out, w in ((y_ref, dy), (h_ref, dh)) if w is not None)
    wrt = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(loss, wrt)
    ref_grads = torch.autograd.grad(loss_ref, [t for t in refs if t is not None], materialize_grads=True)
    report = {"y": _errors(y.cpu(), y_ref), "h_last": _errors(h.cpu(), h_ref)}
    for name, got, want in zip(("dx", "ddt", "dA", "dB", "dC", "dh0"), grads, ref_grads):
        report[name] = _errors(got.cpu(), want)
    report["dtypes"] = [str(y.dtype)] + [str(g.dtype) for g in grads]
    return report


def run_cases(device: str = "cpu") -> dict:
    """Every check of the Triton kernels: {case: {quantity: [max error, scale], ...}}."""
    from drmlab.ops.linear_scan import backend_for
    from drmlab.ops.linear_scan import triton as scan_triton
    from drmlab.ops.selective_scan import selective_scan_backend
    from drmlab.ops.selective_scan import triton as sscan_triton

    small_blocks()
    cases = {}
    # ---- linear_scan: B = 2, T = 7, D = 5 (two blocks of 4 channels)
    f, u, init, dm = _scan_inputs(2, 7, 5)
    cases["scan_f64_init"] = _scan_case(f, u, init, dm, device)
    cases["scan_f64_no_init"] = _scan_case(f, u, None, dm, device)
    cases["scan_f32"] = _scan_case(f, u, init, dm, device, dtype=torch.float32)
    cases["scan_bf16"] = _scan_case(f, u, init, dm, device, dtype=torch.bfloat16)
    cases["scan_single_step"] = _scan_case(f[:, :1], u[:, :1], init, dm[:, :1], device)
    fc, uc, ic, dmc = _scan_inputs(2, 7, 5, complex_=True, seed=1)
    cases["scan_c128_init"] = _scan_case(fc, uc, ic, dmc, device)
    cases["scan_c128_no_init"] = _scan_case(fc, uc, None, dmc, device)
    cases["scan_c64"] = _scan_case(fc, uc, ic, dmc, device, dtype=torch.complex64)
    cases["scan_real_gates_complex_u"] = _scan_case(f, uc, ic, dmc, device)
    # broadcast gates [B, T, 1] (a stride-0 view inside), and strided / conjugated views
    cases["scan_broadcast_gates"] = _scan_case(f[..., :1].contiguous(), u, init, dm, device)
    cases["scan_batch_shared_gates"] = _scan_case(f[:1], u, init, dm, device)
    cases["scan_broadcast_complex_gates"] = _scan_case(fc[..., :1].contiguous(), uc, ic, dmc, device)
    strided = fc.transpose(0, 2).contiguous().transpose(0, 2)[:, :, ::2].conj()
    cases["scan_strided_conj"] = _scan_case(strided, uc[:, :, ::2], ic[:, ::2].conj(), dmc[:, :, ::2], device)
    # zero gates cut a huge past exactly: the states from the cut on equal a scan started there
    fz = f.clone()
    fz[:, 3] = 0.0
    fz[1, 5, 2] = 0.0
    cases["scan_zero_gates"] = _scan_case(fz, u, init * 1e30, dm, device)
    out = linear_scan(fz.to(device), u.to(device), (init * 1e30).to(device), backend="triton").cpu()
    fresh = linear_scan_reference(fz[:, 3:], u[:, 3:])
    cases["scan_zero_gates_exact_cut"] = {"m_after_cut": [(out[:, 3:] - fresh).abs().max().item(), 1.0]}
    # double backward (create_graph=True) runs the Triton scan inside the gradient
    leaves = [t.to(device).requires_grad_() for t in (f[:1, :4, :3], u[:1, :4, :3], init[:1, :3])]
    refs = [t.detach().cpu().requires_grad_() for t in leaves]
    gg = []
    for fn, args in ((lambda *a: linear_scan(*a, backend="triton"), leaves), (linear_scan_reference, refs)):
        first = torch.autograd.grad((fn(*args) ** 2).sum(), args, create_graph=True)
        gg.append(torch.autograd.grad(sum((g**2).sum() for g in first), args))
    cases["scan_double_backward"] = {f"dd{i}": _errors(a.cpu(), b) for i, (a, b) in enumerate(zip(*gg))}
    # the kernels on bfloat16 tensors directly: loaded as bfloat16, accumulated in float32
    fb, ub, ib, dmb = (t.to(torch.bfloat16).to(device) for t in (f, u, init, dm))
    with torch.no_grad():
        m = scan_triton.forward(fb, ub, ib)
        du, df, _ = scan_triton.backward(fb, m, ib, dmb, True, False)
    ref = linear_scan_reference(*(t.cpu().double() for t in (fb, ub, ib)))
    cases["scan_kernel_bf16_loads"] = {
        "m": _errors(m.cpu(), ref),
        "dtypes": [str(m.dtype), str(du.dtype), str(df.dtype)],
    }
    # empty inputs
    empty = linear_scan(torch.rand(2, 0, 5, device=device), torch.rand(2, 0, 5, device=device), backend="triton")
    cases["scan_empty"] = {"shape": list(empty.shape)}
    # ---- selective_scan: B = 2, T = 7, E = 5, N = 3 (two channel blocks, N padded to 4, three segments)
    inputs, dy, dh = _sscan_inputs(2, 7, 5, 3)
    cases["sscan_f64_h0"] = _sscan_case(inputs, dy, dh, device)
    cases["sscan_f64_no_h0"] = _sscan_case(inputs[:5] + [None], dy, dh, device)
    cases["sscan_f64_y_only"] = _sscan_case(inputs, dy, None, device)
    cases["sscan_f64_h_last_only"] = _sscan_case(inputs, None, dh, device)
    cases["sscan_f32"] = _sscan_case(inputs, dy, dh, device, dtype=torch.float32)
    cases["sscan_bf16"] = _sscan_case(inputs, dy, dh, device, dtype=torch.bfloat16)
    x, dt, A, Bm, Cm, h0 = inputs
    cases["sscan_single_step"] = _sscan_case([x[:, :1], dt[:, :1], A, Bm[:, :1], Cm[:, :1], h0], dy[:, :1], dh, device)
    # dt = 0 at some steps: the decay is exactly 1 and the drive 0 there
    zero_dt = [t.clone() for t in inputs]
    zero_dt[1][:, 2] = 0.0
    zero_dt[1][0, 4, 1] = 0.0
    cases["sscan_zero_dt"] = _sscan_case(zero_dt, dy, dh, device)
    # the automatic segment length (about sqrt(T): T = 10 -> 4, 4, 2)
    sscan_triton.SEGMENT_STEPS = 0
    inputs10, dy10, dh10 = _sscan_inputs(1, 10, 3, 2, seed=2)
    cases["sscan_auto_segments"] = _sscan_case(inputs10, dy10, dh10, device)
    cases["sscan_auto_segments"]["saved_shape"] = list(sscan_triton.saved_shape(1, 10, 3, 2))
    sscan_triton.SEGMENT_STEPS = 3
    # the kernel on bfloat16 tensors directly
    xb = [t.to(torch.bfloat16).to(device).contiguous() for t in inputs]
    with torch.no_grad():
        y, h, _ = sscan_triton.forward(*xb, False)
    y_ref, h_ref = selective_scan_reference(*(t.cpu().double() for t in xb))
    cases["sscan_kernel_bf16_loads"] = {
        "y": _errors(y.cpu(), y_ref),
        "h_last": _errors(h.cpu(), h_ref),
        "dtypes": [str(y.dtype)],
    }
    # what "auto" picks for these tensors (never Triton on the CPU, even interpreted)
    probe = torch.zeros(1, 2, 3, device=device)
    cases["auto"] = {
        "linear_scan": backend_for(probe),
        "selective_scan": selective_scan_backend(probe),
        "interpreting": scan_triton.interpreting(),
    }
    cases["self_check"] = _self_check_case(f, u, device)
    return cases


def _self_check_case(f, u, device: str) -> dict:
    """The first-use self-check (drmlab.ops.self_check) of the Triton backends in this run: every
    (operator, dtype) checked, with its verdict; then a Triton scan made wrong on purpose (its output
    off by 1e-3), asked for by name with no verdict kept, must be refused in one line."""
    from drmlab.ops import self_check
    from drmlab.ops.backends import BackendCheckFailed
    from drmlab.ops.linear_scan import triton as scan_triton

    checked = sorted(
        [r["operator"], r["dtype"], r["passed"]] for r in self_check.backend_checks() if r["backend"] == "triton"
    )
    forward, records = scan_triton.forward, self_check._RECORDS
    scan_triton.forward = lambda *a: forward(*a) * 1.001
    self_check._RECORDS = {}
    try:
        linear_scan(f.to(device), u.to(device), backend="triton")
        planted = "not caught"
    except BackendCheckFailed as exc:
        planted = str(exc)
    finally:
        scan_triton.forward, self_check._RECORDS = forward, records
    return {"checked": checked, "planted": planted}


def _check_case(case: dict, tol: float, *, dtypes=None) -> None:
    for quantity, value in case.items():
        if quantity == "dtypes":
            if dtypes is not None:
                assert value == dtypes
            continue
        err, scale = value
        assert err <= tol * scale, f"{quantity}: error {err:.3e} above {tol:.1e} x {scale:.3g}"


# --------------------------------------------------------------------------- the interpreted run


@pytest.fixture(scope="module")
def interpreted():
    """The report of :func:`run_cases` on CPU tensors under the interpreter (one child)."""
    if not TRITON_INSTALLED:
        pytest.skip("triton is not installed (extra 'gpu')")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


SCAN_CASES = {
    "scan_f64_init": (F64, ["torch.float64"] * 4),
    "scan_f64_no_init": (F64, ["torch.float64"] * 3),
    "scan_single_step": (F64, None),
    "scan_c128_init": (F64, ["torch.complex128"] * 4),
    "scan_c128_no_init": (F64, None),
    "scan_real_gates_complex_u": (F64, ["torch.complex128", "torch.float64", "torch.complex128", "torch.complex128"]),
    "scan_broadcast_gates": (F64, None),
    "scan_batch_shared_gates": (F64, None),
    "scan_broadcast_complex_gates": (F64, None),
    "scan_strided_conj": (F64, None),
    "scan_zero_gates": (F64, None),
    "scan_zero_gates_exact_cut": (0.0, None),
    "scan_double_backward": (1e-10, None),
    "scan_f32": (F32, ["torch.float32"] * 4),
    "scan_c64": (F32, ["torch.complex64"] * 4),
    "scan_bf16": (BF16, ["torch.bfloat16"] * 4),
    "scan_kernel_bf16_loads": (F32, ["torch.float32"] * 3),
    "sscan_f64_h0": (F64, ["torch.float64"] * 7),
    "sscan_f64_no_h0": (F64, ["torch.float64"] * 6),
    "sscan_f64_y_only": (F64, None),
    "sscan_f64_h_last_only": (F64, None),
    "sscan_single_step": (F64, None),
    "sscan_zero_dt": (F64, None),
    "sscan_auto_segments": (F64, None),
    "sscan_f32": (F32, ["torch.float32"] * 7),
    # outputs in float32 (the compute dtype); the gradients are rounded to bfloat16
    "sscan_bf16": (BF16, ["torch.float32"] + ["torch.bfloat16"] * 6),
    "sscan_kernel_bf16_loads": (F32, ["torch.float32"]),
}


@needs_triton
@pytest.mark.parametrize("case", sorted(SCAN_CASES))
def test_interpreted_kernels_match_the_float64_reference(interpreted, case):
    tol, dtypes = SCAN_CASES[case]
    report = dict(interpreted[case])
    report.pop("saved_shape", None)
    _check_case(report, tol, dtypes=dtypes)


@needs_triton
def test_interpreted_run_facts(interpreted):
    assert interpreted["auto"]["interpreting"] is True
    assert interpreted["auto"]["linear_scan"] != "triton"
    assert interpreted["auto"]["selective_scan"] != "triton"
    assert interpreted["scan_empty"] == {"shape": [2, 0, 5]}
    assert interpreted["sscan_auto_segments"]["saved_shape"] == [1, 3, 3, 2]  # segments 4, 4, 2
    # every case of the run is held to a tolerance above
    assert set(interpreted) - {"auto", "scan_empty", "self_check"} == set(SCAN_CASES)
    _check_self_check(interpreted["self_check"], "cpu")


def _check_self_check(report: dict, device: str) -> None:
    """Every Triton backend the run used passed its first-use check; the planted wrong one was caught."""
    assert report["checked"] == [
        ["linear_scan", dtype, True] for dtype in ("complex128", "complex64", "float32", "float64")
    ] + [["selective_scan", dtype, True] for dtype in ("float32", "float64")]
    assert report["planted"].startswith(
        f"linear_scan: backend 'triton' failed its first-use check on {device} float64 (max error 1.0e-03 > 1e-12)"
    )


# --------------------------------------------------------------------------- in this process


def test_triton_sits_in_both_tables_and_auto_takes_it_on_cuda_only(monkeypatch):
    for table in (SCAN_BACKENDS, SSCAN_BACKENDS):
        assert table.names == ("c", "triton", "torch")
        assert table.backends["triton"].auto_devices == ("cuda",)
        assert table.backends["triton"].self_check and table.backends["c"].self_check
        cpu_pick = table.choose(None, torch.device("cpu"), torch.float32).name
        assert cpu_pick in ("c", "torch")
        # the choice on CUDA is made from the table alone: no GPU is needed to check it (the first-use
        # check, which runs the kernels on the device, is switched off for it: test_self_check.py)
        monkeypatch.setenv("DRMLAB_NO_BACKEND_CHECK", "1")
        cuda_pick = table.choose(None, torch.device("cuda"), torch.float32).name
        assert cuda_pick == ("triton" if TRITON_INSTALLED else "torch")


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    from drmlab.ops.linear_scan import triton as scan_triton

    if scan_triton._STATE.get("interpreted"):  # kernels already built interpreted here
        pytest.fail("this test process must not run Triton interpreted (TRITON_INTERPRET is for the child)")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    why = "TRITON_INTERPRET=1" if TRITON_INSTALLED else "triton is not installed"
    f = torch.rand(1, 3, 2)
    with pytest.raises(BackendUnavailable, match=f"'triton' is not available on cpu.*{why}.*available here: .*'torch'"):
        linear_scan(f, f, backend="triton")
    x = torch.rand(1, 3, 2)
    A = -torch.rand(2, 4)
    Bm = torch.rand(1, 3, 4)
    with pytest.raises(BackendUnavailable, match=f"'triton' is not available on cpu.*{why}.*available here: .*'torch'"):
        selective_scan(x, x, A, Bm, Bm, backend="triton")
    meta = torch.empty(1, 3, 2, device="meta")
    reason = "CUDA tensors" if TRITON_INSTALLED else "triton is not installed"
    with pytest.raises(BackendUnavailable, match=f"'triton' is not available on meta.*{reason}"):
        linear_scan(meta, meta, backend="triton")
    with pytest.raises(BackendUnavailable, match="computes in float32 or float64 only"):
        SSCAN_BACKENDS.choose("triton", torch.device("cuda"), torch.complex64)


# every kernel variant the host code launches, per compute dtype (pointer type, accumulator)
COMPILE_VARIANTS = [
    ("linear_scan", "_forward_kernel", dict(HAS_INIT=True, COMPLEX=False, BLOCK=128)),
    ("linear_scan", "_forward_kernel", dict(HAS_INIT=False, COMPLEX=True, BLOCK=128)),
    ("linear_scan", "_backward_kernel", dict(HAS_INIT=True, NEED_F=True, NEED_INIT=False, COMPLEX=False, BLOCK=128)),
    ("linear_scan", "_backward_kernel", dict(HAS_INIT=True, NEED_F=True, NEED_INIT=True, COMPLEX=True, BLOCK=128)),
    ("selective_scan", "_forward_kernel", dict(HAS_H0=True, SAVE=True, BLOCK_E=64, BLOCK_N=16)),
    ("selective_scan", "_forward_kernel", dict(HAS_H0=False, SAVE=False, BLOCK_E=64, BLOCK_N=16)),
    ("selective_scan", "_backward_kernel", dict(HAS_DHLAST=True, HAS_H0=True, BLOCK_E=64, BLOCK_N=16)),
]


@needs_triton
def test_kernels_compile_for_nvidia_gpus(monkeypatch):
    """Triton's own compiler (bundled with the wheel, ptxas included) turns every kernel variant
    into PTX and a cubin for sm_90 (H100 / H200) in float32 and float64 and for sm_80 (A100) in
    float32 -- no GPU needed, so the compiled path's typing, constexpr branches and loops are
    checked on every CI run.  Whether the cubins then run correctly and fast is NOT checked here."""
    import inspect

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from drmlab.ops.linear_scan import triton as scan_triton
    from drmlab.ops.selective_scan import triton as sscan_triton

    modules = {"linear_scan": scan_triton, "selective_scan": sscan_triton}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # compiled JIT functions, not interpreted
    for module in modules.values():
        monkeypatch.setattr(module, "tl", tl)
    targets = [
        (GPUTarget("cuda", 90, 32), "*fp32", tl.float32),
        (GPUTarget("cuda", 90, 32), "*fp64", tl.float64),
        (GPUTarget("cuda", 80, 32), "*fp32", tl.float32),
    ]
    for target, pointer, acc in targets:
        for operator, name, flags in COMPILE_VARIANTS:
            plain = getattr(modules[operator], name)
            constexprs = dict(flags, ACC=acc)
            signature = {
                p: "constexpr" if p in constexprs else pointer if p.endswith("_ptr") else "i32"
                for p in inspect.signature(plain).parameters
            }
            source = triton.compiler.ASTSource(fn=triton.jit(plain), signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=target, options={"enable_fp_fusion": True})
            assert compiled.asm["cubin"], (operator, name, flags, target)
            assert f".target sm_{target.arch}" in compiled.asm["ptx"]


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the compiled kernels cannot run")
def test_cases_on_cuda(monkeypatch):
    """The interpreted cases again, compiled for the GPU (never run in this repository's CI)."""
    from drmlab.ops.linear_scan import triton as scan_triton
    from drmlab.ops.selective_scan import triton as sscan_triton

    for module, names in ((scan_triton, ("BLOCK_D",)), (sscan_triton, ("BLOCK_E", "SEGMENT_STEPS"))):
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    report = run_cases("cuda")
    for case, (tol, dtypes) in SCAN_CASES.items():
        entry = dict(report[case])
        entry.pop("saved_shape", None)
        _check_case(entry, tol, dtypes=dtypes)
    assert report["auto"]["linear_scan"] == "triton" and report["auto"]["selective_scan"] == "triton"
    _check_self_check(report["self_check"], "cuda")


if __name__ == "__main__":
    # the child process of the ``interpreted`` fixture (TRITON_INTERPRET=1 set by the parent)
    torch.set_num_threads(1)
    print(json.dumps(run_cases("cpu")))
