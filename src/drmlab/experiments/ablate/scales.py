"""One protocol at several model sizes, side by side (``docs/drm.md`` appendix A.7.3).

Each scale is a collected ``drmlab ablate`` record (``results.json``: ``models``, ``gate``, ``study``).
:func:`verdicts` sets the promotion gate's verdicts of the scales side by side: for each unordered pair of
models trained at two scales or more, which one the gate promotes over the other at each scale (or
neither), with the gate's numbers, and whether that verdict holds, flips or changes from the smallest scale
to the largest. :func:`bits_per_byte_by_size` gathers, per model, the validation bits per byte against the
parameter count over the scales, and :func:`plot_bits_per_byte_by_size` draws it. :func:`window_readings`
reads a third record, the smaller preset run at the larger one's window, to say whether the window alone
turns a verdict. :mod:`drmlab.experiments.ablate.recipe_verdicts` sets two recipes side by side with the same
:func:`verdicts`.

A pair's verdict at one scale reads the two gate entries (A over B, B over A): "A" when A is promoted,
"B" when B is, "-" when neither (the gate's rule is in the record's ``gate_rule``). Across the scales:
"holds" (the same verdict at every scale that judged it), "flips" (A at one scale, B at another), else "changes" (a
promotion appears or disappears).
"""

from __future__ import annotations

from pathlib import Path

NEITHER = "-"


def _gate_entries(record: dict) -> dict[tuple[str, str], dict]:
    return {(g["candidate"], g["baseline"]): g for g in record.get("gate") or []}


def seeds_done(record: dict, model: str) -> tuple[int, int]:
    """(paired seeds finished, seeds the study asks for) of ``model`` in a collected ablation record."""
    m = (record.get("models") or {}).get(model)
    return (0 if m is None else len(m.get("per_seed", {}))), len(record["study"].get("seeds") or [])


def finished_models(record: dict) -> list[str]:
    """The models of ``record`` whose paired runs are all finished (every seed of the study), in the study's
    order; a model part-way through its seeds is not judged or drawn yet."""
    models = record.get("models") or {}
    return [m for m in record["study"]["models"] if m in models and _finished(seeds_done(record, m))]


def _finished(done_wanted: tuple[int, int]) -> bool:
    done, wanted = done_wanted
    return done >= wanted


def pair_verdict(record: dict, a: str, b: str) -> dict | None:
    """The gate's verdict on ``a`` against ``b`` in one record: ``winner`` ("A" / "B" / "-"), ``gain`` (A's
    mean bits-per-byte gain over B; positive: A better), ``wins`` (A's paired wins), ``n`` (paired seeds);
    None when the record's gate has not judged the pair."""
    entries = _gate_entries(record)
    ab, ba = entries.get((a, b)), entries.get((b, a))
    if ab is None or ba is None:
        return None
    winner = "A" if ab["promoted"] else ("B" if ba["promoted"] else NEITHER)
    return {"winner": winner, "gain": ab["gain"], "wins": ab["wins"], "n": ab["n"]}


def across(winners: list[str]) -> str:
    """'holds', 'flips' or 'changes' for one pair's winners from the smallest scale to the largest."""
    if len(set(winners)) == 1:
        return "holds"
    if {"A", "B"} <= set(winners):
        return "flips"
    return "changes"


def verdicts(records: dict[str, dict]) -> list[dict]:
    """Per unordered pair of models finished together at two scales or more (at the one scale when
    ``records`` holds one; ``records``: label -> record, smallest first): ``a``, ``b``, ``at`` (label ->
    :func:`pair_verdict`, None at a scale where the pair is not finished yet) and ``across``
    (:func:`across` over the scales that judged it). A scale still training (protocol-micro while
    protocol-tiny and protocol-small are done) thus leaves the verdicts of the others standing. Pairs in
    the order of the models in the records."""
    labels = list(records)
    if not labels:
        return []
    finished = {label: set(finished_models(records[label])) for label in labels}
    order = [m for label in labels for m in records[label]["study"]["models"]]
    order = [m for m in dict.fromkeys(order) if any(m in done for done in finished.values())]
    needed = min(2, len(labels))
    rows = []
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            at = {label: pair_verdict(records[label], a, b) if {a, b} <= finished[label] else None for label in labels}
            judged = [v for v in at.values() if v is not None]
            if len(judged) < needed:
                continue
            rows.append({"a": a, "b": b, "at": at, "across": across([v["winner"] for v in judged])})
    return rows


WINDOW_READINGS = {
    "same": "the same at both presets",
    "window": "the window: the longer one gives the larger preset's verdict",
    "not the window": "not the window: the longer one keeps the smaller preset's verdict",
    "neither": "neither preset's verdict at the longer window",
}


def window_readings(short: dict, long: dict, larger: dict) -> list[dict]:
    """Which of two presets' verdicts a pair takes when only the window changes (the micro confound of
    ``docs/drm.md`` A.7.3): ``short`` is the smaller preset as it ran, ``long`` the same preset at the larger
    preset's window, ``larger`` the larger preset. Per pair finished in all three records: ``a``, ``b``, the
    three verdicts of :func:`pair_verdict` (``short``, ``long``, ``larger``) and ``reading``, a key of
    :data:`WINDOW_READINGS`: "same" where the two presets agree (nothing to explain), else "window" when the
    longer window gives the larger preset's verdict, "not the window" when it keeps the smaller preset's,
    "neither" when it gives a third."""
    records = {"short": short, "long": long, "larger": larger}
    rows = []
    for r in verdicts(records):
        at = r["at"]
        if any(v is None for v in at.values()):
            continue
        small, window, big = (at[k]["winner"] for k in ("short", "long", "larger"))
        if small == big:
            reading = "same"
        elif window == big:
            reading = "window"
        elif window == small:
            reading = "not the window"
        else:
            reading = "neither"
        rows.append({"a": r["a"], "b": r["b"], **at, "reading": reading})
    return rows


def bits_per_byte_by_size(records: dict[str, dict]) -> dict[str, list[dict]]:
    """Per model: one point per scale where it has paired results, ``{"scale", "params", "bpb_mean",
    "bpb_std"}``, in the order of ``records``."""
    points: dict[str, list[dict]] = {}
    for label, record in records.items():
        for model in finished_models(record):
            m = record["models"][model]
            points.setdefault(model, []).append(
                {"scale": label, "params": m["params"], "bpb_mean": m["bpb_mean"], "bpb_std": m["bpb_std"]}
            )
    return points


def plot_bits_per_byte_by_size(
    points: dict[str, list[dict]], path: str | Path, title: str, metadata: dict | None = None
) -> bool:
    """Validation bits per byte against parameters (log scale), one line per model over its scales,
    error bars the std over seeds; False (nothing drawn) when no model has a point."""
    if not any(points.values()):
        return False
    from drmlab.experiments.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.4, 4.6))
    markers = "osD^v<>ph*"
    for i, (model, pts) in enumerate(points.items()):
        if not pts:
            continue
        xs, ys, es = ([p[k] for p in pts] for k in ("params", "bpb_mean", "bpb_std"))
        ax.errorbar(xs, ys, yerr=es, marker=markers[i % len(markers)], capsize=3, lw=1.2, label=model)
    scales = {p["scale"]: p["params"] for pts in points.values() for p in pts}
    ax.set_xscale("log")
    ax.set_xlabel("parameters (log scale; " + ", ".join(scales) + ")")
    ax.set_ylabel("validation bits per byte (lower is better)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the lines, not over them
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=metadata)
    plt.close(fig)
    return True
