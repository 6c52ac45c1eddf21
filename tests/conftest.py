"""Test-wide settings: one intra-op thread, one training process, the Hypothesis profiles, and the rule for the one
capability a test may find missing (the C kernel needs a C compiler on the machine).

One thread: the suite runs mostly tiny tensors, for which thread hand-offs cost more than they
save, and CI machines are shared (2 cores). One training process (``DRMLAB_PROCS=1``): ``drmlab train
--procs auto`` would start one process per idle core, which depends on the load of the moment; the tests
of --procs ask for their processes by name.

Hypothesis profiles (https://hypothesis.readthedocs.io/en/latest/reference/api.html#settings):
``ci`` is the default and is deterministic -- examples are drawn from a seed derived from each
test, the example database is off, so every run draws the same examples and a failure reproduces
on any machine; ``dev`` (``HYPOTHESIS_PROFILE=dev``) draws ten times as many fresh random examples
per run, for looking for new failures locally. A failure in either prints the blob that replays it
(``@reproduce_failure``).
"""

import os
import sysconfig
from pathlib import Path

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
os.environ["DRMLAB_PROCS"] = "1"
# drmlab train compiles where it pays by default (--compile auto): off here, so that a test's run does not depend
# on what this machine's earlier compiled runs recorded; the tests of auto ask for it
os.environ["DRMLAB_COMPILE"] = "off"

# --------------------------------------------------------------------------- Hypothesis

CI_EXAMPLES = 60  # the per-test count the property tests were written with; do not lower it
settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=CI_EXAMPLES, deadline=None, print_blob=True
)
settings.register_profile("dev", max_examples=10 * CI_EXAMPLES, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# --------------------------------------------------------------------------- the C kernel


@pytest.fixture
def c_kernel():
    """For tests of the compiled C kernels. Skips only when the kernels are switched off on
    purpose (``DRMLAB_NO_CKERNEL``) or the machine has no C compiler; with a compiler present, a
    kernel that fails to build, load or pass its check fails the test instead of hiding behind a
    skip. With ``DRMLAB_REQUIRE_CKERNEL=1`` (set by .ci/run) those two skips are failures too."""
    from drmlab.ops import ckernels  # importing drmlab.ops registers every kernel

    required = f" but {ckernels.REQUIRE_ENV}=1" if ckernels.required_by_env() else ""
    skip_or_fail = pytest.fail if required else pytest.skip
    if ckernels.disabled_by_env():
        skip_or_fail(f"C kernels switched off by {ckernels.DISABLE_ENV}{required}")
    compiler = ckernels.find_compiler()
    if compiler is None:
        skip_or_fail(f"no C compiler on this machine (set CC, or install gcc/clang){required}")
    broken = {name: s["error"] for name, s in ckernels.c_kernel_status().items() if not s["available"]}
    if broken:
        pytest.fail(f"a C compiler ({compiler}) is present but these C kernels are unavailable: {broken}")


# --------------------------------------------------------------------------- a small corpus


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """Three modules of the Python standard library as one text file: a corpus on every machine, no
    download (a test module may define its own)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("\n\n".join((stdlib / n).read_text() for n in ("textwrap.py", "bisect.py", "colorsys.py")))
    return path
