"""Inspect one model: build it (or load a trained run), run one forward pass on real text, report.

For every model the report holds the parameter count, the forward time and the cross-entropy on a
piece of real text present on every machine (the source of Python's ``argparse`` module) beside
the uniform guess ln(vocab); for the DRM family it adds the geometry report of
:mod:`drmlab.models.drm.diagnostics` (docs/drm.md: dimD, metric energy and action, coupling,
numerical ranks of G and of the direction frame).

The text is cut into ``batch`` rows of ``length + 1`` tokens. The default length is the window the
model was made for: the preset's training window (:data:`drmlab.presets.PRESET_DEFAULTS`) for a
fresh build, the run's own ``seq_len`` for a trained run -- every registered model's position table
covers it, so every model inspects at every preset without extra settings.

Python: :func:`inspect_registered` (a registered model at a preset, untrained) and
:func:`inspect_run` (a run directory's checkpoint, through :func:`drmlab.runs.load_run_model`); both
return the report as a dict.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from drmlab.models import count_parameters
from drmlab.presets import PRESET_DEFAULTS


def sample_text() -> bytes:
    """A piece of real text present on every machine: the source of Python's argparse module."""
    return Path(argparse.__file__).read_bytes()


def sample_tokens(batch: int, length: int, tokenizer: str = "bytes") -> torch.Tensor:
    """``[batch, length + 1]`` token ids of :func:`sample_text` under ``tokenizer``."""
    if batch <= 0 or length <= 0:
        raise ValueError(f"batch and length must be positive, got batch {batch}, length {length}")
    need = batch * (length + 1)
    if tokenizer == "bytes":
        ids = torch.frombuffer(bytearray(sample_text()[:need]), dtype=torch.uint8).long()
    else:
        from drmlab.data import get_tokenizer

        ids = torch.as_tensor(get_tokenizer(tokenizer).encode(sample_text().decode("utf-8"))[:need], dtype=torch.long)
    if ids.numel() < need:
        raise ValueError(
            f"the sample text holds {ids.numel():,} tokens, fewer than batch {batch} x (length {length} + 1)"
        )
    return ids.view(batch, length + 1)


def inspect_model(model: torch.nn.Module, tokens: torch.Tensor) -> dict:
    """Parameters, forward time, cross-entropy of ``model`` on ``tokens`` [B, T + 1] (and the DRM
    geometry); ``model`` in eval mode."""
    with torch.no_grad():
        start = time.perf_counter()
        out = model(tokens[:, :-1])
        elapsed = time.perf_counter() - start
    ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tokens[:, 1:].reshape(-1))
    report = {
        "params": count_parameters(model),
        "tokens": int(tokens[:, :-1].numel()),
        "forward_s": round(elapsed, 4),
        "ce_nats": float(ce),
        "ce_uniform_nats": float(torch.log(torch.tensor(float(out.logits.shape[-1])))),
    }
    if hasattr(model, "states"):  # the DRM family
        from drmlab.models.drm.diagnostics import geometry_report

        report["geometry"] = geometry_report(model, tokens[:, :-1])
    return report


def inspect_registered(
    name: str, preset: str = "tiny", seed: int = 0, length: int | None = None, batch: int = 2, device="cpu", **overrides
) -> dict:
    """The report of the registered model ``name`` at ``preset``, untrained (vocabulary 256, bytes);
    ``overrides`` are model settings. ``length`` defaults to the preset's training window."""
    from drmlab.devices import resolve_device
    from drmlab.models import build_model

    if preset not in PRESET_DEFAULTS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESET_DEFAULTS)}")
    target = resolve_device(device)
    model = build_model(name, preset=preset, vocab_size=256, seed=seed, **overrides).to(target).eval()
    tokens = sample_tokens(batch, length or PRESET_DEFAULTS[preset]["seq_len"]).to(target)
    report = _renamed(inspect_model(model, tokens), "ce_nats", "ce_untrained_nats")
    return {"model": name, "preset": preset, **({"overrides": overrides} if overrides else {}), **report}


def inspect_run(run_dir: str | Path, length: int | None = None, batch: int = 2, device="cpu") -> dict:
    """The report of a trained run's checkpoint (model rebuilt from its config.json, weights loaded);
    the text is tokenized with the run's tokenizer; ``length`` defaults to the run's ``seq_len``."""
    from drmlab.runs import load_run_model

    model, config, state = load_run_model(run_dir, device=device)
    tokens = sample_tokens(batch, length or int(config["train"]["seq_len"]), config.get("tokenizer") or "bytes")
    report = _renamed(inspect_model(model, tokens.to(next(model.parameters()).device)), "ce_nats", "ce_trained_nats")
    run = {
        "run": str(run_dir),
        "step": int(state["step"]),
        "tokens_trained": int(state.get("tokens", 0)),
        "seed": int(config["train"]["seed"]),
    }
    return {
        "model": config.get("label") or config["model"],
        "preset": config["preset"],
        **({"overrides": config["overrides"]} if config.get("overrides") else {}),
        **run,
        **report,
    }


def _renamed(report: dict, old: str, new: str) -> dict:
    return {(new if key == old else key): value for key, value in report.items()}
