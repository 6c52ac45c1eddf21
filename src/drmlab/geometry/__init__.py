"""Geometry instruments for latent-state models (``docs/geometry.md``).

One module per instrument, each validated on a case with a closed-form answer
(tests/test_geometry_*.py) before it is pointed at a trained model:

* :mod:`.metric`: degenerate metrics G = diag(gamma) + U U^T with a vanishing floor -- exact
  kernel, damped pseudo-inverse naturalisation, numerical ranks at stated tolerances;
* :mod:`.strata`: rank strata of the states a model visits, occupancy and transitions;
* :mod:`.pullback`: the decoder pullback metric J^T (diag p - p p^T) J, exact and estimated,
  and its agreement with a learned metric;
* :mod:`.connection`: Christoffel symbols, parallel transport (ODE and Schild's ladder), holonomy
  (over :mod:`.christoffel`, :mod:`.transport` and :mod:`.step_control`);
* :mod:`.geodesics`: the discrete boundary-value solver of the action;
* :mod:`.topology`: persistent homology of trajectories (the optional ``geometry`` extra);
* :mod:`.model_adapter`: what a built model exposes to the instruments (read-only);
* :mod:`.measures`: each instrument on a model (``measure_*``);
* :mod:`.run`: every instrument on a run directory (``drmlab geometry``).

Submodules are imported on use; importing this package imports no torch.
"""
