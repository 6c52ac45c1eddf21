"""Bit-level fingerprint of every registered model: parameters, logits, stepped logits and a training
gradient at preset micro, in float32 and float64 (the check that a change leaves every model's behaviour the same).

    PYTHONPATH=src python tools/fingerprint.py --out before.json        # on the old tree
    PYTHONPATH=src python tools/fingerprint.py --compare before.json    # on the new tree: lists every difference

Each entry is the sha256 of a tensor's bytes, so equal entries mean bit-identical tensors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch

from drmlab.models import build_model, list_models


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def _length(model) -> int:
    limit = getattr(model.config, "max_seq_len", None) or getattr(model.config, "n_positions", 32)
    return 2 * limit + 3 if not getattr(model, "has_position_limit", False) else limit


def fingerprint(name: str, dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    model = build_model(name, preset="micro", seed=3).to(dtype)
    record = {"params": _digest(torch.cat([p.detach().reshape(-1).to(torch.float64) for p in model.parameters()]))}
    tokens = torch.randint(0, 256, (2, _length(model)), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        record["logits"] = _digest(model(tokens).logits)
        state = model.init_state(tokens.shape[0])
        stepped = []
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            stepped.append(logits)
        record["stepped"] = _digest(torch.stack(stepped, 1))
    model.train()
    train_tokens = tokens[:, : min(tokens.shape[1], 33)]
    out = model(train_tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(
        out.logits.reshape(-1, out.logits.shape[-1]).float(), train_tokens[:, 1:].reshape(-1)
    )
    loss.backward()
    record["loss"] = repr(loss.item())
    grads = [p.grad.reshape(-1).to(torch.float64) for p in model.parameters() if p.grad is not None]
    record["grad"] = _digest(torch.cat(grads)) if grads else None
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--compare")
    parser.add_argument("--models", default=None, help="comma-separated subset (default: every registered model)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.models.split(",") if args.models else list_models()
    result = {}
    for name in names:
        for dtype in (torch.float32, torch.float64):
            result[f"{name}/{str(dtype).removeprefix('torch.')}"] = fingerprint(name, dtype)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        diffs = [
            f"{key} {field}"
            for key, rec in result.items()
            for field, value in rec.items()
            if key in before and before[key].get(field) != value
        ]
        missing = sorted(set(before) - set(result)) if not args.models else []
        for line in diffs + [f"{key} missing" for key in missing]:
            print("DIFFERS:", line)
        print(f"{len(result)} fingerprints compared, {len(diffs)} differ, {len(missing)} missing")
        return 1 if diffs or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
