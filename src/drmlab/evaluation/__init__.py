"""Evaluation: deterministic rescoring of a token stream (``rescoring``) and ``drmlab eval`` (``command``)."""

from drmlab.evaluation.rescoring import byte_counter, rescore

__all__ = ["byte_counter", "rescore"]
