from drmlab.experiments.loop_study import add_parser, run  # noqa: F401  (moved here in the CLI split)
