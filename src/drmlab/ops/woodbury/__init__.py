"""The diagonal-plus-low-rank metric G = D + U U^T (``docs/drm.md`` sections 4 and 5): its Woodbury
solve, energy, dense form and direction coupling; one implementation, in
:mod:`.diagonal_plus_low_rank`."""

from .diagonal_plus_low_rank import coupling_matrix, metric_dense, metric_energy, woodbury_solve

__all__ = ["woodbury_solve", "metric_energy", "metric_dense", "coupling_matrix"]
