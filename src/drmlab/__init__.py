"""drmlab: causal language models with a recurrent latent state.

Layers (imports flow one way, left to right):
``ops`` <- ``resolvent`` <- ``models`` <- ``training`` / ``evaluation`` (with ``data``)
<- ``experiments`` <- ``cli``.
"""

__version__ = "0.1.0"


def generate(*args, **kwargs):
    """``drmlab.generate(model, tokenizer, prompt, ...)``: see :func:`drmlab.generation.generate`."""
    from drmlab.generation import generate as _generate

    return _generate(*args, **kwargs)
