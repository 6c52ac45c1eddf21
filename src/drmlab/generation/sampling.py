"""Prefill (one parallel forward that also returns the decoding state), sampling (temperature,
top-k, top-p) and the decode loop on ``model.step``."""

from __future__ import annotations

import codecs
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from drmlab.ops.fusion import fused_enabled


@torch.no_grad()
def prefill(model, tokens: torch.Tensor) -> tuple[torch.Tensor, object]:
    """Logits after the last prompt token [B, vocab] and the decoding state that continues it,
    from one parallel forward (``model(tokens, return_state=True)``): no per-token loop. The model
    checks the prompt (``drmlab.models.inputs``: an empty or mis-shaped one is a ValueError)."""
    out = model(tokens, return_state=True)
    return out.logits[:, -1], out.state


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, flags: bool = False) -> None:
    """Refuse a temperature that is not a finite number >= 0 (NaN sampled from NaN probabilities), a top_k
    below 1 and a top_p outside (0, 1]; ``flags``: name them as the command line's ``--temperature`` ..."""
    name = (lambda key: "--" + key.replace("_", "-")) if flags else (lambda key: key)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{name('temperature')} must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"{name('top_k')} must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:  # NaN fails the comparison: refused too
        raise ValueError(f"{name('top_p')} must be in (0, 1], got {top_p}")


def sample_next(
    logits: torch.Tensor,
    generator: torch.Generator,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Draw one token per row from logits [B, vocab]; temperature 0 is greedy."""
    check_sampling(temperature, top_k, top_p)
    logits = logits.double()
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop = (probs.cumsum(-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


@dataclass
class GenerationResult:
    text: str
    prompt_tokens: list[int]
    new_tokens: list[int]
    tokens_per_s: float
    prefill_s: float
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # per new token, when kept


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    on_text: Callable[[str], None] | None = None,
    use_prefill: bool = True,
    keep_logits: bool = False,
    fused_step: bool | None = None,
) -> GenerationResult:
    """Continue ``prompt`` by ``max_new_tokens`` tokens sampled from ``model``.

    ``on_text`` receives decoded text as tokens arrive (incomplete UTF-8 is held back).
    The same seed gives the same text. ``use_prefill=False`` steps through the prompt
    instead of the parallel forward; both give the same tokens. Decoding is by the model's
    ``step_fused`` (DRM models: one C call per token inside a block, equal to ``step`` to round-off,
    not bit for bit; ``docs/drm.md`` section A.4.5) where it applies and fused kernels are on
    (``fused_step=None``, the default), always (``True``: an error for a model without one) or never
    (``False``: ``step``).
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give at least one character")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and max(ids) >= vocab:
        raise ValueError(
            f"the prompt contains token id {max(ids)} but the model's vocabulary has {vocab} ids "
            f"(tokenizer {tokenizer.name!r} does not match this model)"
        )
    step = _step_function(model, fused_step)
    model.eval()
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], dtype=torch.long, device=device)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    if use_prefill:
        logits, state = prefill(model, tokens)
    else:
        state = model.init_state(1)
        for t in range(tokens.shape[1]):
            logits, state = step(tokens[:, t], state)
    prefill_s = time.perf_counter() - start
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    new, kept = [], []
    start = time.perf_counter()
    for _ in range(max_new_tokens):
        if keep_logits:
            kept.append(logits[0].detach().cpu())
        token = sample_next(logits, generator, temperature, top_k, top_p)
        new.append(int(token[0]))
        if on_text is not None:
            piece = decoder.decode(tokenizer.decode_bytes([new[-1]]))
            if piece:
                on_text(piece)
        logits, state = step(token, state)
    elapsed = time.perf_counter() - start
    if on_text is not None:
        tail = decoder.decode(b"", final=True)
        if tail:
            on_text(tail)
    return GenerationResult(
        text=tokenizer.decode(new),
        prompt_tokens=ids,
        new_tokens=new,
        tokens_per_s=len(new) / elapsed if elapsed > 0 and new else 0.0,
        prefill_s=prefill_s,
        logits=kept,
    )


def _step_function(model, fused_step: bool | None):
    """``model.step``, or ``model.step_fused`` with ``fused_step`` (a ValueError where the model has none);
    with None, ``step_fused`` where the model has one that applies and fused kernels are on."""
    if fused_step is None:
        unsupported = getattr(model, "fused_step_unsupported", None)
        fused_step = fused_enabled() and unsupported is not None and unsupported() is None
    if not fused_step:
        return model.step
    fused = getattr(model, "step_fused", None)
    if fused is None:
        raise ValueError(
            f"fused_step=True: {getattr(model, 'model_name', type(model).__name__)} has no fused step "
            "(DRM models only); decode with fused_step=False"
        )
    return fused
