from drmlab.experiments.loop_proofs import add_parser, run  # noqa: F401
