r"""The residual probe: the residual stream of a model at initialisation, layer by layer.

This is the quantity the looped study's proofs measure (``docs/looped.md`` section 7; this probe is
its section 6), read off a real model instead of a toy chain: with x_0 the embedded input and x_k
the stream after the k-th block application, the update of application k is Δ_k = x_k - x_{k-1}.
Per application the profile gives

* ``norm``          mean over tokens of ‖x_k‖/√d                (proofs 2, 3, 5: bounded or growing)
* ``update_norm``   mean over tokens of ‖Δ_k‖/√d
* ``cos_prev``      mean over tokens of cos(Δ_k, Δ_{k-1})        (successive updates)
* ``cos_same_block`` mean over tokens of cos(Δ_k, Δ_j), j the previous application of the same
  stored block (proof 2's correlation of a shared block's residuals; None when the block was not
  applied before or the model does not say which block ran)

Row 0 is the embedded input (``norm`` only). Loop-aware scaling (ε = 1/N) shows up as a flat
``norm`` with ``cos_same_block`` near 1; unscaled weight sharing as a growing ``norm``.

How the stream is found, for any registered model:

1. a model with a ``residual_stream(tokens) -> [x_0, ..., x_K]`` method (the LOOPED family; its
   ``application_blocks`` names the stored block of each application);
2. otherwise forward hooks on the children of every ``nn.ModuleList``: the list whose children
   are called on [B, T, d] tensors, each returning the same shape, each call's input being the
   previous call's output (a chained residual stack, e.g. Hugging Face GPT-2's ``h``) gives
   x_0 = the first input and x_k = the k-th output (the block of each call is its list index);
3. otherwise ValueError: the model has no depth-wise residual stack (e.g. the DRM family, whose
   recurrence runs over time, not depth).

``residual_stream_profile(model, tokens) -> rows`` (a list of dicts) runs without gradients in
eval mode. :func:`probe_model` builds a registered model at initialisation (vocab 256), draws
uniform random tokens from its seed and profiles it (the ``drmlab residual-probe`` verb prints it).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from drmlab.experiments.stats import mean

__all__ = ["residual_stream", "residual_stream_profile", "summarize", "probe_model"]


def _first_tensor(args, kwargs):
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for key in ("hidden_states", "x", "input", "h"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key]
    return None


def _output_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _hooked_stream(model: nn.Module, tokens: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    calls: dict[str, list] = {}
    handles = []

    def make_hook(list_name: str, index: int):
        def hook(module, args, kwargs, output):
            x, y = _first_tensor(args, kwargs), _output_tensor(output)
            if (
                x is None
                or y is None
                or x.dim() != 3
                or tuple(x.shape[:2]) != tuple(tokens.shape)
                or y.shape != x.shape
            ):
                calls.setdefault(list_name, []).append(None)
            else:
                calls.setdefault(list_name, []).append((index, x, y))

        return hook

    for list_name, module in model.named_modules():
        if isinstance(module, nn.ModuleList):
            for index, child in enumerate(module):
                handles.append(child.register_forward_hook(make_hook(list_name, index), with_kwargs=True))
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()

    best = None
    for records in calls.values():
        if not records or any(r is None for r in records):
            continue
        chained = all(torch.equal(records[k + 1][1], records[k][2]) for k in range(len(records) - 1))
        if chained and (best is None or len(records) > len(best)):
            best = records
    if best is None:
        raise ValueError(
            f"{getattr(model, 'model_name', type(model).__name__)} has no depth-wise residual stack "
            "(no method residual_stream(tokens) and no nn.ModuleList of chained [B, T, d] -> [B, T, d] "
            "blocks); the residual probe does not apply to it"
        )
    return [best[0][1]] + [r[2] for r in best], [r[0] for r in best]


def residual_stream(model: nn.Module, tokens: torch.Tensor) -> tuple[list[torch.Tensor], list[int] | None]:
    """([x_0, ..., x_K], stored block of each application or None) for ``model`` on ``tokens``."""
    if hasattr(model, "residual_stream"):
        stream = list(model.residual_stream(tokens))
        blocks = getattr(model, "application_blocks", None)
        blocks = list(blocks) if blocks is not None and len(blocks) == len(stream) - 1 else None
        return stream, blocks
    return _hooked_stream(model, tokens)


def _mean_norm(x: torch.Tensor) -> float:
    return float(x.double().norm(dim=-1).mean() / math.sqrt(x.shape[-1]))


def _mean_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double(), b.double(), dim=-1, eps=1e-30).mean())


def residual_stream_profile(model: nn.Module, tokens: torch.Tensor) -> list[dict]:
    """One row per stream position (see the module docstring); row 0 is the embedded input."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            stream, blocks = residual_stream(model, tokens)
    finally:
        model.train(was_training)
    rows = [
        {
            "layer": 0,
            "block": None,
            "norm": _mean_norm(stream[0]),
            "update_norm": None,
            "cos_prev": None,
            "cos_same_block": None,
        }
    ]
    previous, last_of_block = None, {}
    for k in range(1, len(stream)):
        update = stream[k] - stream[k - 1]
        block = blocks[k - 1] if blocks is not None else None
        same = last_of_block.get(block) if block is not None else None
        rows.append(
            {
                "layer": k,
                "block": block,
                "norm": _mean_norm(stream[k]),
                "update_norm": _mean_norm(update),
                "cos_prev": _mean_cos(update, previous) if previous is not None else None,
                "cos_same_block": _mean_cos(update, same) if same is not None else None,
            }
        )
        previous = update
        if block is not None:
            last_of_block[block] = update
    return rows


def summarize(rows: list[dict]) -> dict:
    """Final/initial norm ratio and the mean cosines over the rows that have them."""

    def mean_of(key):
        values = [r[key] for r in rows if r[key] is not None]
        return mean(values) if values else None

    return {
        "applications": len(rows) - 1,
        "norm_ratio": rows[-1]["norm"] / rows[0]["norm"],
        "mean_cos_prev": mean_of("cos_prev"),
        "mean_cos_same_block": mean_of("cos_same_block"),
    }


def probe_model(
    name: str, preset: str = "tiny", seed: int = 0, batch: int = 4, length: int | None = None, **overrides
) -> dict:
    """The profile of the registered model ``name`` at initialisation (vocabulary 256) on ``batch`` x
    ``length`` uniform random tokens drawn from ``seed`` (``length`` defaults to the model's position
    limit, at most 256): ``{"model", "preset", "seed", "overrides", "tokens", "rows", "summary"}``."""
    from drmlab.models import build_model

    model = build_model(name, preset=preset, vocab_size=256, seed=seed, **overrides)
    config = getattr(model, "config", None)
    limit = getattr(config, "max_seq_len", None) or getattr(config, "n_positions", None) or 128
    length = length or min(limit, 256)
    if batch <= 0 or length <= 0:
        raise ValueError(f"batch and length must be positive, got batch {batch}, length {length}")
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (batch, length), generator=generator)
    rows = residual_stream_profile(model, tokens)
    return {
        "model": name,
        "preset": preset,
        "seed": seed,
        "overrides": overrides,
        "tokens": [batch, length],
        "rows": rows,
        "summary": summarize(rows),
    }
