"""bf16 autocast on every registered model (docs/architecture.md "bf16"): under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` the logits stay within a stated bound of the float32 logits, and the
recurrences run on float32 inputs -- every call of the scan dispatchers
(:func:`drmlab.ops.linear_scan`, :func:`drmlab.ops.selective_scan`) gets float32 (or wider)
tensors, and every running sum (``cumsum``, ``cumprod``) accumulates in float32 or wider. The
scans themselves always compute in float32 (``drmlab/ops/linear_scan/__init__.py``); what the
models must do is form the gates, decays and inputs of a recurrence outside the autocast
(``drmlab/models/drm/components.py`` ``SelectiveMemory``, ``drmlab/models/layers/mamba_mixer.py``
``_project``, ``drmlab/models/looped/selective_ssm.py``), since a forget gate rounded to bf16's 8
bits compounds over the sequence. The resolvent head computes in float32 under an autocast too
(``drmlab/resolvent/attention.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from drmlab.models import build_model, list_models
from drmlab.ops import linear_scan, selective_scan

VOCAB = 37
BF16_EPS = 2.0**-8  # bf16 keeps 8 significant bits
# The bound: |logits_bf16 - logits_fp32| <= LOGIT_BOUND_EPS * BF16_EPS * max|logits_fp32|, i.e.
# within 8 bf16 rounding steps of the largest logit. At preset micro the worst model (MAMBA)
# is at 2.8 steps, most at 1-2.5 (measured on torch 2.13 CPU).
LOGIT_BOUND_EPS = 8
# Specs beyond the registry's names whose recurrences the registry's defaults do not reach:
# LOOPED's SSM mixer (the study's selective SSM, and Mamba's mixer inside LOOPED).
EXTRA = {"LOOPED:MC": {"arm": "MC"}, "LOOPED:MC/mamba": {"arm": "MC", "ssm_variant": "mamba"}}
# Models that run a scan (a test that would pass with no scan call at all proves nothing).
SCANNING = {
    "J",
    "J_DILATED",
    "J_NO_DIRECTION",
    "J_NO_METRIC",
    "J_NO_NATURALIZATION",
    "SSM_CONTROL",
    "MAMBA",
    "ASM_CM",
    "ASM_CM_E",
    "J_DIRECT_CONTROL",
    "J_DIRECT_CONTROL_MATCHED",
    "J_METRIC_SUBSPACE",
    "J_METRIC_ORTHONORMAL_DIRECTION",
    "ASM_VR_RS",  # ASM_VR_R has no selective memory
    "ASM_VR_S",
    "ASM_CM_VR",
    "LOOPED:MC",
    "LOOPED:MC/mamba",
}
RUNNING_SUMS = ("cumsum", "cumprod", "logcumsumexp")
WIDE = (torch.float32, torch.float64, torch.complex64, torch.complex128)


class RecurrenceRecorder(TorchDispatchMode):
    """Records the dtypes of the tensors every running sum reads (after autocast's casts)."""

    def __init__(self):
        super().__init__()
        self.sums: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in RUNNING_SUMS and args and args[0].is_floating_point():
            self.sums.append((func.__name__, args[0].dtype))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def scan_calls(monkeypatch):
    """Every module of drmlab that holds the scan dispatchers gets a recording wrapper; yields the
    list of (dispatcher, dtypes of its tensor arguments) for each call."""
    for package in ("drmlab.models", "drmlab.resolvent", "drmlab.ops"):  # load every call site first
        for module in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            importlib.import_module(module.name)
    calls: list[tuple[str, list[torch.dtype]]] = []

    def recording(name, fn):
        def wrapper(*args, **kwargs):
            calls.append((name, [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]))
            return fn(*args, **kwargs)

        return wrapper

    for dispatcher in (linear_scan, selective_scan):
        wrapper = recording(dispatcher.__name__, dispatcher)
        holders = [
            m
            for name, m in list(sys.modules.items())
            if name.startswith("drmlab") and getattr(m, dispatcher.__name__, None) is dispatcher
        ]
        assert holders, dispatcher.__name__
        for module in holders:
            monkeypatch.setattr(module, dispatcher.__name__, wrapper)
    return calls


@pytest.mark.parametrize("spec", list_models() + list(EXTRA))
def test_bf16_autocast_logits_and_recurrences(spec, scan_calls):
    name = spec.split(":")[0]
    model = build_model(name, "micro", vocab_size=VOCAB, seed=0, **EXTRA.get(spec, {}))
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fp32 = model(x).logits
        assert fp32.dtype == torch.float32
        del scan_calls[:]
        recorder = RecurrenceRecorder()
        with torch.autocast("cpu", dtype=torch.bfloat16), recorder:
            bf16 = model(x).logits
    error = (bf16.float() - fp32).abs().max().item()
    scale = fp32.abs().max().item()
    assert 0 < error <= LOGIT_BOUND_EPS * BF16_EPS * scale, (error, scale, error / (BF16_EPS * scale))
    for dispatcher, dtypes in scan_calls:
        assert all(d in WIDE for d in dtypes), (dispatcher, dtypes)
    for op, dtype in recorder.sums:
        assert dtype in WIDE, (op, dtype)
    assert bool(scan_calls) == (spec in SCANNING), scan_calls


def test_bf16_training_step_gives_finite_gradients_close_to_fp32():
    """One forward under autocast and a backward outside it (as the trainer does) on the models
    with recurrences of both kinds: the gradient of the mean squared logit stays within 10% of
    float32's in norm (bf16 rounding of every layer's output; the scans run in float32)."""
    for name in ("J", "MAMBA"):
        model = build_model(name, "micro", vocab_size=VOCAB, seed=0)
        x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
        grads = {}
        for autocast in (False, True):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x).logits.float().square().mean()
            loss.backward()
            grads[autocast] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert torch.isfinite(grads[True]).all()
        relative = ((grads[True] - grads[False]).norm() / grads[False].norm()).item()
        assert relative < 0.1, (name, relative)  # measured: J 0.7%, MAMBA 2.9%


def test_bf16_autocast_around_a_compiled_model():
    """``--bf16 --compile``: the autocast around a compiled MAMBA (aot_eager: forward and
    backward graphs), with its float32 regions inside the graph, gives the eager bf16 logits."""
    torch._dynamo.reset()
    model = build_model("MAMBA", "micro", vocab_size=VOCAB, seed=0)
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x).logits
            eager = model(x).logits
        compiled.float().square().mean().backward()
    finally:
        torch._dynamo.reset()
    assert compiled.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


class MatmulRecorder(TorchDispatchMode):
    """The operand dtypes of every matrix product (after autocast's casts)."""

    def __init__(self):
        super().__init__()
        self.products: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm", "bmm", "baddbmm"):
            self.products.append(args[-1].dtype)
        return func(*args, **(kwargs or {}))


def _memory_gates(products_in_autocast: bool, autocast: bool):
    """SSM_CONTROL's selective memory (at micro): its (forget, update) gates on one input, and the
    operand dtypes of the matrix products that formed them."""
    model = build_model(
        "SSM_CONTROL", preset="micro", vocab_size=VOCAB, memory_products_in_autocast=products_in_autocast
    )
    memory = next(m for m in model.modules() if type(m).__name__ == "SelectiveMemory")
    g = torch.Generator().manual_seed(3)
    c = model.config
    prev_read = torch.randn(2, 16, c.d_read, generator=g)
    e = torch.randn(2, 16, c.d_token, generator=g)
    recorder = MatmulRecorder()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), recorder:
        forget, update = memory.gates(prev_read, memory.token_part(e), packed=memory.packed_gates())
    return forget, update, recorder.products


def test_the_memory_products_are_float32_under_autocast_unless_asked():
    reference = _memory_gates(False, autocast=False)
    kept = _memory_gates(False, autocast=True)
    assert set(kept[2]) == {torch.float32} and len(kept[2]) == 3  # token part, state part, the packed gates
    assert torch.equal(kept[0], reference[0]) and torch.equal(kept[1], reference[1])


def test_the_memory_products_in_autocast_run_in_bf16_and_keep_float32_gates():
    reference = _memory_gates(True, autocast=False)  # outside an autocast the setting changes nothing
    assert torch.equal(reference[0], _memory_gates(False, autocast=False)[0])
    forget, update, products = _memory_gates(True, autocast=True)
    assert set(products) == {torch.bfloat16} and len(products) == 3
    assert forget.dtype == update.dtype == torch.float32
    # the gates differ from float32 by the pre-activations' bf16 round-off only: within a few bf16 steps
    # of the gate's own slope, far finer than the gate rounded to bf16 (the reference implementation's bf16)
    assert 0 < (forget - reference[0]).abs().max() <= 8 * BF16_EPS * 0.25
    assert (update - reference[1]).abs().max() <= 8 * BF16_EPS
    decay = 1 - reference[0]  # how fast memory fades: the quantity a rounded gate would distort
    rounded = 1 - reference[0].bfloat16().float()
    assert ((1 - forget) - decay).abs().max() < (rounded - decay).abs().max()


def _one_step_loss(bf16: bool, bf16_memory_products: bool):
    """(the first logged training loss, the memory modules' switches in the training forward) of one step of
    SSM_CONTROL at micro; after training every switch is as it was before (off)."""
    import numpy as np

    from drmlab.training import TrainConfig, train

    model = build_model("SSM_CONTROL", preset="micro", vocab_size=VOCAB, seed=5)
    stream = np.random.default_rng(0).integers(0, VOCAB, 4_000).astype(np.int64)
    cfg = TrainConfig(
        tokens=2 * 32, batch_size=2, seq_len=32, seed=5, bf16=bf16, bf16_memory_products=bf16_memory_products
    )
    memories = [m for m in model.modules() if hasattr(m, "products_in_autocast")]
    assert memories and not any(m.products_in_autocast for m in memories)
    seen = set()  # the memories' switches at each forward of the model while it trains
    hook = model.register_forward_pre_hook(lambda *_: seen.update(m.products_in_autocast for m in memories))
    summary = train(model, stream, None, cfg, None, device="cpu", quiet=True)
    hook.remove()
    assert not any(m.products_in_autocast for m in memories)  # restored: the model leaves as it came
    return summary["final_loss"], seen


def test_the_train_setting_puts_the_memory_products_in_bf16_under_bf16_only():
    """``bf16_memory_products`` (on under --fast, docs/drm.md A.4.7) switches the selective memory's products into
    the autocast: the first step's loss moves by bf16 round-off; without bf16 the setting changes nothing."""
    plain, plain_switches = _one_step_loss(bf16=True, bf16_memory_products=False)
    fast, fast_switches = _one_step_loss(bf16=True, bf16_memory_products=True)
    assert plain_switches == {False} and fast_switches == {True}
    assert fast != plain and abs(fast - plain) <= 0.01 * abs(plain)  # round-off, not another model
    float32, switches = _one_step_loss(bf16=False, bf16_memory_products=True)
    assert switches == {False}
    assert float32 == _one_step_loss(bf16=False, bf16_memory_products=False)[0]
