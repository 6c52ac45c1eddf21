"""What the five loop proofs (docs/looped.md section 7) share: the verdicts, the result type
:class:`ProofResult`, the rule that every proof runs with OpenBLAS on one thread, and small numeric
helpers (the study's matrix ``M(k)``, log-log slopes, ratios, loop-count checks)."""

from __future__ import annotations

import ctypes
import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CONFIRMED = "CONFIRMED"
REFUTED = "REFUTED"


@dataclass
class ProofResult:
    """One proof's outcome: its table (``rows``), the criterion's checks and the verdict."""

    proof: int
    title: str
    hypothesis: str
    criterion: str
    arms: dict[str, str]  # row key -> meaning of that per-arm number
    rows: list[dict[str, Any]]  # each row: {"n": N, <arm key>: number, ...}
    checks: dict[str, bool]
    stats: dict[str, Any]
    params: dict[str, Any]
    text: str  # the printed table, criterion lines and verdict
    plot_keys: list[str]  # arm keys plotted against N
    plot_ylabel: str
    seconds: float = 0.0
    verdict: str = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = CONFIRMED if self.checks and all(self.checks.values()) else REFUTED

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; non-finite floats become null, tuples lists."""
        return jsonable(
            {
                "proof": self.proof,
                "title": self.title,
                "hypothesis": self.hypothesis,
                "criterion": self.criterion,
                "arms": self.arms,
                "rows": self.rows,
                "checks": self.checks,
                "stats": self.stats,
                "verdict": self.verdict,
                "params": self.params,
                "seconds": self.seconds,
                "text": self.text,
            }
        )

    def report(self) -> str:
        head = f"Proof {self.proof} -- {self.title}"
        if not self.params.get("scaled", True):
            head += "  [planted negative: scaling removed, every eps = 1]"
        return f"{head}\n{self.text}\nverdict: {self.verdict}  ({self.seconds:.1f} s)"


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


# ----------------------------------------------------------------------------- BLAS threads

_OPENBLAS_SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)
_openblas_cache: list | None = None


def openblas_controls() -> list:
    """(get, set) thread-count functions of every OpenBLAS loaded in this process (Linux)."""
    global _openblas_cache
    if _openblas_cache is None:
        found = []
        try:
            with open("/proc/self/maps") as fh:
                paths = {ln.split()[-1] for ln in fh if "openblas" in ln.lower() and "/" in ln}
            for path in sorted(paths):
                lib = ctypes.CDLL(path)
                for get_name, set_name in _OPENBLAS_SYMBOLS:
                    if hasattr(lib, get_name) and hasattr(lib, set_name):
                        get_fn, set_fn = getattr(lib, get_name), getattr(lib, set_name)
                        get_fn.restype = ctypes.c_int
                        set_fn.argtypes = [ctypes.c_int]
                        set_fn.restype = None
                        found.append((get_fn, set_fn))
                        break
        except Exception:  # no /proc, no OpenBLAS (e.g. Accelerate/MKL): leave threads alone
            found = []
        _openblas_cache = found
    return _openblas_cache


@contextmanager
def single_blas_thread():
    """Run OpenBLAS single-threaded inside the block, restoring the previous count after.

    The proofs multiply tiny matrices; OpenBLAS threads them anyway, and on a busy 2-core box
    its spinning worker threads made proof 5 ~15x slower. One thread is the fast setting for
    these sizes. A no-op where numpy does not use OpenBLAS.
    """
    restore = []
    for get_fn, set_fn in openblas_controls():
        try:
            prev = int(get_fn())
            set_fn(1)
            restore.append((set_fn, prev))
        except Exception:
            pass
    try:
        yield
    finally:
        for set_fn, prev in restore:
            set_fn(max(prev, 1))


def blas_single(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with single_blas_thread():
            return func(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------- helpers


def study_matrix(rng: np.random.Generator, k: int) -> np.ndarray:
    """``M(k)``: a k×k standard normal matrix divided by √k."""
    return rng.normal(size=(k, k)) / np.sqrt(k)


def relu(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0)


def loglog_slope(ns, ys) -> float:
    x = np.log(np.asarray(ns, dtype=float))
    y = np.log(np.asarray(ys, dtype=float))
    return float(np.polyfit(x, y, 1)[0])


def ratio(a: float, b: float) -> float:
    return float(a / b) if b != 0 else math.inf


def check_ns(ns, minimum: int = 2) -> tuple[int, ...]:
    ns = tuple(int(n) for n in ns)
    if len(ns) < minimum:
        raise ValueError(f"need at least {minimum} loop counts, got {ns}")
    if any(n < 1 for n in ns):
        raise ValueError(f"loop counts must be >= 1, got {ns}")
    return ns
