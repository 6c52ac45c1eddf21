from drmlab.experiments.residual_probe import add_parser, run  # noqa: F401  (moved here in the CLI split)
