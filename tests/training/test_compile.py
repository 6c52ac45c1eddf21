"""Compile-ready models (docs/architecture.md "Compiled models"): the scans are ``torch.library`` custom operators
(``drmlab/ops/linear_scan/op.py``, ``drmlab/ops/selective_scan/op.py``) with fake
implementations and registered gradients, and ``torch.compile(model, fullgraph=True)`` works for
every registered model and equals eager; ``drmlab train --compile`` trains; a model that cannot
compile is refused in one line naming the operation that broke the graph
(``drmlab/training/compiling.py``).

Compiler backends, chosen for the time budget of a 2-core CPU (inductor's C++ compile costs
30-60 s per model there): ``aot_eager`` -- Dynamo's full graph capture plus AOT autograd's
forward and backward graphs, run eagerly -- for the five models of ``REQUIRED``, forward and
one backward; ``eager`` (Dynamo's capture alone, forward) for every other registered model;
``inductor`` once, in ``drmlab train --compile`` on MAMBA with one layer (the C selective-scan
operator inside an inductor graph, forward and backward), checked against the eager run.
"""

from __future__ import annotations

import json

import pytest
import torch

from drmlab.models import build_model, list_models
from drmlab.ops import linear_scan, selective_scan, selective_scan_reference
from drmlab.ops.linear_scan import linear_scan_reference
from drmlab.ops.linear_scan.op import linear_scan_op
from drmlab.ops.selective_scan.op import selective_scan_op
from drmlab.training.compiling import CompileError, compile_errors, graph_break_reason

VOCAB = 37
REQUIRED = ("J", "SSM_CONTROL", "MAMBA", "LOOPED", "RESOLVENT")  # forward and backward, aot_eager
OTHERS = {name: (name, {}) for name in list_models() if name not in REQUIRED}  # forward, eager backend
# ... and settings whose code the registry's defaults do not reach: LOOPED's selective-SSM mixer,
# the resolvent head with gate phases (in eval mode, where the phases carry no gradient)
OTHERS.update({"LOOPED:MC": ("LOOPED", {"arm": "MC"}), "RESOLVENT/gate_phase": ("RESOLVENT", {"gate_phase": True})})


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles from scratch (no cached graph, no recompile budget spent)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tokens(batch: int = 2, time: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, time), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- the custom operators


def _scan_args(dtype, with_init, seed=0):
    """(f, u, init) [2, 5, 3] of ``dtype`` requiring grad: gates of modulus below 1 (complex: any
    phase), standard normal inputs."""
    g = torch.Generator().manual_seed(seed)
    f = torch.rand(2, 5, 3, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        f = torch.polar(f, 6.28 * torch.rand(2, 5, 3, generator=g, dtype=torch.float64))
    u = torch.randn(2, 5, 3, generator=g, dtype=dtype)
    init = torch.randn(2, 3, generator=g, dtype=dtype) if with_init else None
    return tuple(None if t is None else t.to(dtype).requires_grad_() for t in (f, u, init))


@pytest.mark.parametrize("backend", ["c", "torch"])
def test_linear_scan_op_passes_opcheck(backend, request):
    """Schema, fake implementation, autograd registration and AOT dispatch (dynamic shapes) of
    ``drmlab::linear_scan``, real and complex, with and without init."""
    if backend == "c":
        request.getfixturevalue("c_kernel")
    linear_scan(torch.ones(1, 1, 1), torch.ones(1, 1, 1), backend=backend)  # load the kernel outside opcheck's modes
    for dtype in (torch.float64, torch.complex128):
        for with_init in (False, True):
            result = torch.library.opcheck(linear_scan_op, (*_scan_args(dtype, with_init), backend))
            assert set(result.values()) == {"SUCCESS"}, (dtype, with_init, result)


def test_selective_scan_op_passes_opcheck(c_kernel):
    g = torch.Generator().manual_seed(0)
    b, t, e, n = 2, 6, 4, 3
    x, Bm, Cm = (
        torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in ((b, t, e), (b, t, n), (b, t, n))
    )
    dt = torch.rand(b, t, e, dtype=torch.float64, generator=g).requires_grad_()
    A = (-torch.rand(e, n, dtype=torch.float64, generator=g)).requires_grad_()
    h0 = torch.randn(b, e, n, dtype=torch.float64, generator=g).requires_grad_()
    selective_scan(x, dt, A, Bm, Cm, backend="c")  # load the kernel outside opcheck's modes
    for h in (None, h0):
        result = torch.library.opcheck(selective_scan_op, (x, dt, A, Bm, Cm, h, True, "c"))
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("backend", ["c", "torch"])
def test_compiled_scans_are_exact(backend, request):
    """Both scans compiled as one graph (aot_eager: the backward graph too) against the float64
    loops, forward and gradient; the selective scan's ``"torch"`` backend is the chunked path
    with activation checkpointing (the path off the CPU)."""
    if backend == "c":
        request.getfixturevalue("c_kernel")
    f, u, init = _scan_args(torch.float64, True, seed=3)
    scan = torch.compile(lambda a, b, c: linear_scan(a, b, c, backend=backend), fullgraph=True, backend="aot_eager")
    out = scan(f, u, init)
    ref = linear_scan_reference(f, u, init)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(
        torch.autograd.grad(out.sin().sum(), (f, u, init)), torch.autograd.grad(ref.sin().sum(), (f, u, init))
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)

    g = torch.Generator().manual_seed(4)
    b, t, e, n = 2, 9, 5, 3
    x, Bm, Cm, h0 = (
        torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_()
        for s in ((b, t, e), (b, t, n), (b, t, n), (b, e, n))
    )
    dt = torch.rand(b, t, e, dtype=torch.float64, generator=g).requires_grad_()
    A = (-torch.rand(e, n, dtype=torch.float64, generator=g)).requires_grad_()
    kw = {"chunk": 4, "recompute": True} if backend == "torch" else {}
    sscan = torch.compile(lambda *a: selective_scan(*a, backend=backend, **kw), fullgraph=True, backend="aot_eager")
    y, h = sscan(x, dt, A, Bm, Cm, h0)
    y_ref, h_ref = selective_scan_reference(x, dt, A, Bm, Cm, h0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-12)
    wrt = (x, dt, A, Bm, Cm, h0)
    for got, want in zip(
        torch.autograd.grad(y.sin().sum() + h.sum(), wrt), torch.autograd.grad(y_ref.sin().sum() + h_ref.sum(), wrt)
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------- every model


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", REQUIRED)
def test_compiled_model_equals_eager_forward_and_backward(name):
    model = build_model(name, "micro", vocab_size=VOCAB, seed=0)
    x = tokens()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    logits = compiled(x).logits
    logits.square().mean().backward()
    got = _grads(model)
    model.zero_grad(set_to_none=True)
    ref = model(x).logits
    ref.square().mean().backward()
    want = _grads(model)
    torch.testing.assert_close(logits, ref, rtol=1e-6, atol=1e-6)
    assert got.keys() == want.keys() and len(want) == len(list(model.parameters()))
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.parametrize("spec", OTHERS)
def test_every_other_model_compiles_as_one_graph(spec):
    name, settings = OTHERS[spec]
    model = build_model(name, "micro", vocab_size=VOCAB, seed=0, **settings).eval()
    x = tokens()
    with torch.no_grad():
        logits = torch.compile(model, fullgraph=True, backend="eager")(x).logits
        torch.testing.assert_close(logits, model(x).logits, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- drmlab train --compile


@pytest.fixture
def corpus(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i}" for i in range(300)))
    return text


def _train(corpus, out, capsys, *extra):
    from drmlab.cli import main

    code = main(
        [
            "train",
            "--model",
            "MAMBA",
            "--preset",
            "micro",
            "--set",
            "n_layer=1",
            "--tokens",
            "512",
            "--data",
            str(corpus),
            "--cache-dir",
            str(corpus.parent / "cache"),
            "--out",
            str(out),
            "--eval-tokens",
            "256",
            "--quiet",
            *extra,
        ]
    )
    captured = capsys.readouterr()
    return code, captured.err


def test_train_compile_trains_like_eager(corpus, tmp_path, capsys):
    """Inductor: the compiled training forward and backward (the C selective-scan operator inside
    an inductor graph) give the eager run's losses, and the run records ``compile``."""
    code, err = _train(corpus, tmp_path / "compiled", capsys, "--compile")
    assert code == 0, err
    code, err = _train(corpus, tmp_path / "eager", capsys)
    assert code == 0, err
    runs = {}
    for kind in ("compiled", "eager"):
        rows = [json.loads(line) for line in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()]
        runs[kind] = [r["loss"] for r in rows if r["kind"] == "train"]
        assert json.loads((tmp_path / kind / "config.json").read_text())["train"]["compile"] == (kind == "compiled")
    assert len(runs["compiled"]) == 2
    torch.testing.assert_close(torch.tensor(runs["compiled"]), torch.tensor(runs["eager"]), rtol=1e-4, atol=0)
    # the compiled run says whether the compile paid (at its last step: two steps give one compiled sample)
    rows = [json.loads(line) for line in (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()]
    (report,) = [r for r in rows if r["kind"] == "compile"]
    assert report["step"] == 2 and report["total_steps"] == 2 and report["compile_seconds"] > 0
    assert report["eager_ms"] > 0 and report["compiled_ms"] > 0
    pays = report["break_even_steps"] is not None and report["break_even_steps"] < 2
    assert report["worth_it"] == pays
    assert not any(
        r["kind"] == "compile"
        for r in (json.loads(x) for x in (tmp_path / "eager" / "metrics.jsonl").read_text().splitlines())
    )


def test_the_compile_verdict_is_its_arithmetic():
    """compile cost = first step - a compiled one; saving per step = grad_accum x (eager - compiled);
    break-even = cost / saving; worth it when the run is longer; the eager pass leaves no trace."""
    from drmlab.training.compile_report import CompileReport, describe, time_eager_pass

    report = CompileReport(eager_seconds=0.030, grad_accum=2)
    for seconds in (10.040, 0.042, 0.040, 0.044, 0.001):  # the last comes after the samples: ignored
        report.observe(seconds)
    assert report.ready() and report.compiled_seconds == [0.021, 0.020, 0.022]
    row = report.row(step=4, total_steps=1000)
    # cost: 10.040 - 2 x 0.020, and the sampled steps' time over the fastest: 2 x (0.001 + 0 + 0.002)
    assert row["compiled_ms"] == pytest.approx(20.0) and row["compile_seconds"] == pytest.approx(10.006)
    assert row["saving_ms_per_step"] == pytest.approx(20.0) and row["break_even_steps"] == pytest.approx(500.3)
    assert row["worth_it"] is True and "worth it for this run's 1,000 steps" in describe(row)
    assert report.row(step=4, total_steps=400)["worth_it"] is False
    # a recompile at the second step (Dynamo making the step number dynamic) is part of the cost
    again = CompileReport(eager_seconds=0.030)
    for seconds in (5.0, 3.02, 0.02, 0.02):
        again.observe(seconds)
    assert again.row(4, 1000)["compile_seconds"] == pytest.approx(8.0 - 0.02)
    slower = CompileReport(eager_seconds=0.010)
    for seconds in (5.0, 0.02, 0.02, 0.02):
        slower.observe(seconds)
    row = slower.row(4, 10_000)
    assert row["break_even_steps"] is None and row["worth_it"] is False and "saves nothing" in describe(row)
    # timing an eager pass restores the random state and clears the gradients
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    before = torch.get_rng_state()
    seconds = time_eager_pass(lambda: model(torch.ones(2, 4)).sum().backward(), model, torch.device("cpu"))
    assert seconds > 0 and torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())


def test_a_model_that_cannot_compile_names_the_operation(corpus, tmp_path, capsys, monkeypatch):
    """The pre-custom-operator state of the scan (a ``torch.compiler.disable`` escape) put back
    into the DRM memory: ``--compile`` is refused in one line naming the call and its line."""
    import drmlab.models.drm.stages.memory as drm_memory

    monkeypatch.setattr(drm_memory, "linear_scan", torch.compiler.disable(drm_memory.linear_scan))
    from drmlab.cli import main

    code = main(
        [
            "train",
            "--model",
            "SSM_CONTROL",
            "--preset",
            "micro",
            "--tokens",
            "256",
            "--data",
            str(corpus),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--compile",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    first, *rest = err.strip().splitlines()
    assert first.startswith("drmlab train: error: SSM_CONTROL cannot be compiled as one graph"), first
    assert "torch.compiler.disable" in first and "linear_scan" in first and "<function" not in first
    assert "drmlab/models/drm/stages/memory.py:" in first and "m = linear_scan(" in first
    assert rest == [
        "  to train it uncompiled: the same command without --compile, with --overwrite (this run wrote no checkpoint)"
    ]


def test_graph_break_reason_names_a_data_dependent_branch():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # reads a value: no single graph
                return x * 2
            return x

    with pytest.raises(CompileError) as info, compile_errors("Branchy"):
        torch.compile(Branchy(), fullgraph=True, backend="eager")(torch.ones(3))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Branchy cannot be compiled as one graph")
    assert "Data-dependent branching" in message and "test_compile.py:" in message and "if x.sum() > 0" in message
    assert graph_break_reason(RuntimeError("plain\nsecond line. More.")) == "plain: second line."


def test_a_process_compiles_more_models_than_dynamos_default_limit():
    """A study compiles one forward per model configuration: past Dynamo's recompile limit the next model
    would be a hard failure under fullgraph=True; compile_model raises the limit first."""
    import torch._dynamo

    from drmlab.training.compiling import RECOMPILE_LIMIT, compile_model

    x = torch.randint(0, VOCAB, (1, 8))
    models = [build_model("J", "micro", vocab_size=VOCAB, d_token=16 + 8 * k) for k in range(3)]
    # torch's own patch (pytest's monkeypatch cannot restore a Dynamo config entry)
    with torch._dynamo.config.patch(recompile_limit=1):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):  # what happens without the raised limit
            for model in models:
                torch.compile(model, fullgraph=True, backend="eager")(x)
        torch._dynamo.reset()
        for model in models:
            compile_model(model, backend="eager")(x)
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
    torch._dynamo.reset()


def test_the_step_number_is_one_graph_for_every_step():
    """The DRM forward reads the step (its naturalization warm-up): Dynamo would compile a graph for step 1
    and a second when step 2 makes the int dynamic; compile_model marks it dynamic from the first call. The
    compiled forward equals eager at each step."""
    from torch._dynamo.utils import counters

    from drmlab.training.compiling import compile_model

    model = build_model("J", "micro", vocab_size=VOCAB)
    assert model.config.naturalization_warmup_steps > 3  # the strength changes with the step
    x = tokens()
    torch._dynamo.reset()
    counters.clear()
    compiled = compile_model(model, backend="eager")
    for step in (1, 2, 3, 10_000):
        torch.testing.assert_close(compiled(x, step=step).logits, model(x, step=step).logits, rtol=1e-6, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
