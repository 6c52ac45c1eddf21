"""The diagonal-plus-low-rank metric G = D + U U^T (``docs/drm.md`` sections 4 and 5): its Woodbury
solve, energy, dense form and direction coupling, in :mod:`.diagonal_plus_low_rank`; where the floor D
may vanish, its kernel, exact rank and damped pseudo-inverse, in :mod:`.degenerate`."""

from .degenerate import exact_rank, kernel_project, pseudo_inverse_solve
from .diagonal_plus_low_rank import coupling_matrix, metric_dense, metric_energy, woodbury_solve

__all__ = [
    "woodbury_solve",
    "metric_energy",
    "metric_dense",
    "coupling_matrix",
    "exact_rank",
    "kernel_project",
    "pseudo_inverse_solve",
]
