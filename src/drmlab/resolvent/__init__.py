"""The resolvent operator (``docs/resolvent.md``): one causal attention head with three
switches ``(beta, qk, g)`` whose corners are softmax attention, unnormalized-kernel attention and the
exact path product of a gated chain.

* :mod:`drmlab.resolvent.reference` -- float64 numpy reference with the exact semantics of
  ``docs/resolvent.md`` sections 1-4 (re-exported here: ``Switches``, ``NonFinite``, ``blend``,
  ``gate``, ``path_product``, ``operator``, ``readout``, ``chain_label``).
* :mod:`drmlab.resolvent.attention` -- the batched, differentiable torch operator
  (``resolvent_attention``, section 6): the dispatcher over one module per path,
  :mod:`~drmlab.resolvent.dense`, :mod:`~drmlab.resolvent.sdpa`, :mod:`~drmlab.resolvent.flash`,
  :mod:`~drmlab.resolvent.flex` and :mod:`~drmlab.resolvent.scan`, with the shared gate sums in
  :mod:`~drmlab.resolvent.common` and the ``check_finite`` refusals in
  :mod:`~drmlab.resolvent.checks`.
* :mod:`drmlab.resolvent.gates` -- gate magnitude parameterisations (the reference clamp,
  hard-concrete, sigmoid) and a trainable gate head (section 7).

Importing this package does not import torch.
"""

from drmlab.resolvent.reference import (
    NonFinite,
    Switches,
    __all__,  # the public names are the reference's
    blend,
    chain_label,
    gate,
    operator,
    path_product,
    readout,
)
