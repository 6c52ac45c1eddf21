"""The figures ``tools/readme.py`` draws from the committed study records (:data:`FIGURES`), each tagged in
its PNG metadata with the SHA-256 of its values and of its drawing code's source, so that a check needs no
particular matplotlib version. Not part of the installed package; it imports drmlab as a library.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from readme_tables import cross_family_rows, protocol_records

FIGURE_PATH = Path("docs") / "figures" / "compare-tiny.png"
FIGURE_KEY = "drmlab-source"


def compare_figure_inputs(studies: dict[str, dict]) -> dict:
    """What the compare-tiny figure draws: the cross-family rows with both bits per byte and MQAR accuracy
    (as fractions, as ``drmlab compare`` plots them), the MQAR kv and the no-binding levels."""
    rows = [
        {
            "model": r["model"],
            "bpb_mean": r["bpb_mean"],
            "bpb_std": r["bpb_std"],
            "acc_mean": r["acc_mean"] / 100,
            "acc_std": r["acc_std"] / 100,
        }
        for r in cross_family_rows(studies)
        if "bpb_mean" in r and r["has_mqar"]
    ]
    return {"rows": rows, "kv": studies["mqar-tiny"]["protocol"]["kv"], "levels": studies["mqar-tiny"]["levels"]}


def _draw_compare(inputs: dict, path: Path, metadata: dict) -> None:
    from drmlab.experiments.probes.compare import plot

    plot(inputs["rows"], path, inputs["kv"], inputs["levels"], metadata=metadata)


def scales_figure_inputs(studies: dict[str, dict]) -> dict:
    """What the protocol-scales figure draws: per model its bits per byte and parameters at each preset."""
    from drmlab.experiments.ablate.scales import bits_per_byte_by_size

    return {"points": bits_per_byte_by_size(protocol_records(studies))}


def _draw_scales(inputs: dict, path: Path, metadata: dict) -> None:
    from drmlab.experiments.ablate.scales import plot_bits_per_byte_by_size

    title = "The protocol at each preset\n(each model at its swept rate, 5,005,312 tokens, 3 seeds)"
    plot_bits_per_byte_by_size(inputs["points"], path, title, metadata=metadata)


def zoology_frontier_inputs(studies: dict[str, dict]) -> dict:
    """What the zoology-l64 frontier draws: each cell with a final accuracy (its length, model, width, decode
    state bytes and accuracy) and the recipe that names the protocol."""
    record = studies["zoology-l64"]
    keep = ("model", "width", "seq_len", "state_bytes", "acc")
    return {
        "study": {"recipe": record["study"]["recipe"]},
        "cells": {key: {k: c.get(k) for k in keep} for key, c in sorted(record["cells"].items())},
    }


def _draw_zoology_frontier(inputs: dict, path: Path, metadata: dict) -> None:
    from drmlab.experiments.mqar.zoology_report import frontier_figure

    frontier_figure(inputs, path, metadata=metadata)


def zoology_curves_inputs(studies: dict[str, dict]) -> dict:
    """What the zoology-l64 learning curves draw: the recipe and settings, each cell's chosen rate, and each
    finished run's test accuracy after each epoch."""
    record = studies["zoology-l64"]
    return {
        "study": {"recipe": record["study"]["recipe"], "settings": record["study"]["settings"]},
        "cells": {
            key: {k: c.get(k) for k in ("model", "width", "seq_len", "lr")}
            for key, c in sorted(record["cells"].items())
        },
        "finished": [
            {
                **{k: r[k] for k in ("model", "width", "seq_len", "lr")},
                "epochs": [{"epoch": e["epoch"], "test_acc": e["test_acc"]} for e in r["epochs"]],
            }
            for r in record["finished"]
        ],
    }


def _draw_zoology_curves(inputs: dict, path: Path, metadata: dict) -> None:
    from drmlab.experiments.mqar.zoology_report import curves_figure

    curves_figure(inputs, path, metadata=metadata)


def long_context_figure_inputs(studies: dict[str, dict]) -> dict:
    """What the long-context-tiny figure draws: the training window, the by-position window, and per model
    (in the record's order) its by-position buckets that have a number (lo, hi, ce, the band's low and high;
    "n/a" and unscored buckets left out)."""
    record = studies["long-context-tiny"]
    curves = {}
    for model, entry in record["models"].items():
        if entry["by_position"] is None:
            continue
        rows = [row for row in entry["by_position"]["buckets"] if isinstance(row["ce"], float)]
        curves[model] = [{k: row[k] for k in ("lo", "hi", "ce", "low", "high")} for row in rows]
    seq_lens = {e["by_position"]["seq_len"] for e in record["models"].values() if e["by_position"] is not None}
    return {
        "train_seq_len": record["runs"]["train_seq_len"],
        "seq_len": max(seq_lens) if seq_lens else None,
        "seed": record["runs"]["seed"],
        "curves": curves,
    }


def _draw_long_context(inputs: dict, path: Path, metadata: dict) -> None:
    plot_long_context(inputs, path, metadata=metadata)


def plot_long_context(inputs: dict, path: Path, metadata: dict | None = None) -> bool:
    """The long-context-tiny figure (:func:`drmlab.experiments.position_figure.draw_models_by_position`)."""
    from drmlab.experiments.position_figure import draw_models_by_position

    return draw_models_by_position(inputs, path, metadata=metadata)


# name -> (the PNG, what it draws from the committed studies, how it draws them, the drmlab function that draws)
FIGURES = {
    "compare-tiny": (FIGURE_PATH, compare_figure_inputs, _draw_compare, "drmlab.experiments.probes.compare:plot"),
    "protocol-scales": (
        Path("docs") / "figures" / "protocol-scales.png",
        scales_figure_inputs,
        _draw_scales,
        "drmlab.experiments.ablate.scales:plot_bits_per_byte_by_size",
    ),
    "zoology-l64": (
        Path("docs") / "figures" / "zoology-l64-frontier.png",
        zoology_frontier_inputs,
        _draw_zoology_frontier,
        "drmlab.experiments.mqar.zoology_report:frontier_figure",
    ),
    "zoology-l64-curves": (
        Path("docs") / "figures" / "zoology-l64-curves.png",
        zoology_curves_inputs,
        _draw_zoology_curves,
        "drmlab.experiments.mqar.zoology_report:curves_figure",
    ),
    "long-context-tiny": (
        Path("docs") / "figures" / "long-context-tiny.png",
        long_context_figure_inputs,
        _draw_long_context,
        "drmlab.experiments.position_figure:draw_models_by_position",
    ),
}


def drawing_source(name: str) -> str:
    """The source of figure ``name``'s drawing: this tool's function and the drmlab function it calls (a
    change to either makes the committed PNG stale, as a change to its values does)."""
    import importlib
    import inspect

    _, _, draw, target = FIGURES[name]
    module, function = target.split(":")
    return inspect.getsource(draw) + inspect.getsource(getattr(importlib.import_module(module), function))


def figure_inputs(studies: dict[str, dict], name: str = "compare-tiny") -> dict:
    """The values figure ``name`` is drawn from."""
    return FIGURES[name][1](studies)


def figure_source(studies: dict[str, dict], name: str = "compare-tiny") -> str:
    """SHA-256 of the figure's inputs and of its drawing's source (:func:`drawing_source`), the tag its PNG
    carries."""
    text = json.dumps(figure_inputs(studies, name), sort_keys=True) + "\n" + drawing_source(name)
    return hashlib.sha256(text.encode()).hexdigest()


def png_text(path: str | Path) -> dict[str, str]:
    """The text metadata of the PNG file at ``path``."""
    from PIL import Image

    with Image.open(path) as image:
        return dict(getattr(image, "text", {}))


def render_figure(studies: dict[str, dict], name: str = "compare-tiny") -> bytes:
    """Figure ``name``'s PNG, drawn from the committed values and tagged with :func:`figure_source`.
    Deterministic for a given matplotlib."""
    inputs = figure_inputs(studies, name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "figure.png"
        FIGURES[name][2](inputs, path, {FIGURE_KEY: "sha256:" + figure_source(studies, name)})
        return path.read_bytes()


def figure_is_current(studies: dict[str, dict], path: str | Path, name: str = "compare-tiny") -> bool:
    """Whether the PNG at ``path`` was drawn from the committed values as they are now."""
    path = Path(path)
    if not path.is_file():
        return False
    return png_text(path).get(FIGURE_KEY) == "sha256:" + figure_source(studies, name)
