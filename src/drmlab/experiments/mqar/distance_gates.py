"""The distance MQAR protocol's statistics and gates (docs/mqar.md section 8).

Each length reports correct / total over ``n_eval`` sequences x P targets (the task's pairs, 8 by
default) with a Wilson 95% interval
(:func:`wilson_interval`). Gates (:func:`gate_verdicts`): the control passes at >= 80%, and only a
passed control authorises the long reads; each longer length passes at >= 80%; the decoding state at
the longest length read is at most 1.1 x the state at the length before it.
"""

from __future__ import annotations

import math

from drmlab.experiments.mqar.distance_task import CONTROL_LENGTH

GATE_THRESHOLD = 0.8
STATE_GROWTH_LIMIT = 1.1
WILSON_Z = 1.959963984540054  # the 97.5% normal quantile


def wilson_interval(correct: int, total: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion correct/total:
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    if total <= 0 or not 0 <= correct <= total:
        raise ValueError(f"a Wilson interval needs 0 <= correct <= total and total > 0, got {correct}/{total}")
    p, n, z2 = correct / total, total, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if correct == 0 else max(0.0, centre - half)  # exact at the ends, where rounding would leave 1e-18
    return low, 1.0 if correct == total else min(1.0, centre + half)


def gate_verdicts(lengths: dict, threshold: float = GATE_THRESHOLD, control: int = CONTROL_LENGTH) -> dict:
    """The protocol's verdicts from per-length records (``{length: record}``; a record has ``status``
    "read" with ``acc`` and ``state_bytes``, "n/a" with ``context``, or "not read").

    ``control`` (the control length: 5 x the task's pairs): pass at acc >= threshold; it authorises the long reads. ``lengths``: per longer length
    "pass" / "fail" (acc against threshold), "not authorised" (the control failed or is missing),
    "n/a (context N)" or "not read". ``state``: the decoding state of the longest length read against
    the length read before it (<= 1.1 x), when two longer lengths were read. ``passed``: every verdict
    passes; ``reasons`` says why not.
    """
    records = {int(k): v for k, v in lengths.items()}
    reasons: list[str] = []
    rec = records.get(control)
    control_pass = bool(rec and rec.get("status") == "read" and rec["acc"] >= threshold)
    if rec is None or rec.get("status") != "read":
        reasons.append(f"the {control}-token control was not read")
    elif not control_pass:
        reasons.append(f"control {100 * rec['acc']:.2f}% < {100 * threshold:.0f}%: the long reads are not authorised")
    verdicts: dict[str, str] = {}
    for length in sorted(k for k in records if k != control):
        r = records[length]
        if r.get("status") == "n/a":
            verdict = f"n/a (context {r['context']})"
        elif not control_pass:
            verdict = "not authorised"
        elif r.get("status") != "read":
            verdict = "not read"
        else:
            verdict = "pass" if r["acc"] >= threshold else "fail"
        verdicts[str(length)] = verdict
        if verdict != "pass" and control_pass:
            reasons.append(f"{length}: {verdict}" + (f" ({100 * r['acc']:.2f}%)" if verdict == "fail" else ""))
    read = [k for k in sorted(records) if k != control and records[k].get("status") == "read"]
    state = None
    if len(read) >= 2:
        shorter, longest = read[-2], read[-1]
        a, b = records[shorter]["state_bytes"], records[longest]["state_bytes"]
        state = {"lengths": [shorter, longest], "bytes": [a, b], "pass": b <= STATE_GROWTH_LIMIT * a}
        if not state["pass"]:
            reasons.append(f"the decoding state grew from {a:,} bytes at {shorter} to {b:,} at {longest}")
    return {
        "threshold": threshold,
        "control": {"length": control, "pass": control_pass},
        "lengths": verdicts,
        "state": state,
        "passed": not reasons,
        "reasons": reasons,
    }
