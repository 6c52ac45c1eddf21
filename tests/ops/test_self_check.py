"""The first-use self-check of the fast backends (drmlab.ops.self_check): a backend made
wrong on purpose (the C kernels of linear_scan, selective_scan and the fused decode step: a wrong
forward, a wrong gradient, an exception, a NaN) is caught on its first use, said in one line naming the
backend, the device and the error, replaced by the next backend (whose results are the reference's), and
recorded (in config.json too); a backend asked for by name that failed raises in one line; a correct
backend passes once per process; the check runs the same under no_grad, inference_mode, autocast, a
FLOP counter and torch.compile, and leaves the global random state alone."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from drmlab.models import build_model
from drmlab.models.output import ModelOutput
from drmlab.ops import backend_for, decode_step, self_check
from drmlab.ops.backends import BackendCheckFailed, BackendUnavailable
from drmlab.ops.linear_scan import c as scan_c
from drmlab.ops.linear_scan import linear_scan, linear_scan_reference
from drmlab.ops.selective_scan import c as sscan_c
from drmlab.ops.selective_scan import selective_scan, selective_scan_backend, selective_scan_reference

pytestmark = pytest.mark.usefixtures("c_kernel", "fresh")  # tests/conftest.py: the C kernels are built


@pytest.fixture
def fresh(monkeypatch):
    """An empty record of checks for this test (the process's own record is put back after it)."""
    monkeypatch.setattr(self_check, "_RECORDS", {})
    monkeypatch.delenv(self_check.DISABLE_ENV, raising=False)


def _scan_inputs(dtype=torch.float32, shape=(3, 17, 6)):
    g = torch.Generator().manual_seed(7)
    f = torch.sigmoid(2 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    u = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return f, u


def _record(operator, dtype="float32") -> dict:
    found = [r for r in self_check.backend_checks() if r["operator"] == operator and r["dtype"] == dtype]
    assert len(found) == 1, self_check.backend_checks()
    return found[0]


# --------------------------------------------------------------------------- planted wrong backends

_scan_forward, _scan_backward = scan_c.forward, scan_c.backward


def _wrong_forward(f, u, init):
    return _scan_forward(f, u, init) * 1.001  # 1e-3 relative: far above 2e-5, far below any visible sign


def _wrong_gradient(f, m, init, dm, need_f, need_init):
    du, df, dinit = _scan_backward(f, m, init, dm, need_f, need_init)
    du = du.clone()
    du[:, -1] += 1e-3  # one time step's input gradient
    return du, df, dinit


def _raises(f, u, init):
    raise OSError("illegal instruction in drm_scan_fwd_f32 (planted)")


def _nan(f, u, init):
    out = _scan_forward(f, u, init)
    out[0, 0, 0] = math.nan
    return out


PLANTED = {
    "forward": ("forward", _wrong_forward, r"max error 1\.0e-03 > 2e-05"),
    "gradient": ("backward", _wrong_gradient, r"max error \d\.\de-0[34] > 2e-05"),
    "exception": ("forward", _raises, r"OSError: illegal instruction in drm_scan_fwd_f32 \(planted\)"),
    "nan": ("forward", _nan, r"a non-finite value"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_a_wrong_c_scan_is_caught_said_in_one_line_and_replaced(planted, monkeypatch, capsys):
    attr, wrong, words = PLANTED[planted]
    monkeypatch.setattr(scan_c, attr, wrong)
    f, u = _scan_inputs()
    leaves = [t.clone().requires_grad_() for t in (f, u)]
    out = linear_scan(*leaves)  # "auto": the C kernel's first use on this CPU
    out.backward(torch.ones_like(out))
    # the fallback ran: the reference's numbers, forward and gradient
    refs = [t.double().requires_grad_() for t in (f, u)]
    ref = linear_scan_reference(*refs)
    ref.backward(torch.ones_like(ref))
    assert (out.double() - ref).abs().max().item() <= 1e-5
    for leaf, r in zip(leaves, refs):
        assert (leaf.grad.double() - r.grad).abs().max().item() <= 1e-5
    for _ in range(3):  # later uses: no second check, no second line
        linear_scan(f, u)
    assert backend_for(f) == "torch"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    pattern = (
        rf"^drmlab: linear_scan backend 'c' failed its first-use check on cpu float32 \({words}.*\); using 'torch'$"
    )
    assert re.match(pattern, lines[0]), lines[0]
    record = _record("linear_scan")
    assert record["backend"] == "c" and record["device"] == "cpu" and not record["passed"]
    assert record["fallback"] == "torch" and record["tolerance"] == 2e-5 and record["seconds"] > 0
    # asked for by name, it is refused in one line that says what to do instead
    with pytest.raises(BackendCheckFailed, match=r"^linear_scan: backend 'c' failed its first-use check on cpu") as e:
        linear_scan(f, u, backend="c")
    assert "\n" not in str(e.value) and "'auto'" in str(e.value) and self_check.DISABLE_ENV in str(e.value)
    assert isinstance(e.value, BackendUnavailable)


def test_the_wrong_kernel_itself_is_what_the_check_saw(monkeypatch):
    """Not vacuous: the planted kernel is wrong by the amount the record says, on its own."""
    monkeypatch.setattr(scan_c, "forward", _wrong_forward)
    f, u = _scan_inputs()
    got = scan_c.forward(f, u, None)
    assert (got.double() - linear_scan_reference(f.double(), u.double())).abs().max().item() > 1e-3
    linear_scan(f, u)
    assert 5e-4 < _record("linear_scan")["max_error"] < 2e-3


def test_a_correct_backend_passes_once_per_process_and_dtype(monkeypatch, capsys):
    calls = []
    probe = self_check.PROBES["linear_scan"]
    monkeypatch.setitem(self_check.PROBES, "linear_scan", lambda *a: calls.append(a[1:]) or probe(*a))
    f, u = _scan_inputs()
    for _ in range(3):
        linear_scan(f, u)
    linear_scan(f, u, backend="c")
    assert backend_for(f) == "c" and len(calls) == 1
    linear_scan(*_scan_inputs(torch.float64))  # another compute dtype: another kernel, its own check
    assert len(calls) == 2
    record = _record("linear_scan")
    assert record["passed"] and record["error"] is None and record["fallback"] is None
    assert 0 <= record["max_error"] <= record["tolerance"] == 2e-5
    assert _record("linear_scan", "float64")["max_error"] <= 1e-12
    assert capsys.readouterr().err == ""
    # the torch backend (the reference's own operations, the last fallback) is never checked
    linear_scan(f, u, backend="torch")
    assert [r["backend"] for r in self_check.backend_checks()] == ["c", "c"]


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(self_check.DISABLE_ENV, "1")
    monkeypatch.setattr(scan_c, "forward", _wrong_forward)
    f, u = _scan_inputs()
    out = linear_scan(f, u)
    assert self_check.backend_checks() == [] and backend_for(f) == "c"
    assert (out.double() - linear_scan_reference(f.double(), u.double())).abs().max().item() > 1e-4  # ran, wrong


def test_a_wrong_selective_scan_kernel_is_caught(monkeypatch, capsys):
    forward = sscan_c.forward

    def wrong(x, dt, A, Bm, Cm, h0, need_grad):
        y, h_last, saved = forward(x, dt, A, Bm, Cm, h0, need_grad)
        return y, h_last * 1.01, saved

    monkeypatch.setattr(sscan_c, "forward", wrong)
    g = torch.Generator().manual_seed(3)
    x, Bm, Cm = torch.randn(2, 9, 4, generator=g), torch.randn(2, 9, 3, generator=g), torch.randn(2, 9, 3, generator=g)
    dt, A = torch.rand(2, 9, 4, generator=g), -torch.rand(4, 3, generator=g)
    y, h = selective_scan(x, dt, A, Bm, Cm)
    y_ref, h_ref = selective_scan_reference(*(t.double() for t in (x, dt, A, Bm, Cm)))
    assert (h.double() - h_ref).abs().max().item() <= 1e-5 and (y.double() - y_ref).abs().max().item() <= 1e-5
    assert selective_scan_backend(x) == "torch"
    record = _record("selective_scan")
    assert not record["passed"] and record["fallback"] == "torch" and record["tolerance"] == 1e-4
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "drmlab: selective_scan backend 'c' failed its first-use check on cpu float32" in err
    )
    # the torch path's own linear_scan (C, correct) was checked too, and passed
    assert _record("linear_scan")["passed"]


def test_a_wrong_fused_decode_step_is_caught_and_the_fast_step_runs(monkeypatch, capsys):
    run = decode_step.run
    # a wrong step size (the "dt" real setting): the kernel runs, its logits are wrong
    monkeypatch.setattr(decode_step, "run", lambda dtype, p, n, r: run(dtype, p, n, [r[0] * 1.5, *r[1:]]))
    model = build_model("J", preset="micro", seed=3).eval()
    assert model.fused_step_unsupported() is None
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = fast = model.init_state(2)
        for t in range(12):  # micro blocks are 8 long: the kernel is asked from the second token
            a, fused = model.step_fused(tokens[:, t], fused)
            b, fast = model.step(tokens[:, t], fast)
            assert torch.equal(a, b), t  # the fast step's numbers, bit for bit, at every token
    record = _record("decode_step")
    assert not record["passed"] and record["fallback"] == "fast step" and record["max_error"] > 1e-3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("drmlab: decode_step backend 'c' failed its first-use check on cpu")


def test_a_correct_fused_decode_step_passes_once(monkeypatch):
    calls, run = [], decode_step.run
    monkeypatch.setattr(decode_step, "run", lambda *a: calls.append(1) or run(*a))
    model = build_model("J", preset="micro", seed=3).to(torch.float64).eval()
    tokens = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        state = model.init_state(1)
        for t in range(6):
            _, state = model.step_fused(tokens[:, t], state)
    record = _record("decode_step", "float64")
    assert record["passed"] and record["max_error"] <= 1e-12 and len(calls) == 5  # every token but the first


# --------------------------------------------------------------------------- where the check runs


class _Ops(TorchDispatchMode):
    """The operators dispatched under it, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _below_autograd():
    """The dispatch keys an operator's own kernel runs with: conjugate and negative views not resolved."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Conjugate) | torch._C.DispatchKeySet(
        torch._C.DispatchKey.Negative
    )
    return torch._C._ExcludeDispatchKeyGuard(keys)


@pytest.mark.parametrize(
    "context", ["no_grad", "inference_mode", "autocast", "flop_counter", "dispatch_mode", "below_autograd"]
)
def test_the_check_runs_the_same_whatever_surrounds_the_first_use(context):
    """below_autograd: a first use inside an operator's kernel (opcheck's first call, say), where a complex
    reference's conj() views would be read unconjugated; the complex128 check must still pass."""
    f, u = _scan_inputs()
    if context == "below_autograd":
        f, u = torch.polar(f.double(), u.double()), u.to(torch.complex128)
    rng = torch.get_rng_state()
    first, second = _Ops(), _Ops()
    surroundings = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "flop_counter": lambda: FlopCounterMode(display=False),
        "dispatch_mode": lambda: first,
        "below_autograd": _below_autograd,
    }
    with surroundings[context]():
        linear_scan(f, u)
    record = _record("linear_scan", "complex128" if context == "below_autograd" else "float32")
    assert record["passed"], record
    assert torch.equal(torch.get_rng_state(), rng)  # its own generator
    if context == "dispatch_mode":  # the check ran outside the mode: it saw the call's operators only
        with second:
            linear_scan(f, u)  # checked already
        assert first.names == second.names and "drmlab.linear_scan.default" in first.names


def test_the_check_can_run_inside_a_backward_pass(monkeypatch):
    f, u = _scan_inputs()
    f.requires_grad_()
    monkeypatch.setenv(self_check.DISABLE_ENV, "1")
    out = linear_scan(f, u)  # the forward runs unchecked ...
    monkeypatch.delenv(self_check.DISABLE_ENV)
    assert self_check.backend_checks() == []
    out.sum().backward()  # ... so the backward operator's choice of 'c' is its first checked use
    assert _record("linear_scan")["passed"] and f.grad is not None


def test_the_check_runs_outside_a_compiled_graph(monkeypatch):
    """The first use inside torch.compile(fullgraph=True): the check runs eagerly at trace time, and a
    failed kernel is replaced in the graph too."""
    monkeypatch.setattr(scan_c, "forward", _wrong_forward)
    f, u = _scan_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: linear_scan(a, b) * 2, backend="aot_eager", fullgraph=True)
    out = compiled(f, u)
    torch._dynamo.reset()
    assert (out.double() / 2 - linear_scan_reference(f.double(), u.double())).abs().max().item() <= 1e-5
    record = _record("linear_scan")
    assert not record["passed"] and record["fallback"] == "torch"


def test_no_backend_runs_when_every_one_fails(monkeypatch):
    """A table whose only backends fail: "auto" names every failure in its error."""
    from drmlab.ops.backends import Backend, BackendTable

    table = BackendTable("planted", [Backend("c", None, lambda d, t: None, self_check=True)])
    monkeypatch.setitem(self_check.PROBES, "planted", lambda *a: 1.0)
    with pytest.raises(BackendUnavailable, match=r"'c' failed its first-use check \(max error 1\.0e\+00 > 2e-05\)"):
        table.choose(None, torch.device("cpu"), torch.float32)


# --------------------------------------------------------------------------- the run's record


class _ScanLM(nn.Module):
    """Embedding -> linear_scan -> Linear: a model whose every step runs the linear scan."""

    def __init__(self, vocab=32, d=8):
        super().__init__()
        self.emb, self.gate, self.out = nn.Embedding(vocab, d), nn.Linear(d, d), nn.Linear(d, vocab)

    def forward(self, tokens, step=None):
        e = self.emb(tokens)
        return ModelOutput(logits=self.out(linear_scan(torch.sigmoid(self.gate(e)), e)), aux={})


def test_the_run_records_the_checks_in_its_config(tmp_path, monkeypatch, capsys):
    from drmlab.training import TrainConfig, train, utilisation

    monkeypatch.setattr(utilisation, "measure_gemm_gflops", lambda device, dtype: 100.0)
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(scan_c, "forward", _wrong_forward)
    data = np.random.default_rng(0).integers(0, 32, size=2000).astype(np.int64)
    cfg = TrainConfig(tokens=4 * 8 * 2, batch_size=4, seq_len=8, lr=1e-3, eval_every=0, eval_windows=0)
    train(_ScanLM(), data, None, cfg, tmp_path / "run", quiet=True)
    checks = json.loads((tmp_path / "run" / "config.json").read_text())["runtime"]["backend_checks"]
    assert [(c["operator"], c["backend"], c["device"], c["dtype"], c["passed"], c["fallback"]) for c in checks] == [
        ("linear_scan", "c", "cpu", "float32", False, "torch")
    ]
    assert "max error 1.0e-03 > 2e-05" in checks[0]["error"]
    assert "drmlab: linear_scan backend 'c' failed its first-use check on cpu float32" in capsys.readouterr().err


# --------------------------------------------------------------------------- the fused kernels (docs/drm.md A.4.6)


def test_a_wrong_fused_state_bound_is_caught_and_the_plain_bound_runs(monkeypatch, capsys):
    from drmlab.ops.state_bound import c as bound_c
    from drmlab.ops.state_bound import state_bound, state_bound_reference

    right = bound_c.forward

    def wrong(z, x, radius, keep_input):
        out, y, norms = right(z, x, radius, keep_input)
        return out * 1.001, y, norms

    monkeypatch.setattr(bound_c, "forward", wrong)
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    got = state_bound(z, 1.0)
    assert torch.equal(got, state_bound_reference(z, 1.0))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "state_bound backend 'c' failed its first-use check on cpu float32" in err
    record = _record("state_bound")
    assert not record["passed"] and record["fallback"] == "torch"
    state_bound(z, 1.0)
    assert capsys.readouterr().err == ""  # said once


def test_a_wrong_fused_depthwise_conv_gradient_is_caught(monkeypatch, capsys):
    from drmlab.ops.conv import c as conv_c
    from drmlab.ops.conv import causal_depthwise_conv1d, causal_depthwise_conv1d_reference

    right = conv_c.backward

    def wrong(*args):
        dx, dtaps, dbias = right(*args)
        return dx, dtaps, dbias * 1.001

    monkeypatch.setattr(conv_c, "backward", wrong)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 4, generator=gen, requires_grad=True)
    w, b = torch.randn(4, 1, 3, generator=gen), torch.randn(4, generator=gen, requires_grad=True)
    y = causal_depthwise_conv1d(x, w, b)
    assert y.grad_fn.name() != "_FusedCausalDepthwiseConvBackward"
    assert torch.equal(y, causal_depthwise_conv1d_reference(x, w, b))
    assert "causal_depthwise_conv1d backend 'c' failed its first-use check" in capsys.readouterr().err


def test_the_right_fused_kernels_pass_their_checks():
    from drmlab.ops.conv import causal_depthwise_conv1d
    from drmlab.ops.state_bound import state_bound

    state_bound(torch.randn(3, 5), 1.0)
    x = torch.randn(1, 6, 3, requires_grad=True)
    causal_depthwise_conv1d(x, torch.randn(3, 1, 2))
    assert _record("state_bound")["passed"] and _record("causal_depthwise_conv1d")["passed"]
