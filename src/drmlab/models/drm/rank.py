r"""Variable rank (``docs/variable-rank.md`` sections 2-4; upstream ASM-VR): the causal rank controller,
the prefix mask of one block, the soft-gate temperature curriculum and the rank losses.

Per block k, from the embedding e of the block's *first* token only (never the state):

    l = W_c e + b_c,   r = clamp(#{i : sigmoid(l_i) >= tau}, r_min, d_state),   m_i = 1[i < r]

so the block keeps its first r state coordinates. Trained (``rank_policy="adaptive"``), the mask applied
is m + (g - detach(g)) with the soft gates g = sigmoid((l - logit tau) / T): the value is m exactly, the
gradient reaches the controller through g (coordinate i's gate through prefix slot i). The
curriculum sets T, the budget target and the loss weights from the optimizer step (section 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import DRMConfig

__all__ = ["RankController", "RankMask", "RankSchedule", "rank_losses", "rank_schedule"]

SATURATED_LOGIT = 20.0  # a frozen controller's bias: sigmoid(+-20) is on either side of any usable threshold


class RankController(nn.Module):
    """Section 2: the score head W_c [d_state x d_token], b_c, and the rank it implies.

    ``full`` and ``fixed`` are frozen (W_c = 0, bias +20 on the kept prefix, -20 after it); ``adaptive``
    starts with W_c = 0 and every bias at logit(rank_open_probability), so every coordinate is open."""

    def __init__(self, c: DRMConfig):
        super().__init__()
        self.d_state, self.minimum, self.policy, self.fixed = c.d_state, c.rank_min, c.rank_policy, c.rank_fixed
        self.threshold = min(max(float(c.rank_threshold), 1e-6), 1 - 1e-6)
        self.score_head = nn.Linear(c.d_token, c.d_state)
        with torch.no_grad():
            self.score_head.weight.zero_()
            if c.rank_policy == "adaptive":
                p = c.rank_open_probability
                self.score_head.bias.fill_(math.log(p / (1 - p)))
            else:
                kept = c.d_state if c.rank_policy == "full" else c.rank_fixed
                self.score_head.bias.fill_(-SATURATED_LOGIT)
                self.score_head.bias[:kept] = SATURATED_LOGIT
        if c.rank_policy != "adaptive":
            self.requires_grad_(False)

    @property
    def trainable(self) -> bool:
        return self.score_head.weight.requires_grad

    def decide(self, e_first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ranks [...] int64, logits [..., d_state] or None) for first-token embeddings [..., d_token].

        A frozen policy's rank is its setting (d_state or ``rank_fixed``), whatever weights a checkpoint
        loads into the head; the head's +-20 initialisation gives the same rank, so this only skips it."""
        if self.policy == "adaptive":
            logits = self.logits(e_first)
            return self.ranks(logits), logits
        kept = self.d_state if self.policy == "full" else self.fixed
        return torch.full(e_first.shape[:-1], kept, dtype=torch.long, device=e_first.device), None

    def logits(self, e_first: torch.Tensor) -> torch.Tensor:
        """l [..., d_state] from the first tokens' embeddings [..., d_token], in float32 or wider with
        autocast off (a rank decided in bf16 could differ between the parallel pass and a step)."""
        dtype = torch.promote_types(e_first.dtype, torch.float32)
        with torch.autocast(device_type=e_first.device.type, enabled=False):
            w, b = self.score_head.weight.to(dtype), self.score_head.bias.to(dtype)
            return F.linear(e_first.to(dtype), w, b)

    def ranks(self, logits: torch.Tensor) -> torch.Tensor:
        """r = clamp(#{i : sigmoid(l_i) >= tau}, r_min, d_state), int64 [...]."""
        count = (torch.sigmoid(logits) >= self.threshold).sum(-1)
        return count.clamp(min=self.minimum, max=self.d_state)

    def soft_gates(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """g = sigmoid((l - logit tau) / T) [..., d_state]."""
        tau = self.threshold
        return torch.sigmoid((logits - math.log(tau / (1 - tau))) / temperature)


@dataclass
class RankMask:
    """The prefix mask of one block over a state of ``width`` coordinates (d_state in the masked form;
    the batch's largest rank in the sliced form, section 5).

    ``keep`` [B, 1, W] is 1[i < r_b]; ``surrogate`` [B, 1, W] is g - detach(g) (zero in value) where the
    controller is trained, else None; ``sliced`` is the width handed to the components (None: full)."""

    ranks: torch.Tensor  # [B] int64
    keep: torch.Tensor  # [B, 1, W] bool
    surrogate: torch.Tensor | None
    sliced: int | None

    @classmethod
    def of(cls, ranks: torch.Tensor, d_state: int, sliced: bool, gates: torch.Tensor | None = None) -> RankMask:
        """The mask of ranks [B]; ``sliced``: on the batch's largest rank only; ``gates`` [B, d_state]: the
        soft gates whose straight-through surrogate the projection carries (masked form only)."""
        width = int(ranks.max()) if sliced else d_state
        keep = (torch.arange(width, device=ranks.device) < ranks.unsqueeze(-1)).unsqueeze(1)
        surrogate = None if gates is None else (gates - gates.detach()).unsqueeze(1)
        return cls(ranks, keep, surrogate, width if width < d_state else None)

    @property
    def width(self) -> int:
        return self.keep.shape[-1]

    def hard(self, x: torch.Tensor) -> torch.Tensor:
        """x outside the prefix set to 0 by a select (a non-finite value there does not survive as 0 * inf).
        x [B, W] or [B, N, W]."""
        keep = self.keep[:, 0] if x.dim() == 2 else self.keep
        return torch.where(keep, x, x.new_zeros(()))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """P(x): :meth:`hard`, plus x (g - detach(g)) where the controller is trained (value unchanged)."""
        out = self.hard(x)
        if self.surrogate is not None:
            out = out + x * (self.surrogate[:, 0] if x.dim() == 2 else self.surrogate).to(x.dtype)
        return out

    def enter(self, z: torch.Tensor) -> torch.Tensor:
        """The block start: z [B, W'] cut or zero-padded to this block's width, then projected."""
        return self.project(fit_width(z, self.width))


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """x [..., W'] cut to its first ``width`` coordinates or padded with zeros to them."""
    have = x.shape[-1]
    if have == width:
        return x
    return x[..., :width] if have > width else F.pad(x, (0, width - have))


@dataclass
class RankSchedule:
    """Section 4 at one step: the soft-gate temperature, the budget target (coordinates) and the weights."""

    temperature: float
    target: float
    budget_weight: float
    binary_weight: float
    switch_weight: float


def rank_schedule(c: DRMConfig, step: int | None) -> RankSchedule:
    """The curriculum on the optimizer step n (None: evaluation, the hardened end state).

    n < W: target d, T0, no loss. W <= n < W + R (progress p): target d + p (f d - d), budget p lambda_b,
    switch p lambda_s, binary 0, T0. Then (progress q over H): target f d, T = T0 + q (T1 - T0), budget
    lambda_b, binary q lambda_bin, switch lambda_s."""
    d, goal = float(c.d_state), c.rank_target_fraction * c.d_state
    t0, t1 = c.rank_temperature_initial, c.rank_temperature_final
    warmup, ramp, harden = c.rank_warmup_steps, c.rank_ramp_steps, c.rank_hardening_steps
    if step is not None and step < warmup:
        return RankSchedule(t0, d, 0.0, 0.0, 0.0)
    if step is not None and step < warmup + ramp:
        p = (step - warmup) / ramp
        return RankSchedule(t0, d + p * (goal - d), p * c.rank_budget_weight, 0.0, p * c.rank_switch_weight)
    q = 1.0 if step is None or harden <= 0 else min((step - warmup - ramp) / harden, 1.0)
    return RankSchedule(t0 + q * (t1 - t0), goal, c.rank_budget_weight, q * c.rank_binary_weight, c.rank_switch_weight)


def rank_losses(gates: torch.Tensor, schedule: RankSchedule) -> dict[str, torch.Tensor]:
    """Section 4 over the soft gates [B, blocks, d_state]: budget (mean_{b,k} sum_i g - target)^2,
    binary mean g (1 - g), switch mean |g_k - g_{k-1}| over consecutive blocks (0 with one block);
    ``loss_aux`` is their weighted sum."""
    budget = (gates.sum(-1).mean() - schedule.target) ** 2
    binary = (gates * (1 - gates)).mean()
    switch = (gates[:, 1:] - gates[:, :-1]).abs().mean() if gates.shape[1] > 1 else gates.new_zeros(())
    total = schedule.budget_weight * budget + schedule.binary_weight * binary + schedule.switch_weight * switch
    return {"loss/rank_budget": budget, "loss/rank_binary": binary, "loss/rank_switch": switch, "loss_aux": total}
