"""The resolvent operator (``docs/resolvent.md``): one causal attention head with three
switches ``(beta, qk, g)`` whose corners are softmax attention, unnormalized-kernel attention and the
exact path product of a gated chain.

* :mod:`drmlab.resolvent.reference` -- float64 numpy reference with the exact semantics of
  ``docs/resolvent.md`` section 4 (re-exported here: ``Switches``, ``NonFinite``, ``blend``,
  ``gate``, ``path_product``, ``operator``, ``readout``, ``chain_label``).
* :mod:`drmlab.resolvent.torch` -- batched, differentiable torch operator
  (``resolvent_attention``) with automatic fast paths.
* :mod:`drmlab.resolvent.gates` -- gate magnitude parameterisations (the reference clamp,
  hard-concrete, sigmoid) and a trainable gate head.

Importing this package does not import torch.
"""

from drmlab.resolvent.reference import (
    NonFinite,
    Switches,
    blend,
    chain_label,
    gate,
    operator,
    path_product,
    readout,
)
from drmlab.resolvent.reference import __all__  # the public names are the reference's
