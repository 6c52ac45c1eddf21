"""Whether a run compiles its training forward under ``--compile auto`` (docs/architecture.md, "Compiled
models"): it does when the time compiling is expected to save over the run's planned steps is at least
:data:`MARGIN` times what compiling costs.

    expected saving  S = steps * grad_accum * t_eager * (1 - 1/r)    r: compiled speed over eager speed
    cost             C = seconds to compile
    compile when     r > 1 and S >= MARGIN * C

The figures come, first, from this machine's own record of an earlier compiled run of the same model shape,
device, precision, threads and torch (:class:`CompileRecords`, ``compile-records.jsonl`` in drmlab's cache
folder; every compiled run adds its figures once its compile report is made: ``t_eager`` and ``r`` from its
eager and compiled step times, ``C`` its own compile, warm when the Inductor cache already held the kernels);
else, on a CPU, ``r`` and ``C`` from :data:`MEASURED` (benchmarks/bench_compile.py, docs/studies/bench-compile:
one thread, preset tiny, a cold cache) and ``t_eager`` timed in the run itself before it starts (two eager
passes, :func:`drmlab.training.compile_report.time_eager_pass`; not in a distributed run, whose collectives
would be timed too). A run neither gives figures for is not compiled: unmeasured, said in the line.

The choice is one :class:`CompileChoice`: ``on``, and the one line that says why with the expected saving.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from drmlab.devices import cpu_name

__all__ = [
    "AUTO",
    "MARGIN",
    "MEASURED",
    "MEASURED_ON",
    "CompileChoice",
    "CompileRecords",
    "choose",
    "record_key",
]

AUTO = "auto"
# compile only when the expected saving is at least this many times the compile's cost: the estimate of the
# saving comes from a few timed steps (or another machine's ratio), so a run that would only just repay the
# compile stays eager
MARGIN = 2.0
# (model, precision) -> (compiled / eager training tokens/s, seconds to compile from a cold cache), measured by
# benchmarks/bench_compile.py at preset tiny, one thread, on MEASURED_ON (docs/studies/bench-compile); used on a
# CPU when this machine has no record of its own
# (a model after the first found the benchmark's cache holding the pieces all models share, so its cold figure is
# lower than on a machine that never compiled)
MEASURED: dict[tuple[str, str], tuple[float, float]] = {
    ("J", "float32"): (1.16, 116.0),
    ("J_NO_DIRECTION", "float32"): (1.11, 44.0),
    ("SSM_CONTROL", "float32"): (1.04, 36.0),
    ("J_DIRECT_CONTROL_MATCHED", "float32"): (1.03, 45.0),
    ("MAMBA", "float32"): (0.99, 27.0),
    ("GPT2", "float32"): (1.11, 15.0),
    ("LLAMA", "float32"): (1.07, 15.0),
    ("RESOLVENT", "float32"): (0.78, 247.0),
    ("J", "bf16"): (1.48, 142.0),
    ("J_NO_DIRECTION", "bf16"): (1.44, 71.0),
    ("SSM_CONTROL", "bf16"): (1.33, 60.0),
    ("J_DIRECT_CONTROL_MATCHED", "bf16"): (1.32, 45.0),
    ("MAMBA", "bf16"): (1.22, 28.0),
    ("GPT2", "bf16"): (1.03, 16.0),
    ("LLAMA", "bf16"): (1.09, 19.0),
    ("RESOLVENT", "bf16"): (0.82, 239.0),
}
MEASURED_ON = "one thread of a 2-core AMD EPYC (AVX512, AVX512-BF16, no AMX), preset tiny"
RECORDS_FILE = "compile-records.jsonl"


@dataclass(frozen=True)
class CompileChoice:
    """Whether to compile, and the one line saying why (with the expected saving where there is one)."""

    on: bool
    why: str
    ratio: float | None = None
    compile_seconds: float | None = None
    expected_saving_seconds: float | None = None
    source: str | None = None  # "this machine" or "benchmark"

    def as_record(self) -> dict:
        """For config.json's runtime: what auto chose and from what."""
        return asdict(self)


def record_key(
    model_name: str, model_config: dict | None, micro_batch: tuple[int, int], precision: str, device: torch.device
) -> str:
    """The shape of a compiled run that its figures hold for: the model and its configuration, the micro-batch
    (rows, length), the precision, the device (the CPU's name, or the GPU's), torch's threads and version."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    parts = {
        "model": model_name,
        "config": model_config,
        "micro_batch": list(micro_batch),
        "precision": precision,
        "device": f"{device.type}: {where}",
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class CompileRecords:
    """This machine's measured figures of compiled runs, one JSON object per line of ``path``: key, eager
    seconds (one micro-batch's forward and backward), ratio, compile seconds, date. A file that cannot be read or written is no record (never an error)."""

    def __init__(self, path: Path | None):
        self.path = path

    @classmethod
    def default(cls) -> CompileRecords:
        """The records in drmlab's cache folder (``$DRMLAB_CACHE_DIR``, else the user's cache), or none."""
        from drmlab.ops import ckernels

        for base in ckernels.cache_dirs():
            try:
                return cls(ckernels.private_cache_dir(base) / RECORDS_FILE)
            except OSError:
                continue
        return cls(None)

    def latest(self, key: str) -> dict | None:
        """The last record of ``key``, or None."""
        if self.path is None:
            return None
        found = None
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("key") == key:
                found = entry
        return found

    def add(self, key: str, *, eager_seconds: float, compiled_seconds: float, compile_seconds: float) -> None:
        """Append one compiled run's figures (one micro-batch's forward and backward, eager and compiled)."""
        if self.path is None or not (eager_seconds > 0 and compiled_seconds > 0):
            return
        entry = {
            "key": key,
            "eager_seconds": eager_seconds,
            "ratio": eager_seconds / compiled_seconds,
            "compile_seconds": max(0.0, compile_seconds),
            "date": time.strftime("%Y-%m-%d"),
        }
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError:
            pass


def _seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 else f"{value:.1f} s"


def choose(
    model_name: str,
    *,
    key: str,
    device: torch.device,
    precision: str,
    steps: int,
    grad_accum: int,
    eager_seconds,
    records: CompileRecords,
    measured: dict[tuple[str, str], tuple[float, float]] | None = None,
) -> CompileChoice:
    """Whether to compile ``model_name`` for ``steps`` optimizer steps. ``eager_seconds``: a callable giving one
    micro-batch's eager forward and backward (None where it cannot be timed), called only when a benchmark's
    ratio could make compiling pay and this machine has no record."""
    measured = MEASURED if measured is None else measured
    record = records.latest(key)
    eager = None
    if record is not None:
        ratio, cost, source = float(record["ratio"]), float(record["compile_seconds"]), "this machine"
        eager = record.get("eager_seconds")
        origin = f"measured on this machine on {record.get('date', 'an earlier day')}"
    elif device.type == "cpu" and (model_name, precision) in measured:
        ratio, cost = measured[model_name, precision]
        source, origin = "benchmark", f"measured on {MEASURED_ON}"
    else:
        return CompileChoice(
            False,
            f"compile: off (auto): not measured for {model_name} in {precision} on {device.type}; "
            "--compile on to try (the run's figures then guide later runs here)",
        )
    if ratio <= 1.0:
        return CompileChoice(
            False,
            f"compile: off (auto): compiled {model_name} trained no faster ({ratio:.2f}x, {origin})",
            ratio,
            cost,
            None,
            source,
        )
    if eager is None:
        eager = eager_seconds()
    if eager is None:
        return CompileChoice(
            False,
            f"compile: off (auto): a distributed run cannot time {model_name}'s eager step and this machine has "
            "no record of its own; --compile on to try (the run's figures then guide later runs here)",
            ratio,
            cost,
            None,
            source,
        )
    saving = steps * grad_accum * float(eager) * (1.0 - 1.0 / ratio)
    on = saving >= MARGIN * cost
    verdict = "on" if on else "off"
    return CompileChoice(
        on,
        f"compile: {verdict} (auto): {ratio:.2f}x per step ({origin}) saves about {_seconds(saving)} over "
        f"{steps:,} steps for about {_seconds(cost)} of compiling"
        + ("" if on else f" (compiles when the saving is {MARGIN:g}x the cost; --compile on to force it)"),
        ratio,
        cost,
        saving,
        source,
    )
