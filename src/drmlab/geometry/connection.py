r"""The Levi-Civita connection of a metric: Christoffel symbols, parallel transport, holonomy
(``docs/geometry.md`` section 4).

Its parts, one job each: the metric as the instruments see it and its Christoffel symbols
(:mod:`~drmlab.geometry.christoffel`: :class:`Metric`, :func:`christoffel`, :func:`christoffel_contract`,
:func:`geodesic_residual`), transport in fixed steps and the holonomy it measures
(:mod:`~drmlab.geometry.transport`: :func:`transport`, :func:`schild_transport`, :func:`holonomy_angle`,
:func:`sectional_curvature`) and the same with the step cut in G-length
(:mod:`~drmlab.geometry.step_control`: :class:`StepControl`, :func:`transport_adaptive`,
:func:`schild_ladder`, :func:`small_loop_holonomy`). Every name in ``__all__`` is importable from here.
"""

from __future__ import annotations

from .christoffel import (
    DenseMetric,
    LowRankMetric,
    Metric,
    christoffel,
    christoffel_contract,
    christoffel_contract_functional,
    geodesic_residual,
)
from .step_control import (
    StepControl,
    TransportResult,
    metric_change,
    schild_ladder,
    small_loop_holonomy,
    transport_adaptive,
)
from .transport import holonomy_angle, parallelogram, polyline, schild_transport, sectional_curvature, transport

__all__ = [
    "DenseMetric",
    "LowRankMetric",
    "Metric",
    "christoffel",
    "christoffel_contract",
    "christoffel_contract_functional",
    "geodesic_residual",
    "holonomy_angle",
    "parallelogram",
    "polyline",
    "schild_transport",
    "sectional_curvature",
    "small_loop_holonomy",
    "StepControl",
    "TransportResult",
    "metric_change",
    "schild_ladder",
    "transport",
    "transport_adaptive",
]
