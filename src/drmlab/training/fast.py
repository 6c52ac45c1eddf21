"""The one fast setting (``docs/architecture.md`` "The fast setting"): ``--fast`` is bf16
autocast where the device multiplies bf16 natively, ``torch.compile`` with a persistent cache, and the fused
kernels (on by default, :mod:`drmlab.ops.fusion`).

* :func:`bf16_unavailable`: why bf16 autocast would not pay here (None where it does): a CUDA device without
  bf16, or a CPU without bf16 matrix units (AVX512-BF16 or AMX), where torch emulates bf16 more slowly than
  it multiplies float32.
* :func:`fast_settings`: the train settings ``--fast`` stands for on a device, and the one line that says what
  it dropped there.
* :func:`memory_products_in_bf16`: the train setting ``bf16_memory_products`` applied to a model: the selective
  memory's matrix products follow the bf16 autocast too (``docs/drm.md`` appendix A.4.7);
  :func:`restore_memory_products` turns the switches off again when training ends.
* :func:`use_persistent_compile_cache`: Inductor's compiled kernels go to drmlab's cache folder (kept across
  reboots, unlike torch's default under the temporary folder), unless ``TORCHINDUCTOR_CACHE_DIR`` is set.
* :data:`FAST_FACTORS` and :func:`suggestion`: the speed-up ``--fast`` measured per model (one CPU thread,
  ``benchmarks/bench_reference.py --fast``, docs/studies/bench-reference), and the line a long default run
  prints when its model trained much faster with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = [
    "FAST_FACTORS",
    "FAST_MACHINE",
    "bf16_unavailable",
    "fast_settings",
    "memory_products_in_bf16",
    "restore_memory_products",
    "use_persistent_compile_cache",
    "suggestion",
]

# the measured ratio of --fast to the float32 default, training tokens/s, preset tiny, one thread, on
# FAST_MACHINE: the memory's products in bf16 too (docs/studies/bench-fast-memory, its "fast_memory" side), and
# for J_NO_DIRECTION, not in that record, the fast setting of before (docs/studies/bench-reference; its memory is
# J's size, where the products in bf16 moved J's factor from 1.49 to 1.54); tests/studies holds them to it
FAST_FACTORS: dict[str, float] = {
    "J": 1.54,
    "J_NO_DIRECTION": 1.52,
    "SSM_CONTROL": 2.07,
    "J_DIRECT_CONTROL_MATCHED": 1.82,
}
FAST_MACHINE = "preset tiny, one thread of an Intel Xeon with AMX"
# a default run of at least this many steps prints the suggestion, for a model --fast made this much faster
SUGGEST_MIN_STEPS = 500
SUGGEST_MIN_FACTOR = 1.3
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_unavailable(device: torch.device) -> str | None:
    """Why bf16 autocast would not speed training up on ``device`` (None where it would)."""
    if device.type == "cuda":
        return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16 support"
    if device.type != "cpu":
        return f"bf16 autocast is not measured on {device.type}"
    flags = _cpu_flags()
    if flags and not flags & set(BF16_CPU_FLAGS):
        return "this CPU has no bf16 matrix units (AVX512-BF16 or AMX)"
    if not flags and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU's oneDNN has no bf16 support"
    return None


def fast_settings(device: torch.device) -> tuple[dict, str | None]:
    """(the train settings ``--fast`` stands for on ``device``, a one-line note where bf16 was dropped)."""
    why = bf16_unavailable(device)
    if why is None:
        return {"bf16": True, "bf16_memory_products": True, "compile": True}, None
    return {
        "bf16": False,
        "compile": True,
    }, f"--fast: {why}: training in float32 with torch.compile and the fused kernels"


def memory_products_in_bf16(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Let every module with a ``products_in_autocast`` switch (the DRM selective memory) run its matrix
    products in the autocast's dtype; the modules this turned on (for :func:`restore_memory_products`).
    Outside an autocast nothing changes."""
    switched = []
    for module in model.modules():
        if hasattr(module, "products_in_autocast") and not module.products_in_autocast:
            module.products_in_autocast = True
            switched.append(module)
    return switched


def restore_memory_products(switched: list[torch.nn.Module]) -> None:
    """Turn off again the switches :func:`memory_products_in_bf16` turned on (the model as it was given)."""
    for module in switched:
        module.products_in_autocast = False


def use_persistent_compile_cache() -> Path | None:
    """Point Inductor's cache at drmlab's cache folder (``<cache>/inductor``) unless the user chose one;
    the folder used, or None where none is writable (torch's default then stands)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    from drmlab.ops import ckernels

    for base in ckernels.cache_dirs():
        try:
            folder = ckernels.private_cache_dir(base) / "inductor"
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        return folder
    return None


def suggestion(model: str, device: torch.device, steps: int) -> str | None:
    """The line a default (float32, eager) run prints when ``--fast`` measured much faster for ``model`` on a
    CPU like this one (bf16 matrix units) and the run is long enough to repay compiling (``steps``); else None."""
    factor = FAST_FACTORS.get(model)
    if factor is None or factor < SUGGEST_MIN_FACTOR or device.type != "cpu" or steps < SUGGEST_MIN_STEPS:
        return None
    if bf16_unavailable(device) is not None:
        return None
    return (
        f"--fast trained {model} about {factor:.1f}x faster than this default (float32, eager) in our benchmark "
        f"({FAST_MACHINE}); it costs a compile of a minute or two at the first step and bf16 round-off"
    )
