r"""The pure-torch backend ("torch") of :func:`drmlab.ops.linear_scan`: a log-depth scan that
runs on any device.

It evaluates the recurrence of ``docs/drm.md`` section 9,

    m_t = f_t m_{t-1} + u_t,

by composing the affine steps x -> f x + u pairwise, never one after the other:

    (f_b, u_b) o (f_a, u_a) = (f_b f_a,  u_b + f_b u_a)        (step a first, then step b).

**Method** (an in-place odd-even scan, Blelloch-style, on strided views; :func:`scan_in_place`).
The states sit on a chain whose link k, between steps k and k + 1, carries the gate f_{k+1}:

* *Up-sweep.*  At each level the chain is cut into neighbouring pairs; the later element of
  every pair absorbs the earlier one through their link (one ``addcmul_``), the later elements
  -- a stride-2 view -- form the next level, half as long, and its links are the products of
  two consecutive links (one multiplication, into a new tensor of half the length).  After
  ceil(log2 T) levels one element remains.
* *Down-sweep.*  Going back up, the later elements of a level already hold finished states; each
  earlier element except the first becomes its own composite plus its link times the finished
  state just before it (one ``addcmul_``).

So a call dispatches a few torch operations per level -- O(log T) in all, not O(T) -- and the
work is O(T): every level touches half as many elements as the one below it.  An odd length
just leaves one element unpaired at that level; nothing is padded.  The finest links are a view
of the gates, never copied nor written.

**Exactness.**  Only products and sums of the gates and inputs are formed: nothing is divided
by a cumulative product of gates and no logarithm of a gate is taken, so an exact zero gate
cuts the past exactly (every product containing it is exactly zero), negative and complex gates
need nothing special, and a product of many small gates that underflows to zero is the exact
limit.  The result differs from the sequential loop only in the order of rounding: about one
rounding per level, ~1e-16 relative in float64.  One caveat of every scan that forms products:
a product of gates with |f| > 1 can overflow where the sequential loop stays finite (gates
1e300, 1e300 on a zero state: inf * 0 = nan); the recurrences of this library have |f| <= 1.

**Backward** (the reverse scan, same method run from the end):

    g_t = dm_t + conj(f_{t+1}) g_{t+1},   g_{T-1} = dm_{T-1},
    du_t = g_t,   df_t = g_t conj(m_{t-1}),   dinit = conj(f_0) g_0

(conjugates: torch's convention for complex gradients).  It is the same scan run from the end
over the same chain: the link between t and t + 1 carries conj(f_{t+1}), a view again.

**Memory.**  What the custom operator's autograd (:mod:`.op`) keeps for the backward is only the
gates f (the caller's tensor, or a broadcast view of it), the states m (the output) and init:
O(B T D), nothing per level.  Inside a call the states are updated in place in the output
buffer (the forward's m, the backward's grad_u) and the coarser levels' links -- T/2 + T/4 + ...
< T steps at the gates' own size (a gate broadcast over the batch or channel axis stays
broadcast) -- live only until the call returns.

Inputs: [B, T, D] tensors of one dtype (float32, float64, complex64 or complex128 -- the
dispatcher computes bfloat16 / float16 in float32), broadcast (stride-0) views allowed; init
[B, D] or None.  Nothing of this module has been run on a GPU in this repository's tests; it is
plain torch, tested on the CPU against the float64 sequential loop.
"""

from __future__ import annotations

import torch

__all__ = ["forward", "backward", "unavailable", "DENSE_INPUTS", "scan_in_place"]

# reads broadcast (stride-0) views as they are
DENSE_INPUTS = False


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Never: plain torch operations run on every device and dtype."""
    return None


def _up_slices(n: int, reverse: bool) -> tuple[slice, slice, slice, slice, slice]:
    """The up-sweep's slices of one level of ``n`` states (and its n - 1 links), scan order
    forward or from the end (``reverse``).  Pairs of neighbours in scan order: the ``later``
    element of each pair absorbs the ``earlier`` one through the link between them
    (``pair_link``; n // 2 of each); the later elements form the next level, whose n // 2 - 1
    links are the products of the links at ``link_a`` and ``link_b`` (two consecutive links
    joining neighbouring pairs)."""
    half = n // 2
    if not reverse:
        # pairs (0, 1), (2, 3), ...; with odd n the last element is left unpaired
        return (
            slice(1, None, 2),
            slice(0, n - 1, 2),
            slice(0, None, 2),
            slice(1, 2 * half - 2, 2),
            slice(2, 2 * half - 1, 2),
        )
    # scan order n-1, n-2, ...: pairs (n-1 -> n-2), (n-3 -> n-4), ...; with odd n the element
    # at 0 is left unpaired
    odd = n % 2
    return (
        slice(odd, n - 1, 2),
        slice(odd + 1, None, 2),
        slice(odd, n - 1, 2),
        slice(odd, n - 3, 2),
        slice(odd + 1, n - 2, 2),
    )


def _down_slices(n: int, reverse: bool) -> tuple[slice, slice, slice]:
    """The down-sweep's slices of one level of ``n`` states: the ``targets`` (the elements
    absorbed on the way up, and an unpaired one, except the first in scan order: (n - 1) // 2
    of them), the finished state ``preceding`` each in scan order, and the ``link`` between."""
    if not reverse:
        return slice(2, None, 2), slice(1, n - 1, 2), slice(1, None, 2)
    odd = n % 2
    return slice(1 - odd, n - 1, 2), slice(2 - odd, None, 2), slice(1 - odd, n - 1, 2)


def scan_in_place(links: torch.Tensor, states: torch.Tensor, reverse: bool = False) -> None:
    r"""Run the chain recurrence over dim 1 of ``states`` in place, started from zero.

    ``states`` [B, n, D] holds the inputs u on entry and the states s on return; ``links``
    [B or 1, n - 1, D or 1] holds the gate a_k of the link between positions k and k + 1:

        forward:  s_0 = u_0,          s_{k+1} = a_k s_k + u_{k+1}
        reverse:  s_{n-1} = u_{n-1},  s_k = a_k s_{k+1} + u_k.

    So for m_t = f_t m_{t-1} + u_t the links are f[:, 1:] and for the backward's
    g_t = conj(f_{t+1}) g_{t+1} + dm_t they are conj(f)[:, 1:] -- views, never written (the
    coarser levels' links are new tensors of n / 2, n / 4, ... steps).  ``states`` must be a
    plain buffer (no overlapping or broadcast memory); ``links`` may be any view.
    """
    levels = []
    a, s = links, states
    while s.shape[1] > 1:
        n = s.shape[1]
        later, earlier, pair_link, link_a, link_b = _up_slices(n, reverse)
        s[:, later].addcmul_(a[:, pair_link], s[:, earlier])
        levels.append((a, s))
        # the next level's links (none when it is a single element)
        a = a[:, link_a] * a[:, link_b] if n // 2 > 1 else a[:, :0]
        s = s[:, later]
    for a, s in reversed(levels):
        targets, preceding, link = _down_slices(s.shape[1], reverse)
        s[:, targets].addcmul_(a[:, link], s[:, preceding])


def _compact(f: torch.Tensor) -> torch.Tensor:
    """The view of f without the batch and channel axes it is only broadcast along (stride 0),
    cut to size 1: the links built from it stay at the gates' own size."""
    batch = 1 if f.stride(0) == 0 else f.shape[0]
    channels = 1 if f.stride(2) == 0 else f.shape[2]
    return f[:batch, :, :channels]


def _buffer(x: torch.Tensor) -> torch.Tensor:
    """A new dense tensor holding x's values (conjugate / negative views resolved)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def forward(f: torch.Tensor, u: torch.Tensor, init: torch.Tensor | None) -> torch.Tensor:
    """The states m [B, T, D]: init is folded into the first step (m_0 = f_0 init + u_0, as the
    loop computes it), then the log-depth scan runs from zero."""
    states = _buffer(u)
    T = states.shape[1]
    if T == 0:
        return states
    if init is not None:
        states[:, 0].addcmul_(f[:, 0], init)
    if T > 1:
        scan_in_place(_compact(f)[:, 1:], states)
    return states


def backward(
    f: torch.Tensor, m: torch.Tensor, init: torch.Tensor | None, dm: torch.Tensor, need_f: bool, need_init: bool
):
    """(du, df or None, dinit or None) from the gates f, the states m and their gradient dm:
    the reverse log-depth scan of g_t = dm_t + conj(f_{t+1}) g_{t+1}."""
    grad_u = _buffer(dm)
    T = grad_u.shape[1]
    need_init = need_init and init is not None
    if T == 0:
        return grad_u, (torch.empty_like(m) if need_f else None), (torch.zeros_like(init) if need_init else None)
    gates_c = _compact(f)
    gates_c = gates_c.conj() if gates_c.is_complex() else gates_c
    if T > 1:
        scan_in_place(gates_c[:, 1:], grad_u, reverse=True)  # g_t's gate is conj(f_{t+1})
    grad_f = None
    if need_f:
        m_c = m.conj() if m.is_complex() else m
        grad_f = torch.empty_like(grad_u)
        torch.mul(grad_u[:, 1:], m_c[:, :-1], out=grad_f[:, 1:])
        if init is None:
            grad_f[:, 0].zero_()
        else:
            torch.mul(grad_u[:, 0], init.conj() if init.is_complex() else init, out=grad_f[:, 0])
    grad_init = gates_c[:, 0] * grad_u[:, 0] if need_init else None  # [B, D], as grad_u
    return grad_u, grad_f, grad_init
