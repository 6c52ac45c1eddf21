"""Evaluation: deterministic rescoring of a token stream (``rescoring``) and the long-context evaluation:
scores per target in windows or with the state carried through each document (``carried``), loss by
position (``positions``), their reports (``long_context``) and the memory a window takes (``memory``).
The ``drmlab eval`` verb is :mod:`drmlab.cli.eval`."""

from drmlab.evaluation.rescoring import byte_counter, rescore, rescorer

__all__ = ["byte_counter", "rescore", "rescorer"]
