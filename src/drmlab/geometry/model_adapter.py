"""What a built model exposes to the geometry instruments (``docs/geometry.md`` section 7), read-only.

:func:`model_view` runs a DRM model (``drmlab.models.drm``) on a batch of token windows and returns a
:class:`ModelView`: the states it visits, its block starts and block paths, the velocities it
took, and three callables on one state z [d_state] -- the model's metric (gamma, U) (the relational
metric, or with ``metric="pullback"`` the emitter's pullback as gamma = 0, U = B^T), the learned
directions and gates, and the state -> logits map (the emitter behind the state's read-out). Nothing
is changed in the model; the callables go through the model's own modules, so they see exactly what
the forward pass sees (toroidal read-outs included).

Instruments that a model cannot serve are named in ``not_applicable`` with the reason, so a model
without a metric (SSM_CONTROL, J_NO_METRIC) still gets the pullback, strata of the pullback and
topology. A model outside the DRM family has no latent state for the instruments to read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["INSTRUMENTS", "ModelView", "model_view", "unsupported_line"]

# instrument -> what it needs from the model
INSTRUMENTS = {
    "metric": "a learned metric G(z)",
    "strata": "a learned metric or an emitter",
    "pullback": "an emitter (state -> logits)",
    "agreement": "a learned metric and an emitter",
    "connection": "a learned metric G(z) (holonomy); directions V_i(z) too for their transport",
    "geodesics": "a learned metric G(z)",
    "topology": "visited states (and the geometry extra, gudhi)",
}


@dataclass
class ModelView:
    """The model as the instruments see it; tensors are detached, [B, ...] over windows."""

    name: str
    d_state: int
    vocab_size: int
    block_size: int
    states: torch.Tensor  # [B, T, d] output states
    block_starts: torch.Tensor  # [B, nb, d] z_s of each block
    velocities: torch.Tensor | None  # [B, T, d] delta_t / dt of the block path (None without geometry)
    metric_fn: Callable | None  # z [d] -> (gamma [d], U [d, r])
    directions_fn: Callable | None  # z [d] -> (V [n, d], gates [n])
    logits_fn: Callable  # z [..., d] -> logits [..., V]
    metric_config: dict = field(default_factory=dict)
    not_applicable: dict = field(default_factory=dict)

    def block_path(self, batch: int, block: int) -> torch.Tensor:
        """[L + 1, d]: the block's start state followed by the states of its positions."""
        lo = block * self.block_size
        hi = min(lo + self.block_size, self.states.shape[1])
        return torch.cat([self.block_starts[batch, block].unsqueeze(0), self.states[batch, lo:hi]])


def unsupported_line(model) -> str:
    name = getattr(model, "model_name", type(model).__name__)
    return (
        f"{name} is not a DRM-family model: it has no latent state the geometry instruments read, so none of "
        f"{', '.join(INSTRUMENTS)} applies"
    )


@torch.no_grad()
def model_view(model, tokens: torch.Tensor) -> ModelView:
    """The :class:`ModelView` of ``model`` (eval mode, full naturalisation) on tokens [B, T].

    Raises ValueError with :func:`unsupported_line` for a model outside the DRM family."""
    from drmlab.models.drm import DRMModel

    if not isinstance(model, DRMModel):
        raise ValueError(unsupported_line(model))  # noqa: TRY004 -- the CLI reports a ValueError in one line
    c = model.config
    states, record = model.states(tokens)
    batch, length, d = states.shape
    block = 1 if c.sequence_mode == "recurrent" else c.block_size
    starts = [model.initial_state(batch).to(states.dtype)]
    starts += [states[:, b * block - 1] for b in range(1, -(-length // block))]
    velocities = torch.cat([g.velocity for g in record], dim=1) if record else None

    metric_fn = directions_fn = None
    metric = model.transition.metric  # the relational metric module, or the pullback (docs/geometry.md section 9)
    if metric is not None:

        def metric_fn(z):
            return metric(model.read(z))

    if model.direction_field is not None:

        def directions_fn(z):
            return model.direction_field(model.read(z))

    def logits_fn(z):
        return model.emitter(model.read(z))

    missing = {}
    if metric_fn is None:
        why = f"{model.model_name} has no learned metric"
        for name in ("metric", "agreement", "connection", "geodesics"):
            missing[name] = why
    elif directions_fn is None:
        missing["connection.transport"] = f"{model.model_name} has no learned directions (holonomy still applies)"
    if c.metric == "pullback":
        missing["agreement"] = (
            f"{model.model_name}'s metric is the decoder pullback itself (metric='pullback'): they agree by construction"
        )
    return ModelView(
        name=model.model_name,
        d_state=d,
        vocab_size=c.vocab_size,
        block_size=block,
        states=states.detach(),
        block_starts=torch.stack(starts, dim=1).detach(),
        velocities=None if velocities is None else velocities.detach(),
        metric_fn=metric_fn,
        directions_fn=directions_fn,
        logits_fn=logits_fn,
        metric_config={
            "metric": c.metric,
            "metric_diagonal": c.metric_diagonal,
            "metric_rank": c.metric_rank,
            "metric_eps": c.metric_eps,
            "metric_damping": c.metric_damping,
            "has_metric": c.has_metric,
            "dt": c.dt,
        },
        not_applicable=missing,
    )
