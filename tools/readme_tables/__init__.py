"""The tables ``tools/readme.py`` writes into the README and the results pages: one renderer per generated
block (:data:`BLOCK_RENDERERS`), each computing what it prints from the committed study records (means and
population standard deviations from per-seed values, bits per byte from nats, ratios of two measurements).
Not part of the installed package; it imports drmlab as a library.

``format.py`` holds the cells and the markdown table every renderer prints with; each other module holds the
renderers of one group of studies: ``protocol.py`` (each protocol study, its sweep, the float32 and
full-budget checks, the headline), ``comparisons.py`` (protocol records side by side: presets, recipes,
windows, the recipe's parts), ``tiny.py`` (the first tiny studies), ``benchmarks.py``, ``recall.py``
(distance MQAR, PMCS), ``zoology.py``, ``asm_cm.py``, ``geometry.py`` and ``long_context.py`` (loss by
position and with the state carried).

To add a study's table: write its renderer -- a function of the committed records by study name
(``studies: dict[str, dict]``, as ``readme.load_studies`` returns them) giving the table's markdown, built
with :func:`format.markdown_table` -- in the module of its group (or a new module beside them, with a
docstring naming its job), and add one entry to :data:`BLOCK_RENDERERS` below: the block's name, as in
the page's ``<!-- generated: NAME -->`` marker, and the renderer (``functools.partial`` where one renderer
serves several records). ``PAGES`` in ``tools/readme.py`` says which page holds the table.
"""

from __future__ import annotations

import functools

from .asm_cm import _asm_cm_capacity_table, _asm_cm_controls_table
from .benchmarks import (
    _bench_compile_runs_table,
    _bench_compile_table,
    _bench_decode_table,
    _bench_models_table,
    _bench_procs_table,
    _bench_reference_table,
    _bench_solvers_table,
)
from .comparisons import _recipe_parts_table, _recipes_table, _scales_table, _window_table, protocol_records
from .geometry import _geometry_table
from .long_context import _long_context_table
from .protocol import (
    _full_budget_paired_table,
    _full_budget_sweep_table,
    _headline_table,
    _precision_table,
    _protocol_sweep_table,
    _protocol_table,
    full_budget_paired,
    full_budget_sweeps,
)
from .recall import _distance_table, _pmcs_table
from .tiny import (
    _ablate_drm_table,
    _cross_family_table,
    _loop_study_table,
    cross_family_rows,
    lm_bits_per_byte,
    mqar_accuracy,
)
from .zoology import _zoology_budget_table, _zoology_table

# every generated block by the name its markers give it, in the order the pages are rendered
BLOCK_RENDERERS = {
    "headline": _headline_table,
    "protocol-tiny": _protocol_table,
    "protocol-tiny-sweep": _protocol_sweep_table,
    "protocol-small": functools.partial(_protocol_table, name="protocol-small"),
    "protocol-small-sweep": functools.partial(_protocol_sweep_table, name="protocol-small"),
    "protocol-small-fp32": _precision_table,
    "protocol-micro": functools.partial(_protocol_table, name="protocol-micro"),
    "protocol-micro-sweep": functools.partial(_protocol_sweep_table, name="protocol-micro"),
    "protocol-micro-ctx256": functools.partial(_protocol_table, name="protocol-micro-ctx256"),
    "protocol-micro-ctx256-sweep": functools.partial(_protocol_sweep_table, name="protocol-micro-ctx256"),
    "protocol-window": _window_table,
    "protocol-scales": _scales_table,
    "protocol-tiny-fullbudget": _full_budget_sweep_table,
    "protocol-tiny-field-sweep": functools.partial(_protocol_sweep_table, name="protocol-tiny-field"),
    "protocol-tiny-field": functools.partial(_protocol_table, name="protocol-tiny-field"),
    "recipe-parts-tiny": _recipe_parts_table,
    "protocol-recipes": _recipes_table,
    "protocol-tiny-fullbudget-paired": _full_budget_paired_table,
    "protocol-tiny-field-fullbudget": functools.partial(
        _full_budget_sweep_table, protocol="protocol-tiny-field", check="protocol-tiny-field-fullbudget"
    ),
    "distance-tiny": _distance_table,
    "ablate-tiny-drm": _ablate_drm_table,
    "loop-study-tiny": _loop_study_table,
    "compare-tiny": _cross_family_table,
    "bench-models": _bench_models_table,
    "bench-reference": _bench_reference_table,
    "bench-fast-memory": functools.partial(_bench_reference_table, name="bench-fast-memory"),
    "bench-fast-memory-amd": functools.partial(_bench_reference_table, name="bench-fast-memory-amd"),
    "bench-reference-amd": functools.partial(_bench_reference_table, name="bench-reference-amd"),
    "bench-decode": _bench_decode_table,
    "bench-procs": _bench_procs_table,
    "bench-compile": _bench_compile_table,
    "bench-compile-runs": _bench_compile_runs_table,
    "bench-solvers": _bench_solvers_table,
    "zoology-cpu": _zoology_table,
    "zoology-l64": functools.partial(_zoology_table, name="zoology-l64"),
    "zoology-budget": _zoology_budget_table,
    "pmcs-tiny": _pmcs_table,
    "asm-cm-controls": _asm_cm_controls_table,
    "asm-cm-capacity": _asm_cm_capacity_table,
    "geometry-tiny": _geometry_table,
    "long-context-tiny": _long_context_table,
}
