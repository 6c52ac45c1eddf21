"""Generation from exactly the function a model was trained as.

``generate(model, tokenizer, prompt, ...)`` processes the prompt with the model's parallel
forward (``prefill``: ``model(tokens, return_state=True)`` gives the logits and the decoding
state), then continues one token at a time through ``model.step``; the registry-wide tests check
that ``step`` reproduces the parallel forward and that the prefilled state equals the stepped
one, so the text comes from the trained model and not from a different path (the reference DRM
generator used its plain recurrent path only).
"""

from drmlab.generation.sampling import GenerationResult, generate, prefill, sample_next

__all__ = ["GenerationResult", "generate", "prefill", "sample_next"]
