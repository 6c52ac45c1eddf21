"""``python -m drmlab ...``: the ``drmlab`` command without its installed script (a source checkout on
``PYTHONPATH``, or ``torchrun -m drmlab train ...``)."""

import sys

from drmlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
