"""ASM_CM's recall under its controls: per arm and seed the reads and each control's verdict
(``asm-cm-controls``), and its capacity per pair count and fast-weight width (``asm-cm-capacity``).
"""

from __future__ import annotations

from .format import markdown_table

CONTROL_COLUMNS = (
    ("memory_read_off", "read off"),
    ("memory_write_off", "write off"),
    ("pairs_unwritten", "pairs unwritten"),
)
KEYS_SHUFFLED_COLUMN = ("keys_shuffled", "keys shuffled")
# the capacity study reads every control but pairs_unwritten (docs/mqar.md section 9.2)
CAPACITY_CONTROLS = tuple(c for c in CONTROL_COLUMNS if c[0] != "pairs_unwritten") + (KEYS_SHUFFLED_COLUMN,)


def _asm_cm_controls_table(studies: dict[str, dict]) -> str:
    """ASM_CM's recall under the controls per arm and seed (docs/mqar.md section 8.1):
    the plain reads per length with the Wilson interval at the longest, the first query there, and each
    control at the longest length it was read with its verdict over the lengths read."""
    study = studies["asm-cm-controls"]
    rows = []
    for arm in study["arms"]:
        for seed in sorted(arm["runs"], key=int):
            run = arm["runs"][seed]
            reads = run["reads"]
            lengths = sorted(reads, key=int)
            top = reads[lengths[-1]]
            lo, hi = top["ci95"]
            cells = [arm["arm"], seed, " / ".join(f"{100 * reads[L]['acc']:.1f}" for L in lengths)]
            cells += [f"[{100 * lo:.1f}, {100 * hi:.1f}]", f"{100 * top['first_acc']:.1f}"]
            for name, _ in CONTROL_COLUMNS + (KEYS_SHUFFLED_COLUMN,):
                c = run["controls"].get(name)
                if c is None:
                    cells.append("-")
                    continue
                read = sorted((L for L in c if L.isdigit()), key=int)
                text = " / ".join(f"{100 * c[L]['acc']:.1f}" for L in (read[0], read[-1]))
                if "bound_acc" in c[read[-1]]:
                    text += " (bound " + " / ".join(f"{100 * c[L]['bound_acc']:.1f}" for L in (read[0], read[-1])) + ")"
                cells.append(f"{text}, {c['verdict'].split(':')[0].replace('(uninformative', '(uninformative)')}")
            rows.append(cells)
    some = next(iter(r for a in study["arms"] for r in a["runs"].values()), None)
    lengths = [] if some is None else sorted(some["reads"], key=int)
    longest = f"{int(lengths[-1]):,}" if lengths else "-"
    control_at = "-"
    if some is not None:
        read = sorted({int(L) for c in some["controls"].values() for L in c if L.isdigit()})
        control_at = f"{read[0]:,} / {read[-1]:,}"
    header = [
        "arm",
        "seed",
        "MQAR %, L " + " / ".join(f"{int(L):,}" for L in lengths),
        f"95% at {longest}",
        f"first query at {longest}",
        *(f"{label} at {control_at}, verdict" for _, label in CONTROL_COLUMNS),
        f"keys shuffled at {control_at}, verdict",
    ]
    return markdown_table(header, ["---", "---:", "---", "---:", "---:", "---", "---", "---", "---"], rows)


def _asm_cm_capacity_table(studies: dict[str, dict]) -> str:
    """ASM_CM's capacity (docs/mqar.md section 9.2): per (pairs, fast-weight width) the
    decoding state's bytes, the mean recall over the seeds collected at each length (the control, 5P,
    first), the seeds at 80% or more at the longest, the first query there, each control at its longest
    length (mean accuracy, the seeds in which it falls) and the language CE before and after; a last row
    counts the cells still running."""
    study = studies["asm-cm-capacity"]
    rows = []
    lengths = control_at = None
    for row in study["rows"]:
        mean, runs = row["mean"], row["runs"]
        lengths = sorted(mean["reads"], key=int)
        longest = lengths[-1]
        passing = sum(r["reads"][longest]["acc"] >= 0.8 for r in runs.values())
        cells = [str(row["pairs"]), str(row["fast_weight_dim"]), f"{row['state_bytes']:,}", str(len(mean["seeds"]))]
        cells.append(" / ".join(f"{100 * mean['reads'][L]['acc']:.1f}" for L in lengths))
        cells += [f"{passing} of {len(runs)}", f"{100 * mean['reads'][longest]['first_acc']:.1f}"]
        for name, _ in CAPACITY_CONTROLS:
            c = mean["controls"][name]
            control_at = max((L for L in c if L.isdigit()), key=int)
            cells.append(f"{100 * c[control_at]:.1f}, falls in {c['falls']} of {len(runs)}")
        cells.append(f"{mean['ce_before']:.4f} -> {mean['ce_after']:.4f}")
        rows.append(cells)
    if study["pending"]:
        rows.append([f"still running: {len(study['pending'])} of the plan's (pairs, width, seed) cells", *["-"] * 10])
    reads = "MQAR %, 5P / " + " / ".join(f"{int(L):,}" for L in (lengths or ["512", "4096", "32768"])[1:])
    longest = f"{int(lengths[-1]):,}" if lengths else "32,768"
    at = f"{int(control_at):,}" if control_at else "4,096"
    header = [
        "pairs",
        "width",
        "state, B",
        "seeds",
        reads,
        f">= 80% at {longest}",
        f"first query at {longest}",
        *(f"{label} at {at}, %" for _, label in CAPACITY_CONTROLS),
        "CE before -> after, nats/byte",
    ]
    return markdown_table(
        header, ["---:", "---:", "---:", "---:", "---", "---:", "---:", "---", "---", "---", "---"], rows
    )
