from drmlab.experiments.inspect import add_parser, run  # noqa: F401  (moved here in the CLI split)
