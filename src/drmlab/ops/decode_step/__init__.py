"""The fused DRM decode step: one C call for a token inside an open block (``docs/drm.md`` section A.4.5,
"The fused step"); the kernel and its slot layout in :mod:`.c`. The model side (which buffers fill which
slot, when the kernel applies) is ``drmlab.models.drm.fused_step``; the reference it is tested against is
``DRMModel.step_reference``."""

from .c import INTEGER_SLOTS, LAYER_SLOTS, POINTER_SLOTS, REAL_SLOTS, run, unavailable

__all__ = ["INTEGER_SLOTS", "LAYER_SLOTS", "POINTER_SLOTS", "REAL_SLOTS", "run", "unavailable"]
