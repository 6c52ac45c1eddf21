"""The verdicts of one protocol under two recipes, side by side (docs/guide.md, "Recipes"; docs/results.md).

Two collected ablation studies (``results.json``) of the same models, preset, budget and seeds, trained
under two recipes (:mod:`drmlab.training.recipes`), each give the promotion gate of every ordered pair
(:mod:`drmlab.experiments.stats`). :func:`side_by_side` joins them: each unordered pair once, oriented so
that the first study's mean gain is not negative, with the gate's mean gain (nats per byte of the
validation stream), wins and promotion under each recipe, and the verdict:

* ``holds``: the same model leads and the gate promotes (or does not) under both;
* ``flips``: each recipe puts a different model ahead by at least the gate's minimum gain;
* ``changes``: anything else (a promotion gained or lost, a lead that shrinks into a tie or grows out of one).
"""

from __future__ import annotations

# what the two studies must share for their verdicts to be compared (entries of results["study"])
SHARED = ("preset", "seeds", "tokenizer", "content_sha256")
SHARED_TRAIN = ("tokens", "batch_size", "grad_accum", "seq_len")


def _mismatch(first: dict, second: dict) -> list[str]:
    a, b = first["study"], second["study"]
    problems = [f"{key}: {a.get(key)!r} and {b.get(key)!r}" for key in SHARED if a.get(key) != b.get(key)]
    ta, tb = a.get("train", {}), b.get("train", {})
    problems += [f"{key}: {ta.get(key)!r} and {tb.get(key)!r}" for key in SHARED_TRAIN if ta.get(key) != tb.get(key)]
    return problems


def _verdict(before: dict, after: dict, min_gain: float) -> str:
    def lead(gate):  # +1 the candidate ahead, -1 the baseline, 0 within the minimum gain
        gain = gate["gain"]
        return 0 if abs(gain) < min_gain else (1 if gain > 0 else -1)

    if lead(before) * lead(after) < 0:
        return "flips"
    if lead(before) == lead(after) and before["promoted"] == after["promoted"]:
        return "holds"
    return "changes"


def side_by_side(first: dict, second: dict) -> list[dict]:
    """One row per unordered pair of models gated in both studies, the first study's largest gain first:
    ``candidate``, ``baseline`` (oriented by the first study's gain), and for each study (``first``, ``second``) its ``gain``, ``wins``, ``n`` and
    ``promoted``, then ``verdict``. Studies of another preset, budget, window, seeds or data are refused,
    naming each difference."""
    problems = _mismatch(first, second)
    if problems:
        raise ValueError("the two studies differ in more than their recipe: " + "; ".join(problems))
    min_gain = first.get("gate_rule", {}).get("min_gain", 0.0)
    gates = [{(g["candidate"], g["baseline"]): g for g in study["gate"]} for study in (first, second)]
    both = [pair for pair in gates[0] if pair in gates[1]]
    rows, seen = [], set()
    for pair in both:
        if frozenset(pair) in seen:
            continue
        seen.add(frozenset(pair))
        if gates[0][pair]["gain"] < 0 and pair[::-1] in both:  # orient the pair by the first study's lead
            pair = pair[::-1]
        before, after = gates[0][pair], gates[1][pair]
        rows.append(
            {
                "candidate": pair[0],
                "baseline": pair[1],
                **{
                    name: {key: gate[key] for key in ("gain", "wins", "n", "promoted")}
                    for name, gate in (("first", before), ("second", after))
                },
                "verdict": _verdict(before, after, min_gain),
            }
        )
    return sorted(rows, key=lambda r: (-r["first"]["gain"], r["candidate"], r["baseline"]))


def markdown(rows: list[dict], first: str = "reference", second: str = "field") -> str:
    """The rows as a markdown table; ``first`` and ``second`` name the recipes in the header."""

    def cell(s: dict) -> str:
        return f"{s['gain']:+.4f}, {s['wins']} of {s['n']}{' (promoted)' if s['promoted'] else ''}"

    lines = [
        f"| pair (candidate over baseline) | {first}: gain, wins | {second}: gain, wins | verdict |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['candidate']} over {r['baseline']} | {cell(r['first'])} | {cell(r['second'])} | {r['verdict']} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"
