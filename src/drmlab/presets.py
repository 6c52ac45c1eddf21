"""The presets, spelled once: their names and the training defaults each one brings.

A preset names a model size (each family's config module maps it to dimensions) and the training
defaults below. tokens/step = batch_size * grad_accum * seq_len; 8,192 for tiny and up, as in the
reference DRM protocol (2 x 8 x 512), so its 5,005,312 tokens are 611 steps.
Imports nothing, so ``drmlab --help`` can print the table without loading torch.
"""

PRESETS = ("micro", "tiny", "small", "125m")

PRESET_DEFAULTS: dict[str, dict] = {
    "micro": dict(batch_size=8, grad_accum=1, seq_len=32, lr=3e-3, tokens=65_536),
    "tiny": dict(batch_size=32, grad_accum=1, seq_len=256, lr=2e-3, tokens=1_000_000),
    "small": dict(batch_size=16, grad_accum=1, seq_len=512, lr=1e-3, tokens=5_005_312),
    "125m": dict(batch_size=2, grad_accum=8, seq_len=512, lr=3e-4, tokens=5_005_312),
}
