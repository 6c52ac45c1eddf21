"""Configuration of the DRM family: one dataclass, the presets and the variant table.

The fields and their defaults follow the reference configuration of ``docs/drm.md``
section A.1; the variants A to J and the component ablations are its section A.5.3.
A config resolves in three layers: preset dimensions, then the variant's overrides,
then the caller's overrides.

Its parts, one job each: the dataclass (:mod:`~drmlab.models.drm.config_fields`), its checks
(:mod:`~drmlab.models.drm.config_checks`), the loss weights and option tables
(:mod:`~drmlab.models.drm.config_options`), the presets, the variant table and :func:`build_config`
(:mod:`~drmlab.models.drm.variants`) and the closed-form parameter counts
(:mod:`~drmlab.models.drm.param_count`). Every name they define is importable from here.
"""

from .config_checks import DRMConfigChecks  # noqa: F401 (re-exported)
from .config_fields import DRMConfig  # noqa: F401 (re-exported)
from .config_options import (  # noqa: F401 (re-exported)
    CE_ONLY,
    COMPOSITIONS,
    LOSS_WEIGHTS_BASE,
    METRIC_DIAGONALS,
    METRICS,
    RANK_POLICIES,
    RELATIONAL_METRIC_LOSSES,
)
from .param_count import closed_form_parameter_count, matched_memory_width  # noqa: F401 (re-exported)
from .variants import DERIVED_FIELDS, MATCHED_MEMORY, PRESET_DIMS, VARIANTS, build_config  # noqa: F401 (re-exported)
