"""How much memory scoring a window takes, estimated before it is tried: a window too long for the machine
is refused in one line naming the largest that fits, instead of an out-of-memory error.

**Measured, then extrapolated.** :class:`PeakBytes` (a ``TorchDispatchMode``) follows every tensor storage
that an operation creates until it is freed, and keeps the peak of their bytes. :func:`fit_memory` runs
the scoring of one window (the forward and the per-token loss, no gradient) at batch 1 and three short
lengths ``t, 2t, 4t`` (``t`` = 256, or less below a position table), fits ``a + b L + c L^2`` through the
three peaks (``c >= 0``: attention's score matrices grow with the square of the length, a recurrent
model's activations with the length) and predicts ``batch * (a + b L + c L^2) * MARGIN`` -- the whole peak
scaled by the batch, a margin on top. The parameters are already in memory and not counted. Memory an
extension allocates outside PyTorch's operations (a C kernel's own scratch) is not seen; the margin is
for that and for the allocator's rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MARGIN = 1.25
BASE_LENGTH = 256


class PeakBytes(TorchDispatchMode):
    """Inside it, ``peak`` is the most bytes held at once by the tensor storages created inside it."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                ref = StorageWeakRef(leaf.untyped_storage())
                self.live.setdefault(ref.cdata, (ref, leaf.untyped_storage().nbytes()))
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


@torch.no_grad()
def measured_peak(model, length: int, device) -> int:
    """The peak bytes of scoring one window of ``length`` tokens at batch 1 (forward, float32 logits, the
    per-token loss), in eval mode."""
    was_training = model.training
    model.eval()
    tokens = torch.zeros(1, length + 1, dtype=torch.long, device=device)
    try:
        with PeakBytes() as meter, torch.autocast(device_type=torch.device(device).type, enabled=False):
            logits = model(tokens[:, :-1]).logits.float()
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
            del logits
    finally:
        model.train(was_training)
    return meter.peak


@dataclass
class MemoryModel:
    """Bytes of scoring ``batch`` windows of ``length`` tokens: ``batch * (a + b L + c L^2) * MARGIN``."""

    a: float
    b: float
    c: float
    lengths: tuple[int, ...]

    def bytes(self, batch: int, length: int) -> int:
        return int(batch * (self.a + self.b * length + self.c * length * length) * MARGIN)

    def largest_length(self, batch: int, budget: int) -> int:
        """The longest window that fits ``budget`` bytes at ``batch`` (0 when none does)."""
        room = budget / (MARGIN * batch) - self.a
        if room <= 0:
            return 0
        if self.c <= 0:
            return int(room / self.b) if self.b > 0 else 2**62
        return int((-self.b + math.sqrt(self.b * self.b + 4 * self.c * room)) / (2 * self.c))

    def largest_batch(self, length: int, budget: int, most: int) -> int:
        """The largest batch, at most ``most``, whose windows of ``length`` fit ``budget`` (0 when none)."""
        one = self.bytes(1, length)
        return min(most, budget // one) if one > 0 else most

    def describe(self) -> str:
        return f"measured at {', '.join(map(str, self.lengths))} tokens and extrapolated"


def fit_memory(model, device, limit: int | None = None) -> MemoryModel | None:
    """Fit :class:`MemoryModel` from windows of ``t, 2t, 4t`` tokens (``4t`` at most ``limit``, the positions
    the model can read); None when the model cannot be measured (then nothing is checked)."""
    top = min(4 * BASE_LENGTH, limit) if limit is not None else 4 * BASE_LENGTH
    lengths = (max(1, top // 4), max(2, top // 2), max(3, top))
    try:
        peaks = [float(measured_peak(model, n, device)) for n in lengths]
    except Exception:  # a measurement that fails must not stop the evaluation: nothing is checked then
        return None
    (l1, l2, l3), (p1, p2, p3) = lengths, peaks
    s12, s23 = (p2 - p1) / (l2 - l1), (p3 - p2) / (l3 - l2)
    c = max(0.0, (s23 - s12) / (l3 - l1))
    b = max(0.0, s23 - c * (l3 + l2))
    a = max(0.0, p3 - b * l3 - c * l3 * l3)
    return MemoryModel(a, b, c, lengths)
