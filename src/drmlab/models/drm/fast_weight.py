r"""The fast-weight memory of the DRM (``docs/drm.md`` section V): a key-addressed associative
matrix read and written after the block path, the upstream project's ASM-C2-FW memory and, in its
durable form, ASM-CM (``../shared/notes/upstream-asm.md`` section 3).

Per position t, from the block path's state z_t, the token embedding e_t and the previous token's
e_{t-1} (zero before the first token), with h_t = [z_t; e_t; e_{t-1}] and n(x) = x / max(|x|, 1e-12):

    q_t = n(W_k e_t),  k_t = n(W_k e_{t-1})          one key projection for the read and the write
    v_t = tanh(W_v [z_t; e_t] + b_v)
    r_t = M_{t-1}^T q_t + beta C_{t-1}^T q_t         read the matrices *before* the write at t
    z'_t = z_t + rho sigmoid(w_r . h_t + b_r) W_o r_t
    g_t = H(sigmoid(w_w . h_t + b_w)),   f_t = sigmoid(w_f . h_t + b_f)
    M_t = f_t M_{t-1} + g_t k_t (v_t - M_{t-1}^T k_t)^T                     fast: decays
    C_t = C_{t-1} + kappa g_t c_t k_t (v_t - C_{t-1}^T k_t)^T,  c_t = H(sigmoid(w_c . h_t + b_c))   slow

So position t stores the association "previous token -> (current state, token)", and a later
occurrence of that token reads it back.  H is the hard write gate 1[g >= threshold] with a
straight-through gradient (dH/dg = 1; threshold 0: the soft gate).  The slow matrix C and its
consolidation gate exist only in the durable form.  z' goes to the emitter, and the block's last
z' starts the next block; (M, C, e_{t-1}) start from zeros and cross every block.

Both recurrences are the gated delta rule (:func:`drmlab.ops.delta_rule`; C with retention 1,
``decay=None``), each run over a whole block in one call: every input of the memory in a block is
known before its recurrence runs.  With ``fast_weight_compute_fp32`` everything
here runs in float32 (or wider) with autocast off and z' is cast back to the caller's dtype; with
``fast_weight_state_fp32`` the state (M, C, e_{t-1}) is kept in float32 (or wider) between blocks
and in the decoding state.

Initialisation (upstream section 3.2): PyTorch's defaults except W_o = 0 (the memory starts as a
no-op), forget bias 4.0, write bias 0.0 (durable) or -2.0.

The value width d_v is ``fast_weight_value_dim`` (0: d_v = d_k).  The rank-aware form (upstream
ASM-CM-VR, ``docs/variable-rank.md`` section 6) has d_v = d_state, so the value axis is aligned with the
state's coordinates and the block's prefix mask Pi applies to both: the matrices' value columns at the
block start, the values v_t and the read-out's output are masked (by a select: no straight-through
gradient reaches the controller through the memory); the keys, gates and tokens are not.

With ``fast_weight_epistemic_gates`` (ASM-CM-E, section V.4; :mod:`.epistemic`) the read gate is
multiplied by a confidence c^r_t and the hard write gate g_t by c^w_t (so C's writes, which use g_t,
are scaled too), both computed from h_t; their modules are built after every other layer here, so the
rest of the memory draws the same initial values as without them. With the rank-aware form the gates read
the same masked h_t as the memory's gates (the sliced form splits their first layer alike).

Two evaluation-time switches, plain attributes (no parameter, buffer or config field; both False by
default, when the forward is the one above), serve the recall controls of docs/mqar.md section 8.1:
``read_off`` returns z' = z (the correction term is not added) and ``write_off`` sets g_t = 0 at
every position, so nothing enters M or C (M only decays, C stays as it was). Both refuse train mode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.ops.delta_rule import delta_rule

from .config import DRMConfig
from .epistemic import EpistemicGates
from .rank import fit_width

__all__ = ["FastWeightMemory", "FastWeightState"]


def _split_linear(x_state, x_rest, layer: nn.Linear, d_read: int, width: int, rows: int | None, cast) -> torch.Tensor:
    """layer([x_state; x_rest]) where x_state holds the state's first ``width`` coordinates only (the rest
    zero) and, with ``rows``, only the first ``rows`` outputs (docs/variable-rank.md section 5)."""
    weight, bias = cast(layer.weight), None if layer.bias is None else cast(layer.bias)
    if rows is not None:
        weight, bias = weight[:rows], None if bias is None else bias[:rows]
    return F.linear(x_state, weight[:, :width]) + F.linear(x_rest, weight[:, d_read:], bias)


READ, WRITE, FORGET, CONSOLIDATE = range(4)  # rows of the gate layer
FORGET_BIAS = 4.0
WRITE_BIAS = {True: 0.0, False: -2.0}  # durable, not


@dataclass
class FastWeightState:
    """The memory between positions, the same size at every length: the fast matrix M
    [B, d_k, d_v], the slow matrix C (None unless durable) and the previous token's embedding
    e_{t-1} [B, d_token]."""

    fast: torch.Tensor
    slow: torch.Tensor | None
    previous_token: torch.Tensor


def straight_through_threshold(gate: torch.Tensor, threshold: float) -> torch.Tensor:
    """1[gate >= threshold] forward with the identity's gradient; the soft gate when threshold is 0.

    Written as hard + (gate - gate.detach()): the forward value is exactly 0 or 1."""
    if threshold <= 0:
        return gate
    hard = (gate >= threshold).to(gate.dtype)
    return hard + (gate - gate.detach())


class FastWeightMemory(nn.Module):
    """Section V: the fast-weight matrix memory (and its durable slow matrix) after the block path."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        d_k, d_v = c.fast_weight_dim, c.fast_weight_values
        self.durable, self.threshold = c.fast_weight_durable, c.fast_weight_write_threshold
        self.read_scale, self.slow_read_scale = c.fast_weight_read_scale, c.fast_weight_slow_read_scale
        self.consolidation = c.fast_weight_consolidation
        self.state_fp32, self.compute_fp32 = c.fast_weight_state_fp32, c.fast_weight_compute_fp32
        self.d_key, self.d_value, self.d_token, self.d_read = d_k, d_v, c.d_token, c.d_read
        self.key = nn.Linear(c.d_token, d_k, bias=False)  # W_k: queries and keys
        self.value = nn.Linear(c.d_read + c.d_token, d_v)  # W_v, b_v on [z; e]
        self.gates = nn.Linear(c.d_read + 2 * c.d_token, 4 if self.durable else 3)  # read, write, forget(, consolidate)
        self.read_out = nn.Linear(d_v, c.d_state, bias=False)  # W_o
        with torch.no_grad():
            self.read_out.weight.zero_()
            self.gates.bias[FORGET] = FORGET_BIAS
            self.gates.bias[WRITE] = WRITE_BIAS[self.durable]
        # built last: the layers above draw what they draw without the epistemic gates
        self.confidence = EpistemicGates(c) if c.fast_weight_epistemic_gates else None
        self.read_off = self.write_off = False  # evaluation-time controls (docs/mqar.md section 8.1)

    def _state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.promote_types(dtype, torch.float32) if self.state_fp32 else dtype

    def init_state(self, batch: int, like: torch.Tensor) -> FastWeightState:
        """Zeros: the memory before the first token, for a model whose weights are like ``like``."""
        dtype = self._state_dtype(like.dtype)
        matrix = torch.zeros(batch, self.d_key, self.d_value, dtype=dtype, device=like.device)
        return FastWeightState(
            fast=matrix,
            slow=matrix.clone() if self.durable else None,
            previous_token=torch.zeros(batch, self.d_token, dtype=dtype, device=like.device),
        )

    def forward(
        self,
        z: torch.Tensor,
        z_read: torch.Tensor,
        e: torch.Tensor,
        state: FastWeightState,
        return_confidence: bool = False,
        rank=None,
    ):
        """z' [B, L, d_state] and the memory after the L positions, from the block path's states z
        [B, L, d_state] (read as z_read [B, L, d_read]), the tokens' embeddings e [B, L, d_token] and
        the memory before them.  The state passed in is not modified.  ``return_confidence``: a third
        result, the epistemic gates' (c^r, c^w) [B, L] each (None without them).  ``rank``: the block's
        :class:`~drmlab.models.drm.rank.RankMask` (the rank-aware form; z then has its width, and the
        state keeps d_v columns, zero outside the prefix)."""
        width = None if rank is None else rank.sliced
        if (self.read_off or self.write_off) and self.training:
            raise RuntimeError(
                "the fast-weight memory's read_off / write_off are evaluation controls: not in train mode"
            )
        if self.compute_fp32:
            dtype = torch.promote_types(torch.promote_types(z.dtype, e.dtype), torch.float32)
            region = torch.autocast(device_type=z.device.type, enabled=False)
        else:
            dtype, region = None, contextlib.nullcontext()

        def cast(x):
            return x if dtype is None else x.to(dtype)

        def linear(x, layer):
            return F.linear(x, cast(layer.weight), None if layer.bias is None else cast(layer.bias))

        with region:
            z_read, e = cast(z_read), cast(e)
            previous = torch.cat([state.previous_token.to(e.dtype).unsqueeze(1), e[:, :-1]], dim=1)
            projected = linear(e, self.key)
            projected_previous = torch.cat([linear(previous[:, :1], self.key), projected[:, :-1]], dim=1)
            query = F.normalize(projected, dim=-1, eps=1e-12)
            key = F.normalize(projected_previous, dim=-1, eps=1e-12)
            if width is None:
                value = torch.tanh(linear(torch.cat([z_read, e], dim=-1), self.value))
                h = torch.cat([z_read, e, previous], dim=-1)
                gates = torch.sigmoid(linear(h, self.gates))
                first = None
            else:  # h_t = [z_t; e_t; e_{t-1}] with z_t on the prefix only: each first layer split (section 5)
                rest = torch.cat([e, previous], dim=-1)
                value = torch.tanh(_split_linear(z_read, e, self.value, self.d_read, width, width, cast))
                gates = torch.sigmoid(_split_linear(z_read, rest, self.gates, self.d_read, width, None, cast))
                h = None

                def first(layer):
                    return _split_linear(z_read, rest, layer, self.d_read, width, None, cast)

            read_gate = gates[..., READ]
            fast0, slow0 = state.fast, state.slow
            if rank is not None:  # Pi on the values and on the matrices' value columns (section 6)
                value = rank.hard(value)
                fast0 = rank.hard(fast0 if width is None else fast0[..., :width])
                slow0 = None if slow0 is None else rank.hard(slow0 if width is None else slow0[..., :width])
            write = straight_through_threshold(gates[..., WRITE], self.threshold)
            confidence = None
            if self.confidence is not None:  # section V.4: g^r <- g^r c^r, g^w <- H(g^w) c^w
                confidence = self.confidence(h, linear, first)
                read_gate, write = read_gate * confidence[0], write * confidence[1]
            if self.write_off:  # section 8.1 of docs/mqar.md: g_t = 0, nothing is written into M or C
                write = torch.zeros_like(write)
            retain = gates[..., FORGET]
            read, fast = delta_rule(query, key, value, retain, write, fast0)
            slow = None
            if self.durable:  # the slow matrix: retention 1 (decay None), writes where both gates open
                consolidate = straight_through_threshold(gates[..., CONSOLIDATE], self.threshold)
                slow_read, slow = delta_rule(query, key, value, None, self.consolidation * write * consolidate, slow0)
                read = read + self.slow_read_scale * slow_read
            read = read.to(value.dtype)
            if width is None:
                read_out = linear(read, self.read_out)
            else:
                read_out = F.linear(read, cast(self.read_out.weight)[:width, :width])
            correction = self.read_scale * read_gate.unsqueeze(-1) * read_out
            if rank is not None:
                correction = rank.hard(correction)
            out = z if self.read_off else (cast(z) + correction).to(z.dtype)
        state_dtype = self._state_dtype(e.dtype)

        def kept(matrix):  # the carried state keeps all d_v columns (zero outside the prefix)
            return None if matrix is None else fit_width(matrix, self.d_value).to(state_dtype)

        new_state = FastWeightState(fast=kept(fast), slow=kept(slow), previous_token=e[:, -1].to(state_dtype))
        return (out, new_state, confidence) if return_confidence else (out, new_state)
