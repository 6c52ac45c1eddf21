r"""The decoder pullback metric and its agreement with a learned metric (``docs/geometry.md`` section 3).

For a map f: z -> logits (R^d -> R^V) with p = softmax(f(z)) and J = df/dz [V, d],

    G_pb(z) = J^T F J,    F = diag(p) - p p^T,

so v^T G_pb v = Var_{y~p}[(J v)_y] is twice the second-order change of KL(p(z) || p(z + eps v))
per eps^2. F 1 = 0, so rank G_pb <= min(d, V - 1) exactly.

* :func:`pullback_metric`: the exact matrix, by reverse-mode autodiff (V vector-Jacobian products,
  batched with ``torch.func``); memory V x d per state.
* :func:`pullback_energy`: the exact v^T G_pb v along given vectors with one forward-mode product
  each (no V x d Jacobian): what the agreement diagnostic uses.
* :func:`pullback_estimate`: for large V, the Fisher identity G_pb = E_{y~p}[g_y g_y^T] with the
  score g_y = J^T (e_y - p): S sampled tokens, S vector-Jacobian products, unbiased, with its
  standard error (entrywise, from the sample) returned beside it.
* :func:`metric_agreement`: energy correlation and principal-subspace angles between a learned
  metric and G_pb.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from drmlab.ops import fisher_pullback

__all__ = [
    "MAX_EXACT_VOCAB",
    "PullbackEstimate",
    "fisher_matrix",
    "metric_agreement",
    "principal_angles",
    "pullback_auto",
    "pullback_energy",
    "pullback_estimate",
    "pullback_metric",
]

# Above this vocabulary the automatic choice (:func:`pullback_auto`) uses the estimator.
MAX_EXACT_VOCAB = 4096


def fisher_matrix(logits: torch.Tensor) -> torch.Tensor:
    """F = diag(p) - p p^T for logits [..., V]: the Fisher-Rao metric of the categorical in logit space."""
    p = torch.softmax(logits, dim=-1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def pullback_metric(f: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Exact J^T F J at states z [N, d] for f mapping [d] -> [V]: [N, d, d] (exactly symmetric).

    Computed as J^T diag(p) J - (J^T p)(J^T p)^T (``drmlab.ops.fisher_pullback``) from the Jacobian
    (``torch.func.jacrev``)."""
    from torch.func import jacrev, vmap

    def one(x):
        logits = f(x)
        return jacrev(f)(x), logits

    jac, logits = vmap(one)(z)  # [N, V, d], [N, V]
    return fisher_pullback(jac, logits)


def pullback_energy(f: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact v^T G_pb(z) v for z, v [N, d] (f maps [N, d] -> [N, V]): Var_p[J v], one JVP. [N]."""
    from torch.func import jvp

    logits, jv = jvp(f, (z,), (v,))
    p = torch.softmax(logits, dim=-1)
    mean = (p * jv).sum(-1, keepdim=True)
    return (p * (jv - mean).square()).sum(-1)


@dataclass
class PullbackEstimate:
    """A Monte Carlo G_pb: ``matrix`` [N, d, d], its entrywise standard error ``stderr`` [N, d, d],
    ``relative_error``: ||stderr||_F / ||matrix||_F per state [N], and the sample count."""

    matrix: torch.Tensor
    stderr: torch.Tensor
    relative_error: torch.Tensor
    samples: int


def pullback_estimate(
    f: Callable[[torch.Tensor], torch.Tensor],
    z: torch.Tensor,
    samples: int = 64,
    generator: torch.Generator | None = None,
) -> PullbackEstimate:
    """Unbiased G_pb from ``samples`` tokens y ~ p(z) per state: mean of g_y g_y^T, g_y = grad_z log p_y.

    Each score is one vector-Jacobian product, so the cost is S backward passes of f and d^2 memory,
    independent of V. The standard error of each entry is the sample standard deviation of g_i g_j
    over sqrt(S) (the error falls as S^-1/2)."""
    if samples < 2:
        raise ValueError(f"the estimator needs at least 2 samples for its error, got {samples}")
    from torch.func import vjp

    logits, pull = vjp(f, z)
    p = torch.softmax(logits.detach(), dim=-1)
    ys = torch.multinomial(p, samples, replacement=True, generator=generator)  # [N, S]
    scores = []
    for s in range(samples):
        cot = -p.clone()
        cot.scatter_add_(-1, ys[:, s : s + 1], torch.ones_like(ys[:, s : s + 1], dtype=p.dtype))
        scores.append(pull(cot)[0])
    g = torch.stack(scores, dim=1)  # [N, S, d]
    outer = g.unsqueeze(-1) * g.unsqueeze(-2)  # [N, S, d, d]
    mean = outer.mean(1)
    stderr = outer.std(1, unbiased=True) / math.sqrt(samples)
    rel = stderr.flatten(1).norm(dim=-1) / mean.flatten(1).norm(dim=-1).clamp_min(torch.finfo(mean.dtype).tiny)
    return PullbackEstimate(mean, stderr, rel, samples)


def pullback_auto(
    f,
    z,
    vocab_size: int,
    max_exact_vocab: int = MAX_EXACT_VOCAB,
    samples: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, str]:
    """(G_pb [N, d, d], how it was computed): exact up to ``max_exact_vocab``, else the estimator,
    and the note says so with its relative standard error."""
    if vocab_size <= max_exact_vocab:
        return pullback_metric(f, z), "exact (autodiff Jacobian)"
    est = pullback_estimate(f, z, samples, generator)
    return est.matrix, (
        f"estimated: the vocabulary ({vocab_size:,}) is above {max_exact_vocab:,}, so the "
        f"Fisher-identity estimator with {samples} samples per state is used (relative standard "
        f"error {float(est.relative_error.mean()):.3f})"
    )


def principal_angles(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Principal angles (radians, ascending) between the column spaces of a [..., d, k] and b [..., d, m]."""
    qa, _ = torch.linalg.qr(a)
    qb, _ = torch.linalg.qr(b)
    cos = torch.linalg.svdvals(qa.mT @ qb).clamp(-1.0, 1.0)
    return torch.arccos(cos)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(torch.argsort(x)).to(x.dtype)


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    denom = float(a.norm() * b.norm())
    return float((a * b).sum()) / denom if denom > 0 else float("nan")


def metric_agreement(g_learned: torch.Tensor, g_pullback: torch.Tensor, velocities: torch.Tensor, k: int) -> dict:
    """Agreement of a learned metric with the pullback at the same states.

    g_learned, g_pullback [N, d, d]; velocities [N, d] (one per state, e.g. the model's steps).
    Returns the Pearson correlation of log energies log v^T G v, their Spearman correlation, and the
    principal angles between the top-``k`` eigenvector subspaces of the two metrics (mean over
    states, radians; 0 = the same subspace, pi/2 = orthogonal)."""
    e_learned = torch.einsum("ni,nij,nj->n", velocities, g_learned, velocities)
    e_pb = torch.einsum("ni,nij,nj->n", velocities, g_pullback, velocities)
    tiny = torch.finfo(e_pb.dtype).tiny
    log_l, log_p = e_learned.clamp_min(tiny).log(), e_pb.clamp_min(tiny).log()
    top_l = torch.linalg.eigh(g_learned)[1][..., -k:]
    top_p = torch.linalg.eigh(g_pullback)[1][..., -k:]
    angles = principal_angles(top_l, top_p)
    return {
        "energy_log_pearson": _pearson(log_l, log_p) if len(log_l) > 1 else float("nan"),
        "energy_spearman": _pearson(_ranks(e_learned), _ranks(e_pb)) if len(e_pb) > 1 else float("nan"),
        "subspace_k": k,
        "principal_angles_mean_rad": [float(a) for a in angles.mean(0)],
        "principal_angle_largest_mean_rad": float(angles[..., -1].mean()),
    }
