"""The stage contract of the DRM block path (``docs/drm.md`` sections 7-9 and A.4.5).

A block's states pass through the model's stages in order; each stage has a parallel
:meth:`Stage.forward` over the whole block and a one-token :meth:`Stage.step` over its own
decoding state, and the model's ``forward`` and ``step`` are one loop over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..rank import RankMask
from ..transition import Transition


@dataclass
class BlockGeometry:
    """What one block (or one recurrent step) leaves for the losses and diagnostics."""

    length: int
    gates: torch.Tensor | None  # [B, n] block-start gates (None without a direction field)
    directions: torch.Tensor | None  # [B, n, d]
    gamma: torch.Tensor | None  # [B, d] metric diagonal (None without a metric)
    u_factor: torch.Tensor | None  # [B, d, r]
    rho: torch.Tensor  # [B] risk mass
    velocity: torch.Tensor  # [B, L, d] delta_t / dt (includes the bound's effect)
    refined_velocity: torch.Tensor | None = None  # [B, L, d] of the solver-refined states
    solver_residual: torch.Tensor | None = None  # [B, L] |Phi(X) - X| at the last iteration
    consistency: tuple | None = None  # {"block_consistency": (sum, count), ...}
    fast_weight_confidence: tuple | None = None  # (c^r, c^w) [B, L] each: the epistemic gates (section V.4)


@dataclass
class Block:
    """The running value of the block path over one block: L positions in ``forward``, one in ``step``.

    Each stage replaces ``z``; the geometry stage also leaves its increments, the block-start
    dimD and risk (the mixer's features) and the transition's token part (the solver's and the
    consistency loss's). ``record`` is the forward pass's geometry record (None in ``step``).
    """

    start: torch.Tensor  # z_s [B, d]: the block's start state
    tokens: torch.Tensor  # e [B, L, d_token]: the block's token embeddings
    strength: float  # the naturalization strength s
    record: list | None
    anchor: torch.Tensor  # z_s as [B, 1, d]: the state before the block's first position
    z: torch.Tensor  # [B, L, d], or [B, 1, d] while no stage has spread it over the positions
    delta: torch.Tensor | None = None  # [B, L, d] the geometry stage's increments
    dim_d: torch.Tensor | None = None  # [B]
    rho: torch.Tensor | None = None  # [B]
    flow_tokens: torch.Tensor | None = None  # [B, L, H] the transition's token part
    rank: RankMask | None = None  # the block's prefix mask (variable rank; None: every coordinate)
    shared: dict | None = None  # what every block of one forward pass shares (see ``once``)

    @classmethod
    def at(
        cls,
        start: torch.Tensor,
        tokens: torch.Tensor,
        strength: float,
        record: list | None,
        rank=None,
        shared: dict | None = None,
    ) -> Block:
        """A block before its first stage: every position still at the start state (already projected
        by ``rank``, where there is one). ``shared``: one dict for all the blocks of a forward pass
        (None: nothing is shared, as in ``step``)."""
        anchor = start.unsqueeze(1)  # one view for every stage (one gradient path back to z_s)
        return cls(start, tokens, strength, record, anchor, z=anchor, rank=rank, shared=shared)

    def once(self, key: str, make):
        """``make()``, computed once per forward pass and shared by all its blocks (every call where
        nothing is shared). For weight views: a column slice of a weight taken in every block gives,
        in the backward, a zero-filled gradient the size of the whole weight per block; one view per
        pass gathers the blocks' gradients in the slice and fills once (the same sums, bit for bit).
        The key names the view and its width (blocks of another rank take their own)."""
        if self.shared is None:
            return make()
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    @property
    def width(self) -> int | None:
        """The state width the components compute on: None (all of d_state) unless the rank is sliced
        (``docs/variable-rank.md`` section 5)."""
        return None if self.rank is None else self.rank.sliced

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """An increment as it may enter the state: x itself, or its rank projection P(x)."""
        return x if self.rank is None else self.rank.project(x)

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def scalars(self) -> torch.Tensor:
        """(dimD, rho) [B, 2] at the block start; zeros on a geometry-free path."""
        batch = self.start.shape[0]
        dim_d = self.dim_d if self.dim_d is not None else self.start.new_zeros(batch)
        rho = self.rho if self.rho is not None else self.start.new_zeros(batch)
        return torch.stack([dim_d, rho], dim=-1)

    def spread(self) -> torch.Tensor:
        """``z`` over every position of the block, [B, L, d] (a copy where it was one state: see
        DRMStateInitializer)."""
        if self.z.shape[1] == 1 and self.length > 1:
            self.z = self.z.expand(self.z.shape[0], self.length, -1).contiguous()
        return self.z


class Stage(nn.Module):
    """One optional stage of the block path.

    * ``name``: what it is called (the model attribute it runs, where it has one).
    * ``token_part(e, width)``: what the stage needs from the tokens alone; ``forward`` gets it computed once
      for the whole sequence and cut to the block, ``step`` for the one token (None: nothing); ``width``:
      the widest state width of the pass where the rank is sliced (else None).
    * ``init_state(batch, like)``: the stage's state before the first token.
    * ``forward(block, part, state, keep)``: the block in parallel; replaces ``block.z`` and returns,
      when ``keep``, the state that stepping through the block would leave (else None).
    * ``step(block, part, state)``: one position (``block.z`` [B, 1, d]); returns the new state and
      never modifies the one passed in.
    * ``step_token_part(e)``: the ``part`` that ``step`` takes, from e [B, 1, d_token] (``token_part(e)``
      unless the fast step takes it as 2-D rows [B, H]).
    * ``step_reference(block, part, state)``: the plain form of ``step``. A stage with a fast ``step``
      (``stepping``: the same kernels, fewer dispatches, bit-identical) keeps its plain one here; the
      model runs it under autocast or in a reduced precision, and ``DRMModel.step_reference`` always.

    A stage's state is None at the start of every block ("fresh": the stage starts from the block's
    start state) unless ``crosses_blocks``; then the model hands it from block to block.

    A stage owns no parameters: the modules it runs stay the model's attributes (``mixer``, ``memory``,
    ``refinement.0``, ...), held here without being registered, so the parameter names and order, and
    with them every checkpoint and export, are those of the model without stages.
    """

    crosses_blocks = False

    def __init__(self, name: str, transition: Transition, **modules: nn.Module):
        super().__init__()
        self.name, self.transition, self.config = name, transition, transition.config
        self.uses = tuple(modules)
        for key, module in modules.items():
            object.__setattr__(self, key, module)  # used, not owned (see the class docstring)

    def extra_repr(self) -> str:
        return f"name={self.name!r}" + (f", uses={', '.join(self.uses)}" if self.uses else "")

    def token_part(self, e: torch.Tensor, width: int | None = None) -> torch.Tensor | None:
        return None

    def step_token_part(self, e: torch.Tensor) -> torch.Tensor | None:
        return self.token_part(e)

    def init_state(self, batch: int, like: torch.Tensor):
        return None

    def check_steppable(self) -> None:
        """Raise where the stage's parallel form cannot be continued one token at a time."""

    def forward(self, block: Block, part: torch.Tensor | None, state, keep: bool):
        raise NotImplementedError

    def step(self, block: Block, part: torch.Tensor | None, state):
        raise NotImplementedError

    def step_reference(self, block: Block, part: torch.Tensor | None, state):
        return self.step(block, part, state)
