"""Evaluation: deterministic rescoring of a token stream (``rescoring``); the ``drmlab eval`` verb is :mod:`drmlab.cli.eval`."""

from drmlab.evaluation.rescoring import byte_counter, rescore, rescorer

__all__ = ["byte_counter", "rescore", "rescorer"]
