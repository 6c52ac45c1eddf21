"""The input contract of every registered model (``drmlab/models/inputs.py``; ``docs/architecture.md``
section 2) and the resolvent operator's ``check_finite`` refusals (``drmlab/resolvent/checks.py``,
mirroring ``docs/resolvent.md`` section 4).

Every model, at preset micro, must refuse T = 0, B = 0, 1-D and 3-D input, float tokens,
id = vocab and id = -1 in its forward, and a step whose tokens are not [B] or whose batch
differs from its state's, all with the one error class ``ModelInputError`` and a message that
starts with the model's name and names the problem. ``resolvent_attention(check_finite=True)``
must refuse exactly what the float64 reference refuses, with the reference's message.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch

from drmlab.models import ModelInputError, build_model, list_models
from drmlab.models.inputs import check_step_tokens, check_tokens
from drmlab.resolvent import attention as resolvent_dispatch
from drmlab.resolvent import reference
from drmlab.resolvent.attention import resolvent_attention
from drmlab.resolvent.reference import NonFinite, Switches

LONG = torch.long
F64 = torch.float64
MODELS = list_models()


@functools.cache
def micro(name: str):
    return build_model(name, "micro", seed=0).eval()


def refused(call, pattern: str, name: str) -> str:
    """Run ``call``; it must raise exactly ModelInputError, its message starting with the model's
    name and matching ``pattern``. Returns the message."""
    with pytest.raises(ModelInputError) as info:
        call()
    message = str(info.value)
    assert type(info.value) is ModelInputError, message
    assert message.startswith(f"{name}: "), message
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
    return message


# ------------------------------------------------------------------------------------ forward

FORWARD_CASES = {
    "T = 0": (lambda V: torch.zeros(2, 0, dtype=LONG), r"time >= 1 .*got shape \(2, 0\).*empty sequence"),
    "B = 0": (lambda V: torch.zeros(0, 3, dtype=LONG), r"batch >= 1 .*got shape \(0, 3\).*empty batch"),
    "1-D": (lambda V: torch.zeros(3, dtype=LONG), r"shape \[batch, time\] \(rank 2\), got shape \(3,\)"),
    "3-D": (lambda V: torch.zeros(1, 2, 3, dtype=LONG), r"shape \[batch, time\] \(rank 2\), got shape \(1, 2, 3\)"),
    "float dtype": (lambda V: torch.zeros(1, 3), r"integer tensor .*got dtype torch\.float32"),
    "id = vocab": (
        lambda V: torch.tensor([[1, V, 2]]),
        r"token id 256 is outside the vocabulary \[0, 256\) .*\(1, 3\)",
    ),
    "id = -1": (lambda V: torch.tensor([[1, -1, 2]]), r"token id -1 is outside the vocabulary \[0, 256\)"),
    "not a tensor": (lambda V: [[1, 2, 3]], r"must be a torch\.Tensor .*got list"),
}


@pytest.mark.parametrize("name", MODELS)
def test_forward_refuses_every_bad_input_with_one_error(name):
    model = micro(name)
    vocab = model.config.vocab_size
    assert vocab == 256  # the patterns above spell it out
    for make, pattern in FORWARD_CASES.values():
        tokens = make(vocab)
        for return_state in (False, True):  # the prefill form checks the same way
            refused(lambda x=tokens, flag=return_state: model(x, return_state=flag), pattern, name)


@pytest.mark.parametrize("name", MODELS)
def test_integer_dtypes_give_the_long_logits(name):
    """The accepted integer dtypes are read as long: the same logits, forward and step."""
    model = micro(name)
    tokens = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    with torch.no_grad():
        expected = model(tokens).logits
        stepped, _ = model.step(tokens[:, 0], model.init_state(2))
        for dtype in (torch.int32, torch.int16, torch.uint8):
            assert torch.equal(model(tokens.to(dtype)).logits, expected), dtype
            logits, _ = model.step(tokens[:, 0].to(dtype), model.init_state(2))
            assert torch.equal(logits, stepped), dtype


# ------------------------------------------------------------------------------------ step


@pytest.mark.parametrize("name", MODELS)
def test_step_refuses_a_batch_other_than_its_state(name):
    model = micro(name)
    with torch.no_grad():
        fresh = model.init_state(2)
        for batch in (3, 0):
            refused(
                lambda b=batch: model.step(torch.zeros(b, dtype=LONG), fresh),
                rf"state holds batch 2, tokens have batch {batch}$",
                name,
            )
        _, after_one = model.step(torch.zeros(2, dtype=LONG), fresh)  # a state that has seen a token
        refused(
            lambda: model.step(torch.zeros(1, dtype=LONG), after_one),
            r"state holds batch 2, tokens have batch 1$",
            name,
        )
        prefilled = model(torch.zeros(3, 4, dtype=LONG), return_state=True).state
        refused(
            lambda: model.step(torch.zeros(2, dtype=LONG), prefilled),
            r"state holds batch 3, tokens have batch 2$",
            name,
        )
        logits, _ = model.step(torch.zeros(3, dtype=LONG), prefilled)  # the matching batch steps
        assert logits.shape == (3, 256)


@pytest.mark.parametrize("name", MODELS)
def test_step_refuses_bad_tokens_and_init_state_an_empty_batch(name):
    model = micro(name)
    state = model.init_state(1)
    refused(lambda: model.step(torch.zeros(1, 1, dtype=LONG), state), r"shape \[batch\] .*got shape \(1, 1\)", name)
    refused(lambda: model.step(torch.tensor(0), state), r"shape \[batch\] .*got shape \(\)", name)
    refused(lambda: model.step([0], state), r"shape \[batch\] .*got shape list", name)
    refused(lambda: model.step(torch.zeros(1), state), r"integer tensor .*got dtype torch\.float32", name)
    refused(lambda: model.step(torch.tensor([256]), state), r"token id 256 is outside the vocabulary \[0, 256\)", name)
    refused(lambda: model.step(torch.tensor([-1]), state), r"token id -1 is outside the vocabulary", name)
    for bad in (0, -1, 1.0, True):
        refused(lambda size=bad: model.init_state(size), rf"init_state needs a batch size >= 1, got {bad!r}", name)


def test_the_checks_trace_without_a_graph_break():
    """Under torch.compile the metadata checks are guards (fullgraph compiles), the id range is
    skipped, and a broken contract still raises ModelInputError from the compiled function."""

    def entry(tokens, tokens_t):
        check_tokens(tokens, 8, "M")
        check_step_tokens(tokens_t, 8, tokens.shape[0], "M")
        return tokens + tokens_t[:, None]

    compiled = torch.compile(entry, backend="eager", fullgraph=True, dynamic=True)
    assert compiled(torch.ones(2, 3, dtype=LONG), torch.ones(2, dtype=LONG)).shape == (2, 3)
    # the id range reads values: not checked inside the traced graph (checked in eager)
    assert compiled(torch.full((2, 5), 99), torch.ones(2, dtype=LONG)).shape == (2, 5)
    with pytest.raises(ModelInputError, match="token id 99"):
        entry(torch.full((2, 5), 99), torch.ones(2, dtype=LONG))
    lenient = torch.compile(entry, backend="eager", dynamic=True)
    lenient(torch.ones(2, 3, dtype=LONG), torch.ones(2, dtype=LONG))
    with pytest.raises(ModelInputError, match=r"^M: state holds batch 2, tokens have batch 3$"):
        lenient(torch.ones(2, 3, dtype=LONG), torch.ones(3, dtype=LONG))
    with pytest.raises(ModelInputError, match=r"^M: tokens must have batch >= 1 and time >= 1"):
        lenient(torch.ones(2, 0, dtype=LONG), torch.ones(2, dtype=LONG))


# ------------------------------------------------------------------------------------ resolvent


def reference_verdict(q, k, u, th, switches: Switches) -> str | None:
    """The float64 reference's refusal message for one head, or None when it accepts."""
    try:
        reference.operator(q, k, u, th, switches)
    except NonFinite as refusal:
        return str(refusal)
    return None


def torch_verdict(q, k, v, u, th, beta, qk, g, path="auto") -> str | None:
    try:
        out = resolvent_attention(q, k, v, u, th, beta, qk, g, path=path, check_finite=True)
    except NonFinite as refusal:
        return str(refusal)
    assert out.shape == v.shape
    return None


def slice_inputs(B=2, H=3, S=6, d=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, S, d, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(B, H, S, 2, generator=gen, dtype=F64)
    u = torch.rand(B, H, S, generator=gen, dtype=F64) * 0.6 + 0.3
    th = torch.rand(B, H, S, generator=gen, dtype=F64) * 6 - 3
    return q, k, v, u, th


def _inject(case: str, q, k, u, th, b: int, h: int):
    """Break slice (b, h) in one of the ways the reference refuses (or, for the "accepted"
    cases, in a way it accepts)."""
    if case == "nan q":
        q[b, h, 2, 1] = float("nan")
    elif case == "inf k":
        k[b, h, 4, 0] = float("-inf")
    elif case == "nan u":
        u[b, h, 3] = float("nan")
    elif case == "inf theta":
        th[b, h, 1] = float("inf")
    elif case == "phase overflow":  # g = 1.5 below: 1.5 * 1.5e308 overflows
        th[b, h, 5] = 1.5e308
    elif case == "causal logit overflow":  # s_42 = 1e200 * 1e200
        q[b, h, 4] = 1e200
        k[b, h, 2] = 1e200
    elif case == "logit overflow above the diagonal only (accepted)":  # s_24 is never read
        q[b, h, 2] = 1e200
        k[b, h, 4] = 1e200
    elif case == "huge but finite logits (accepted)":
        q[b, h, 4] = 1e150
        k[b, h, 2] = 1e150


REFUSAL_CASES = [
    "nan q",
    "inf k",
    "nan u",
    "inf theta",
    "phase overflow",
    "causal logit overflow",
    "logit overflow above the diagonal only (accepted)",
    "huge but finite logits (accepted)",
]


@pytest.mark.parametrize("case", REFUSAL_CASES)
def test_check_finite_refuses_what_the_reference_refuses(case):
    """One broken (b, h) slice among healthy ones: the torch operator refuses with the
    reference's message exactly when the reference refuses that slice, on every path that
    applies to the switches."""
    beta, qk, g = 0.5, 0.8, 1.5
    q, k, v, u, th = slice_inputs()
    _inject(case, q, k, u, th, b=1, h=2)
    verdicts = {
        reference_verdict(q[b, h].numpy(), k[b, h].numpy(), u[b, h].numpy(), th[b, h].numpy(), Switches(beta, qk, g))
        for b in range(2)
        for h in range(3)
    }
    expected = next((m for m in verdicts if m is not None), None)
    assert (expected is None) == case.endswith("(accepted)"), verdicts
    for path in ("auto", "dense", "flash"):
        assert torch_verdict(q, k, v, u, th, beta, qk, g, path) == expected, path
    if case != "causal logit overflow":  # at qk = 0 the logit is exactly 0, never evaluated
        expected_scan = expected if "logit" not in case else None
        assert torch_verdict(q, k, v, u, th, beta, 0.0, g, "scan") == expected_scan


def test_check_finite_switches_and_per_head_logit_scale():
    q, k, v, u, th = slice_inputs()
    for bad in (float("nan"), float("inf")):
        for switches in ((bad, 1.0, 1.0), (1.0, bad, 1.0), (1.0, 1.0, bad)):
            assert (
                reference_verdict(
                    q[0, 0].numpy(), k[0, 0].numpy(), u[0, 0].numpy(), th[0, 0].numpy(), Switches(*switches)
                )
                == "non-finite switch"
            )
            assert torch_verdict(q, k, v, u, th, *switches) == "non-finite switch"
        assert torch_verdict(q, k, v, u, th, torch.tensor([1.0, bad, 0.5]), 1.0, 1.0) == "non-finite switch"
    # a head with qk = 0 never evaluates its logits (the reference accepts an overflowing dot
    # product there); the same overflow in a head with qk != 0 is refused
    q[0, 1, 4] = 1e200
    k[0, 1, 2] = 1e200
    broken_head = [t[0, 1].numpy() for t in (q, k, u, th)]
    assert reference_verdict(*broken_head, Switches(0.5, 0.0, 1.0)) is None
    assert reference_verdict(*broken_head, Switches(0.5, 0.7, 1.0)) == "logit qk * s_ij overflows"
    per_head = torch.tensor([0.7, 0.0, 0.7])
    assert torch_verdict(q, k, v, u, th, 0.5, per_head, 1.0) is None
    assert torch_verdict(q, k, v, u, th, 0.5, torch.tensor([0.0, 0.7, 0.0]), 1.0) == "logit qk * s_ij overflows"
    # the empty sequence: inputs are still checked, as in the reference
    empty = [t[:, :, :0] for t in (q, k, v, u, th)]
    assert torch_verdict(*empty, 1.0, 1.0, 1.0) is None
    assert torch_verdict(*empty, float("nan"), 1.0, 1.0) == "non-finite switch"


def test_check_finite_in_float32_refuses_what_float32_cannot_hold():
    """In float32 the logits are checked in float32: 1e20 * 1e20 = 1e40 is refused although
    the float64 reference accepts it, since the float32 paths would read it as inf."""
    q, k, v, u, th = slice_inputs()
    q[0, 0, 3] = 1e20
    k[0, 0, 1] = 1e20
    assert (
        reference_verdict(q[0, 0].numpy(), k[0, 0].numpy(), u[0, 0].numpy(), th[0, 0].numpy(), Switches(1.0, 1.0, 1.0))
        is None
    )
    assert torch_verdict(q, k, v, u, th, 1.0, 1.0, 1.0) is None
    f32 = [t.float() for t in (q, k, v, u, th)]
    assert torch_verdict(*f32, 1.0, 1.0, 1.0) == "logit qk * s_ij overflows"
    f32[0][0, 0, 3] = 1e10  # 1e30: inside float32's range
    assert torch_verdict(*f32, 1.0, 1.0, 1.0) is None


def test_check_finite_changes_nothing_when_inputs_are_finite_and_is_off_by_default():
    q, k, v, u, th = slice_inputs(S=9)
    for t in (q, k, v, u, th):
        t.requires_grad_(True)
    results = []
    for check in (False, True):
        out = resolvent_attention(q, k, v, u, th, 0.5, 0.8, 1.2, check_finite=check)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v, u, th))))
    for off, on in zip(*results):
        assert torch.equal(off, on)
    # off (the default): a NaN input is not refused, it flows into the output
    with torch.no_grad():
        q[0, 0, 0, 0] = float("nan")
        out = resolvent_attention(q, k, v, u, th, 0.5, 0.8, 1.2)
    assert torch.isnan(out).any()
    with pytest.raises(NonFinite, match="^non-finite q$"):
        resolvent_attention(q, k, v, u, th, 0.5, 0.8, 1.2, check_finite=True)


def test_the_language_model_runs_without_the_check(monkeypatch):
    """The RESOLVENT model leaves check_finite off (the default) for speed."""

    def refuse_everything(*args, **kwargs):
        raise AssertionError("check_finite ran inside the model")

    monkeypatch.setattr(resolvent_dispatch, "refuse_non_finite", refuse_everything)
    with pytest.raises(AssertionError, match="check_finite ran"):
        resolvent_attention(*slice_inputs(), 1.0, 1.0, 1.0, check_finite=True)
    model = micro("RESOLVENT")
    with torch.no_grad():
        assert np.isfinite(model(torch.zeros(1, 5, dtype=LONG)).logits.numpy()).all()
