from drmlab.experiments.mqar import add_parser, run  # noqa: F401  (moved here in the CLI split)
