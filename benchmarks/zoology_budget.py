"""What the Zoology MQAR study at CPU budget costs (docs/mqar.md section 10.9), in
one-thread hours, before any of it is run: per model and (length, width) cell, one training step
(forward, loss at the query positions, backward) timed on a slice of the protocol's batch and scaled to
the whole batch, then to the budget's steps.

    PYTHONPATH=src python benchmarks/zoology_budget.py                  # the study's models, L 64/256, W 64/128
    PYTHONPATH=src python benchmarks/zoology_budget.py --json out.json --slice 32 --repeats 3

Per cell, with ``E`` the steps of one epoch (100,000 examples / the length's batch), ``t`` the seconds of
one step, ``G`` the rates of the grid, ``P`` the probe's epochs and ``N`` the most epochs::

    probe      G * P * E * t          every rate trains its first P epochs
    the rest   (N - P) * E * t        the chosen rate goes on (less where it stops early above 0.99)

The step is timed eager (no torch.compile: one compile per cell would cost more than the timing) in
float32 and, where the CPU has bf16 matrix units, under the bf16 autocast that ``--fast`` adds: the
study's own steps, compiled, are somewhat faster than the faster of the two. The evaluation of the test
set after each epoch and the optimizer's update are left out (both small beside an epoch of steps). The
slice is timed ``--repeats`` times after a warm-up, one model after another, and the median kept; a step
of a slice of B' rows is scaled by B / B' (a CPU step at these widths grows about linearly in the rows).
Take the figures with the studies beside it paused (tools/pause_studies.py) or say what ran beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from drmlab.experiments.mqar import zoology
from drmlab.training.fast import bf16_unavailable
from drmlab.training.trainer import targets_loss

MODELS = "ATTENTION,MAMBA,RESOLVENT,SSM_CONTROL,J_NO_DIRECTION,ASM_CM"


def _step_seconds(model, inputs, targets, bf16: bool, repeats: int) -> float:
    """The median seconds of forward + query-position loss + backward over ``repeats`` steps (after one)."""
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, _ = targets_loss(model, inputs, targets, step=1, bf16=bf16, scored_only=True)
        loss.backward()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cell_hours(step_s: float, per_epoch: int, grid: int, probe: int, epochs: int) -> dict:
    """The one-thread hours of one cell: the probe of every rate, then the chosen rate's remaining epochs."""
    return {
        "probe_h": grid * probe * per_epoch * step_s / 3600,
        "rest_h": (epochs - probe) * per_epoch * step_s / 3600,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--seq-lens", default="64,256")
    parser.add_argument("--widths", default="64,128")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--probe-epochs", type=int, default=2)
    parser.add_argument("--slice", type=int, default=32, help="rows of the batch timed (scaled to the batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = zoology.RECIPE
    grid = len(recipe.lr_grid)
    bf16 = bf16_unavailable(torch.device("cpu")) is None
    rows = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        kv = dict(zoology.SETTINGS)[seq_len]
        batch = recipe.batch_size(seq_len)
        per_epoch = recipe.steps_per_epoch(seq_len)
        rows_timed = min(args.slice, batch)
        x, y = zoology.generate(seq_len, kv, rows_timed, seed=0)
        x, y = x.long(), y.long()
        for width in (int(w) for w in args.widths.split(",")):
            for name in args.models.split(","):
                try:
                    model, _, _ = zoology.protocol_model(name, "tiny", width, seq_len, recipe.seed)
                except ValueError as exc:
                    rows.append({"model": name, "seq_len": seq_len, "width": width, "na": str(exc)})
                    continue
                model.train()
                row = {"model": name, "seq_len": seq_len, "width": width, "batch": batch, "per_epoch": per_epoch}
                row["params"] = sum(p.numel() for p in model.parameters())
                for dtype in ("float32", "bf16") if bf16 else ("float32",):
                    step = _step_seconds(model, x, y, dtype == "bf16", args.repeats) * batch / rows_timed
                    row[f"{dtype}_step_s"] = step
                    row[dtype] = cell_hours(step, per_epoch, grid, args.probe_epochs, args.epochs)
                rows.append(row)
                print(_line(row), flush=True)
    settings = {
        "models": args.models.split(","),
        "seq_lens": args.seq_lens,
        "widths": args.widths,
        "epochs": args.epochs,
        "probe_epochs": args.probe_epochs,
        "grid": grid,
        "slice": args.slice,
        "repeats": args.repeats,
        "threads": args.threads,
        "torch": torch.__version__,
    }
    best = [min(r[k]["probe_h"] + r[k]["rest_h"] for k in ("float32", "bf16") if k in r) for r in rows if "na" not in r]
    print(f"all cells, the faster dtype, no early stop: {sum(best):.1f} one-thread hours")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "rows": rows}, f, indent=1)
    return 0


def _line(row: dict) -> str:
    cells = [f"{row['model']:<15} L{row['seq_len']:<4} W{row['width']:<4}"]
    for dtype in ("float32", "bf16"):
        if dtype in row:
            h = row[dtype]
            cells.append(
                f"{dtype}: {row[f'{dtype}_step_s']:.2f} s/step, probe {h['probe_h']:.1f} h + rest {h['rest_h']:.1f} h"
            )
    return " | ".join(cells)


if __name__ == "__main__":
    raise SystemExit(main())
