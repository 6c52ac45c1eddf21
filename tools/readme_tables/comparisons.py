"""Protocol records side by side: the promotion gate's verdicts at each preset (``protocol-scales``), under
the reference's recipe and the field's (``protocol-recipes``), at micro's two windows beside tiny
(``protocol-window``), and the field recipe's parts put back one at a time (``recipe-parts-tiny``).
"""

from __future__ import annotations

from .format import markdown_table, scientific

# the protocol at each preset, smallest first (a preset not yet studied is left out)
PROTOCOL_SCALES = {"micro": "protocol-micro", "tiny": "protocol-tiny", "small": "protocol-small"}


def protocol_records(studies: dict[str, dict]) -> dict[str, dict]:
    """The committed protocol records by preset, smallest first."""
    return {preset: studies[name] for preset, name in PROTOCOL_SCALES.items() if name in studies}


def _scales_table(studies: dict[str, dict]) -> str:
    """The promotion gate's verdicts at each preset side by side (drmlab.experiments.ablate.scales): per pair
    of models finished together at two presets or more, A's mean gain over B in nats per byte, A's paired wins,
    the model the gate promotes (or neither; "not finished" at a preset still training), and whether that
    holds, flips or changes across the presets that judged it."""
    from drmlab.experiments.ablate.scales import verdicts

    records = protocol_records(studies)
    rows = []
    for r in verdicts(records):
        cells = [_verdict_cell(v, r["a"], r["b"]) for v in r["at"].values()]
        rows.append([f"{r['a']} vs {r['b']}", *cells, r["across"]])
    if not rows:
        rows.append(["no pair is finished at two presets yet", *["-"] * len(records), "-"])
    return markdown_table(
        ["A vs B", *(f"{preset}: A's gain, wins, promoted" for preset in records), "across the presets"],
        ["---"] + ["---"] * len(records) + ["---"],
        rows,
    )


def _verdict_cell(v: dict | None, a: str, b: str) -> str:
    """One preset's verdict on the pair A vs B: A's gain (nats per byte), A's wins, the model promoted."""
    from drmlab.experiments.ablate.scales import NEITHER

    if v is None:  # this preset has not finished the pair yet
        return "not finished"
    promoted = {"A": a, "B": b, NEITHER: "neither"}[v["winner"]]
    return f"{v['gain']:+.4f}, {v['wins']} of {v['n']}: {promoted}"


def _recipes_table(
    studies: dict[str, dict], reference: str = "protocol-tiny", field: str = "protocol-tiny-field"
) -> str:
    """The protocol at tiny under the reference's recipe and the field's, side by side
    (:func:`drmlab.experiments.ablate.recipe_verdicts.side_by_side`): per pair of models finished under both,
    the gate's verdict under each (as in :func:`_scales_table`) and whether it holds, flips or changes."""
    from drmlab.experiments.ablate.recipe_verdicts import recipe_of, side_by_side

    header = ["A vs B", "reference: A's gain, wins, promoted", "field: A's gain, wins, promoted", "reference to field"]
    align = ["---"] * 4
    if reference not in studies or field not in studies:
        return markdown_table(header, align, [["not run yet", *["-"] * 3]])
    first, second = studies[reference], studies[field]
    rows = []
    for r in side_by_side(first, second):
        cells = [_verdict_cell(r["at"][recipe_of(record)], r["a"], r["b"]) for record in (first, second)]
        rows.append([f"{r['a']} vs {r['b']}", *cells, r["across"]])
    if not rows:
        rows.append(["no pair is finished under both recipes yet", *["-"] * 3])
    return markdown_table(header, align, rows)


# what each arm of recipe-parts-tiny puts back to the reference's (tools/collect_recipe_parts.py ARMS)
PARTS_PUT_BACK = {
    "betas": "betas (0.9, 0.999)",
    "schedule": "a constant rate, no warm-up",
    "decay": "decay 0.01 on every tensor",
}


def _recipe_parts_table(studies: dict[str, dict], name: str = "recipe-parts-tiny") -> str:
    """The field recipe's parts (tools/collect_recipe_parts.py): per model and rate the sweep's tuning CE under
    the reference's whole recipe, the field's, and the field's with one part put back to the reference's."""
    if name not in studies:
        return markdown_table(["arm", "scores"], ["---", "---"], [["not run yet", "-"]])
    record = studies[name]
    arms = record["arms"]
    cells = [(model, rate) for model, scores in next(iter(arms.values()))["scores"].items() for rate in scores]
    header = ["recipe", *(f"{model} at {scientific(float(rate))}" for model, rate in cells)]
    whole = {
        label: studies[study]["lr_sweep"] if study in studies else {}
        for label, study in (
            ("reference (whole)", record["beside"]["reference"]),
            ("field (whole)", record["beside"]["field"]),
        )
    }
    rows = [
        [label, *(_score(sweep.get(model, {}).get("scores", {}).get(rate)) for model, rate in cells)]
        for label, sweep in whole.items()
    ]
    rows += [
        [f"field, but {PARTS_PUT_BACK[arm]}", *(_score(a["scores"].get(model, {}).get(rate)) for model, rate in cells)]
        for arm, a in arms.items()
    ]
    return markdown_table(header, ["---"] + ["---:"] * len(cells), rows)


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# the micro confound (docs/drm.md A.7.3): micro as it ran, micro at tiny's 256-byte window, tiny
WINDOW_STUDIES = ("protocol-micro", "protocol-micro-ctx256", "protocol-tiny")


def _window_table(studies: dict[str, dict]) -> str:
    """Does the window alone turn micro's verdicts into tiny's? Per pair finished in all three records of
    :data:`WINDOW_STUDIES`, the gate's verdict in each (as in :func:`_scales_table`) and the reading of
    :func:`drmlab.experiments.ablate.scales.window_readings`."""
    from drmlab.experiments.ablate.scales import WINDOW_READINGS, window_readings

    header = ["A vs B", "micro (32-byte windows)", "micro at 256-byte windows", "tiny (256-byte windows)", "reading"]
    align = ["---"] * 5
    missing = [name for name in WINDOW_STUDIES if name not in studies]
    if missing:
        return markdown_table(header, align, [[f"not run yet: {', '.join(missing)}", *["-"] * 4]])
    rows = []
    for r in window_readings(*(studies[name] for name in WINDOW_STUDIES)):
        cells = [_verdict_cell(r[k], r["a"], r["b"]) for k in ("short", "long", "larger")]
        rows.append([f"{r['a']} vs {r['b']}", *cells, WINDOW_READINGS[r["reading"]]])
    if not rows:
        rows.append(["no pair is finished in all three records yet", *["-"] * 4])
    return markdown_table(header, align, rows)
