"""A run directory's model: built from its config.json, its checkpoint's weights loaded (docs/runs.md, "What a
run directory promises": checked on load; docs/architecture.md section 1).

The one module of :mod:`drmlab.runs` that imports :mod:`drmlab.models` (tests/runs/test_runs_package.py checks
it): the rest of the package reads and writes files and knows nothing of the registry. Weights holding NaN
or infinity are refused, so ``eval`` and ``generate`` never report numbers of a diverged model.

Its functions take the run directory as ``run``: :meth:`RunDir.build_model <drmlab.runs.rundir.RunDir.build_model>`
and :meth:`RunDir.load_model <drmlab.runs.rundir.RunDir.load_model>` pass the run itself, so this module
imports nothing of :mod:`~drmlab.runs.rundir`, which imports it.
"""

from __future__ import annotations

import torch


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers holding a NaN or an infinity."""
    bad = []
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_floating_point() or tensor.is_complex():
            if not bool(torch.isfinite(tensor).all()):
                bad.append(name)
    return bad


def build_model(run, config: dict | None = None) -> torch.nn.Module:
    """The model of ``run``, freshly built (untrained) from ``config`` (by default its config.json)."""
    from drmlab.models import build_model as build_registered

    config = config if config is not None else run.read_config()
    try:
        name, preset, seed = config["model"], config["preset"], int(config["train"]["seed"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{run.config_path} lacks the model, preset or seed; it is not a drmlab run config") from None
    vocab = config.get("vocab_size") or (config.get("model_config") or {}).get("vocab_size") or 256
    return build_registered(name, preset, vocab_size=int(vocab), seed=seed, **config.get("overrides", {}))


def load_model(
    run, device: str | torch.device | None = "cpu", *, allow_non_finite: bool = False
) -> tuple[torch.nn.Module, dict, dict]:
    """(the model of ``run`` with the checkpoint's weights in eval mode, the run's config, trainer state).
    Weights holding NaN or infinity are refused unless ``allow_non_finite``."""
    from drmlab.devices import resolve_device

    config = run.read_config()
    model = build_model(run, config)
    model.to(resolve_device(str(device) if isinstance(device, torch.device) else device))
    state = run.load_checkpoint(model, optimizer=None)
    bad = [] if allow_non_finite else non_finite_parameters(model)
    if bad:
        raise ValueError(
            f"the checkpoint in {run.checkpoint_dir()} holds non-finite weights ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}); it cannot be evaluated or sampled"
        )
    model.eval()
    return model, config, state
