"""``drmlab inspect``: build a model, run one forward pass, print its diagnostics.

For DRM variants it prints the geometry report of ``drmlab.models.drm.diagnostics``
(dimD, metric energy and action, coupling, numerical ranks of G and of the direction
frame); for every model it prints the parameter count, the forward time and the
cross-entropy of the untrained model on a piece of real text.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from drmlab.models import PRESETS, build_model


def _sample_text() -> bytes:
    """A piece of real text present on every machine: the source of Python's argparse module."""
    return Path(argparse.__file__).read_bytes()


def inspect_model(name: str, preset: str, seed: int = 0, length: int | None = None, batch: int = 2, **overrides) -> dict:
    model = build_model(name, preset=preset, vocab_size=256, seed=seed, **overrides).eval()
    config = getattr(model, "config", None)
    length = length or getattr(config, "max_seq_len", 256)
    data = torch.frombuffer(bytearray(_sample_text()[: batch * (length + 1)]), dtype=torch.uint8).long()
    tokens = data.view(batch, length + 1)
    with torch.no_grad():
        start = time.perf_counter()
        out = model(tokens[:, :-1])
        elapsed = time.perf_counter() - start
    ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tokens[:, 1:].reshape(-1))
    report = {
        "model": name, "preset": preset, "params": sum(p.numel() for p in model.parameters()),
        "tokens": int(tokens[:, :-1].numel()), "forward_s": round(elapsed, 4),
        "ce_untrained_nats": float(ce), "ce_uniform_nats": float(torch.log(torch.tensor(256.0))),
    }
    if hasattr(model, "states"):  # the DRM family
        from drmlab.models.drm.diagnostics import geometry_report

        report["geometry"] = geometry_report(model, tokens[:, :-1])
    return report


def _print(report: dict, indent: str = "") -> None:
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print(value, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], list):
            print(f"{indent}{key}: [{len(value)} x {len(value[0])} matrix, see --json]")
        elif isinstance(value, float):
            print(f"{indent}{key}: {value:.6g}")
        else:
            print(f"{indent}{key}: {value}")


def run(args: argparse.Namespace) -> int:
    if args.list:
        from drmlab.models import list_models

        print("\n".join(list_models()))
        return 0
    report = inspect_model(args.model, args.preset, seed=args.seed, length=args.length)
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect", help="build a model, run a forward pass and print its diagnostics",
        description="Build MODEL at PRESET, run one forward pass on a piece of real text and print the "
                    "parameter count, the untrained cross-entropy and (for DRM variants) the geometry "
                    "diagnostics: dimD, metric energy and action, coupling, numerical ranks.")
    p.add_argument("--model", default="J", help="registered model name (default J; see `drmlab inspect --list`)")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length", type=int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--json", default=None, help="also write the report as JSON to this path")
    p.add_argument("--list", action="store_true", help="list every registered model name and exit")
    p.set_defaults(func=run)
