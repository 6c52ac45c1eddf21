from drmlab.experiments.compare import add_parser, run  # noqa: F401  (moved here in the CLI split)
