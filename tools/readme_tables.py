"""The tables ``tools/readme.py`` writes into the README and the results pages: one renderer per generated
block (:data:`BLOCK_RENDERERS`), each computing what it prints from the committed study records (means and
population standard deviations from per-seed values, bits per byte from nats, ratios of two measurements).
Not part of the installed package; it imports drmlab as a library.
"""

from __future__ import annotations

import functools
import math

from drmlab.experiments.ablate.scales import seeds_done
from drmlab.experiments.stats import mean_std

LN2 = math.log(2)


# ------------------------------------------------------------------------------- arithmetic


def _seed_values(per_seed: dict[str, float]) -> list[float]:
    return [per_seed[s] for s in sorted(per_seed, key=int)]


def _bpb_cells(record: dict) -> tuple[str, str]:
    """("mean +- std", "s1 / s2 / s3") of a record's bits per byte over its seeds (``per_seed``: the
    collect step's CE per seed; ``ce_per_seed`` in a transcribed record)."""
    bpb = [v / LN2 for v in _seed_values(record["per_seed"] if "per_seed" in record else record["ce_per_seed"])]
    mean, std = mean_std(bpb)
    return f"{mean:.4f} +- {std:.4f}", " / ".join(f"{v:.4f}" for v in bpb)


def _two_places_below_ten(x: float) -> str:
    """Two decimals below 10, one from 10 up: how the benchmark tables print times and ratios."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _sci(x: float) -> str:
    """A learning rate as the pages write it: 4e-3, 2.5e-4."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- the joined tiny studies


def lm_bits_per_byte(ablate: dict) -> dict[str, dict]:
    """Per model of the tiny ablation: params, its table label (None: the name), bits per byte (mean,
    std) and, where per-seed CE was kept, the CE mean and std in nats per byte."""
    out = {}
    for name, m in ablate["models"].items():
        row = {"params": m["params"], "label": m.get("label")}
        if "ce_per_seed" in m:
            ce = _seed_values(m["ce_per_seed"])
            row["ce_mean"], row["ce_std"] = mean_std(ce)
            row["bpb_mean"], row["bpb_std"] = row["ce_mean"] / LN2, row["ce_std"] / LN2
        else:
            row["bpb_mean"], row["bpb_std"] = m["bpb_mean"], m["bpb_std"]
        out[name] = row
    return out


def mqar_accuracy(mqar: dict) -> dict[str, dict]:
    """Per MQAR model: test accuracy mean and std in percent (computed where per-seed values were
    kept), first-query accuracy, train accuracy, params and label."""
    out = {}
    for name, m in mqar["models"].items():
        row = dict(m)
        if "acc_per_seed" in m:
            row["acc_mean"], row["acc_std"] = mean_std(_seed_values(m["acc_per_seed"]))
        out[name] = row
    return out


def cross_family_rows(studies: dict[str, dict]) -> list[dict]:
    """The rows of the cross-family table: models with bits per byte first, best first, then the
    MQAR-only models in the MQAR study's order (as ``drmlab compare`` orders them)."""
    lm = lm_bits_per_byte(studies["ablate-tiny"])
    recall = mqar_accuracy(studies["mqar-tiny"])
    rows = []
    for name in list(lm) + [n for n in recall if n not in lm]:
        row = {"model": name, **recall.get(name, {}), **lm.get(name, {})}
        row["label"] = lm.get(name, {}).get("label") or recall.get(name, {}).get("label") or name
        row["has_mqar"] = name in recall
        rows.append(row)
    with_lm = sorted((r for r in rows if "bpb_mean" in r), key=lambda r: r["bpb_mean"])
    return with_lm + [r for r in rows if "bpb_mean" not in r]


# ------------------------------------------------------------------------------- tables


def _ablate_drm_table(studies: dict[str, dict]) -> str:
    ablate = studies["ablate-tiny"]
    lm = lm_bits_per_byte(ablate)
    seeds = " / ".join(str(s) for s in ablate["protocol"]["seeds"])
    rows = []
    for name in sorted((n for n in lm if "ce_mean" in lm[n]), key=lambda n: lm[n]["ce_mean"]):
        r = lm[name]
        per_seed = " / ".join(f"{v:.4f}" for v in _seed_values(ablate["models"][name]["ce_per_seed"]))
        rows.append(
            [name, f"{r['params']:,}", f"{r['ce_mean']:.4f} +- {r['ce_std']:.4f}", per_seed, f"{r['bpb_mean']:.3f}"]
        )
    return _table(
        ["model", "params", "val CE", f"seeds {seeds}", "bits/byte"], ["---", "---:", "---", "---", "---:"], rows
    )


def _loop_study_table(studies: dict[str, dict]) -> str:
    study = studies["loop-study-tiny"]
    rows = []
    for a in study["arms"]:
        shape = f"{a['stored_blocks']} x {a['loops']}" + (f" ({a['note']})" if a.get("note") else "")
        rows.append([a["arm"], shape, a["eps"], f"{a['params']:,}", f"{a['ce_mean']:.4f} +- {a['ce_std']:.4f}"])
    n = len(study["protocol"]["seeds"])
    return _table(
        ["arm", "stored L x loops N", "eps", "params", f"val CE (nats/token), {n} seeds"],
        ["---", "---", "---", "---:", "---"],
        rows,
    )


def _percent_pm(mean: float, std: float) -> str:
    return f"{mean:.1f}% +- {std:.1f}"


def _cross_family_table(studies: dict[str, dict]) -> str:
    kv = studies["mqar-tiny"]["protocol"]["kv"]
    rows = []
    for r in cross_family_rows(studies):
        bpb = f"{r['bpb_mean']:.4f} +- {r['bpb_std']:.4f}" if "bpb_mean" in r else "--"
        if r["has_mqar"]:
            acc = _percent_pm(r["acc_mean"], r["acc_std"])
            if "acc_per_seed" in r:
                acc += " (" + " / ".join(f"{v:.1f}" for v in _seed_values(r["acc_per_seed"])) + ")"
            first = _percent_pm(r["first_query_mean"], r["first_query_std"])
            train = f"{r['train_acc']:.1f}%"
        else:
            acc = first = train = "--"
        rows.append([r["label"], f"{r['params']:,}", bpb, acc, first, train])
    return _table(
        ["model", "params", "val bits/byte", f"MQAR kv={kv}", "first query", "MQAR train acc"],
        ["---", "---:", "---", "---", "---:", "---:"],
        rows,
    )


def _bench_models_table(studies: dict[str, dict]) -> str:
    rows = []
    for p in studies["bench-models"]["presets"]:
        t = p["tokens_per_s"]
        cells = ["-" if t[m] is None else f"{t[m]:,}" for m in ("J", "J_NO_DIRECTION", "SSM_CONTROL")]
        rows.append([p["label"], *cells, f"{t['J'] / t['SSM_CONTROL']:.2f}"])
    return _table(
        ["preset", "J", "J_NO_DIRECTION", "SSM_CONTROL", "J / SSM_CONTROL"],
        ["---", "---:", "---:", "---:", "---:"],
        rows,
    )


def _bench_reference_table(studies: dict[str, dict], name: str = "bench-reference") -> str:
    """Training tokens/s against the upstream reference implementation (benchmarks/bench_reference.py):
    per preset and variant, ours and the reference's rate in thread CPU time and their ratio, the
    wall-clock ratio beside it, where the record has them drmlab with its fused kernels off, its fast
    setting and the fast setting with the memory's products in bf16 (each against the reference, CPU
    time), and the float64 gap of the pair."""
    presets = studies[name]["presets"]
    extra = [
        side
        for side in ("plain", "fast", "fast_memory")
        if all(side in v["cpu_tokens_per_s"] for p in presets for v in p["variants"].values())
    ]
    titles = {
        "plain": "fused off / reference",
        "fast": "**--fast** / reference",
        "fast_memory": "--fast, memory products in bf16 / reference",
    }
    rows = []
    for p in presets:
        for name, v in p["variants"].items():
            cpu, wall = v["cpu_tokens_per_s"], v["wall_tokens_per_s"]
            rows.append(
                [
                    p["preset"],
                    name,
                    f"{v['params']:,}",
                    f"{cpu['ours']:,.0f}",
                    f"{cpu['ref']:,.0f}",
                    f"**{cpu['ours'] / cpu['ref']:.2f}x**",
                    f"{wall['ours'] / wall['ref']:.2f}x",
                    *(f"{cpu[side] / cpu['ref']:.2f}x" for side in extra),
                    f"{v['f64_gap']:.0e}",
                ]
            )
    return _table(
        [
            "preset",
            "variant",
            "params",
            "ours tok/s (CPU)",
            "reference tok/s (CPU)",
            "ours / reference",
            "wall clock",
            *(titles[side] for side in extra),
            "f64 gap",
        ],
        ["---", "---", "---:", "---:", "---:", "---:", "---:", *(["---:"] * len(extra)), "---:"],
        rows,
    )


def _bench_decode_table(studies: dict[str, dict]) -> str:
    study = studies["bench-decode"]
    contexts = study["contexts"]
    header = [
        "model",
        f"N = {contexts[0]:,}",
        *(f"{n:,}" for n in contexts[1:]),
        f"{contexts[-1]:,} / {contexts[0]:,}",
        f"state at {contexts[-1]:,}",
    ]
    rows = []
    for m in study["models"]:
        ms = m["ms_per_token"]
        rows.append(
            [m["label"], *(_two_places_below_ten(x) for x in ms), _two_places_below_ten(ms[-1] / ms[0]), m["state"]]
        )
    return _table(header, ["---"] + ["---:"] * (len(header) - 1), rows)


def _bench_solvers_table(studies: dict[str, dict]) -> str:
    """One row per (velocity, solver) with its iteration counts side by side; one row per other step
    mode, its plain form beside its solver."""
    settings = studies["bench-solvers"]["settings"]
    rows = []
    velocity_solvers = list(dict.fromkeys(s["block_solver"] for s in settings if s["step_mode"] == "velocity"))
    for solver in velocity_solvers:
        group = [s for s in settings if s["step_mode"] == "velocity" and s["block_solver"] == solver]
        iters = " / ".join(str(s["iters"]) for s in group) if solver else "-"
        rows.append(
            [
                "velocity",
                solver or "-",
                iters,
                " / ".join(s["x_velocity"] for s in group),
                " / ".join(s["max_distance"] for s in group),
            ]
        )
    for mode in dict.fromkeys(s["step_mode"] for s in settings if s["step_mode"] != "velocity"):
        group = [s for s in settings if s["step_mode"] == mode]
        solvers = " / ".join(f"{s['block_solver']} {s['iters']}" if s["block_solver"] else "-" for s in group)
        rows.append(
            [
                mode,
                solvers,
                "",
                " / ".join(s["x_velocity"] for s in group),
                " / ".join(s["max_distance"] for s in group),
            ]
        )
    return _table(
        ["step mode", "block solver", "iters", "x velocity", "max distance to rollout"],
        ["---", "---", "---:", "---:", "---:"],
        rows,
    )


def _distance_cell(cell: dict | None) -> str:
    """One length of the distance protocol: accuracy with its Wilson interval, or why it was not read."""
    if cell is None:
        return "-"
    if cell.get("status") == "n/a":
        return f"n/a (context {cell['context']:,})"
    if cell.get("status") != "read":
        return "not read"
    low, high = cell["ci95"]
    return f"{100 * cell['acc']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def _distance_table(studies: dict[str, dict]) -> str:
    """The distance MQAR protocol at tiny (docs/mqar.md section 8): per model the control and every
    read length, and the decode state carried at the longest read."""
    study = studies["distance-tiny"]
    lengths = study["protocol"]["lengths"]
    special = studies["specialise-tiny"]["long_reads"]
    entries = study["entries"] + [
        {"model": special["label"], "params": special["params"], "lengths": special["lengths"]}
    ]
    rows = []
    for entry in entries:
        cells = [_distance_cell(entry["lengths"].get(str(n))) for n in lengths]
        longest = entry["lengths"].get(str(lengths[-1])) or {}
        state = (
            f"{longest['state_bytes']:,} B" if longest.get("status") == "read" and longest.get("state_bytes") else "-"
        )
        rows.append([entry["model"], f"{entry['params']:,}", *cells, state])
    header = [
        "model",
        "params",
        *(f"L = {n:,}" + (" (control)" if n == 40 else "") for n in lengths),
        f"state at {lengths[-1]:,}",
    ]
    return _table(header, ["---", "---:"] + ["---"] * len(lengths) + ["---:"], rows)


# Zoology's Figure 2, attention's line, read from the published image by eye (docs/mqar.md section 10.7)
ZOOLOGY_ATTENTION_FIGURE = "0.97-0.99"


def _zoology_cell(cell: dict | None, n_rates: int) -> str:
    """The best rate's final test accuracy, its rate, the epochs that rate trained and how many of the grid's
    rates have finished; in a probed study still running, how far its probe has come or the rate it chose."""
    if cell is None:
        return "not run"
    if cell.get("status") == "n/a":
        return f"n/a ({cell['why']})"
    if cell.get("acc") is None:
        from drmlab.experiments.mqar.zoology_report import without_accuracy

        return without_accuracy(cell, n_rates)
    scores = cell.get("scores") or {}
    epochs = "" if cell.get("epochs") is None else f", {cell['epochs']} epochs"
    text = f"{100 * cell['acc']:.1f}% (lr {cell['lr']:.3g}{epochs})"
    return text if len(scores) == n_rates else f"{text}; {len(scores)} of {n_rates} rates"


def _zoology_table(studies: dict[str, dict], name: str = "zoology-cpu") -> str:
    """The Zoology MQAR protocol on the CPU (docs/mqar.md section 10): per model, width and length the
    best rate's final test accuracy and the epochs it trained, attention's published value first so the
    protocol is checked against the paper before any other row is read; the header names the protocol as
    the record ran it ("at CPU budget" when it trained fewer epochs than Zoology's)."""
    from drmlab.experiments.mqar.zoology_report import protocol_name

    if name not in studies:
        return _table(["model", "accuracy", "state"], ["---", "---", "---:"], [["not run yet", "-", "-"]])
    study = studies[name]
    settings, widths = study["study"]["settings"], study["study"]["widths"]
    n_rates = len(study["study"]["lr_grid"])
    columns = [(L, w) for L, _ in settings for w in widths]
    rows = [["Zoology Fig. 2, attention (by eye)", *([ZOOLOGY_ATTENTION_FIGURE] * len(columns)), "-"]]
    for model in study["study"]["models"]:
        cells = [study["cells"].get(f"{model} w{w} L{L}") for L, w in columns]
        state = next((c.get("state_bytes") for c in cells if c and c.get("state_bytes")), None)
        rows.append([model, *(_zoology_cell(c, n_rates) for c in cells), "-" if state is None else f"{state:,} B"])
    header = [
        f"model ({protocol_name(study['study']['recipe'])})",
        *(f"L {L}, width {w}" for L, w in columns),
        f"state at L {columns[0][0]}, width {columns[0][1]}",
    ]
    return _table(header, ["---"] + ["---"] * len(columns) + ["---:"], rows)


def _zoology_budget_table(studies: dict[str, dict]) -> str:
    """The Zoology study at CPU budget, costed before it runs (benchmarks/zoology_budget.py): per model and
    (length, width) the one-thread hours of the probe and the chosen rate's run, the faster of float32 and
    bf16 autocast, no early stop; the last row adds each column up."""
    rows_in = studies["zoology-budget"]["rows"]
    columns = list(dict.fromkeys((r["seq_len"], r["width"]) for r in rows_in))

    def hours(r: dict) -> float:
        return min(r[k]["probe_h"] + r[k]["rest_h"] for k in ("float32", "bf16") if k in r)

    rows = []
    for name in dict.fromkeys(r["model"] for r in rows_in):
        mine = {(r["seq_len"], r["width"]): r for r in rows_in if r["model"] == name}
        cells = []
        for col in columns:
            r = mine.get(col)
            cells.append("-" if r is None else ("n/a" if "na" in r else f"{hours(r):.1f} h ({r['params']:,})"))
        rows.append([name, *cells])
    totals = [sum(hours(r) for r in rows_in if (r["seq_len"], r["width"]) == col and "na" not in r) for col in columns]
    rows.append(["all models", *(f"**{t:.1f} h**" for t in totals)])
    header = ["model", *(f"L {L}, width {w}: hours (params)" for L, w in columns)]
    return _table(header, ["---"] + ["---:"] * len(columns), rows)


def _mqar_cells(reads: dict[str, dict], lengths: list[int]) -> str:
    """``a / b / c / d`` percentages of the mean accuracy per length over the seeds read."""
    cells = []
    for L in lengths:
        accs = [r[str(L)]["acc"] for r in reads.values() if str(L) in r]
        cells.append("-" if not accs else f"{100 * sum(accs) / len(accs):.1f}")
    return " / ".join(cells)


def _passing(reads: dict[str, dict], longest: int) -> str:
    """``n seeds, k >= 80% at L``: how many seeds were read and how many recall at the longest length."""
    passing = sum(1 for r in reads.values() if str(longest) in r and r[str(longest)]["acc"] >= 0.8)
    return f"{len(reads)} seed{'s' if len(reads) > 1 else ''}, {passing} >= 80% at {longest:,}"


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
    return _table(header, ["---", "---:", "---", "---:", "---:", "---", "---", "---", "---"], rows)


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
    return _table(header, ["---:", "---:", "---:", "---:", "---", "---:", "---:", "---", "---", "---", "---"], rows)


def _pmcs_table(studies: dict[str, dict]) -> str:
    """Upstream's PMCS-64 comparison at preset tiny (docs/variable-rank.md section 11): per arm the
    language CE over paired seeds, the training rate, and the distance reads after the interleaved
    recipe, each beside upstream's figure for its arm."""
    study = studies["pmcs-tiny"]
    lengths, upstream = study["lengths"], study["upstream"]
    rows = []
    for arm in study["arms"]:
        lang, up = arm["language"], upstream.get(arm.get("upstream_arm") or "", {})
        values = _seed_values(lang["per_seed"])
        mean, std = mean_std(values)
        reads = {seed: r["reads"] for seed, r in (arm.get("specialised") or {}).items() if r.get("reads")}
        rows.append(
            [
                arm["arm"],
                f"{arm['params']:,}",
                f"{mean:.4f} +- {std:.4f} ({len(values)})",
                f"{lang['tokens_per_s']:,.0f}",
                "-" if not reads else f"{_mqar_cells(reads, lengths)} ({_passing(reads, lengths[-1])})",
                up.get("arm", "-"),
                "-" if "test_ce" not in up else f"{up['test_ce'][0]:.4f} +- {up['test_ce'][1]:.4f}",
                up.get("mqar", "-"),
            ]
        )
    header = [
        "arm",
        "params",
        "val CE, nats/byte (seeds)",
        "train tok/s",
        "MQAR % after the recipe, L " + " / ".join(f"{L:,}" for L in lengths) + " (seeds)",
        "upstream arm",
        "upstream test CE",
        "upstream MQAR %",
    ]
    return _table(header, ["---", "---:", "---:", "---:", "---", "---", "---:", "---"], rows)


def _curvature_cell(h: dict) -> str:
    """K(s) / K(s/2) of a small-loop holonomy, and whether the two loop sizes agree."""
    if h.get("curvature") is None:
        return "no angle"
    return f"{h['curvature']:.3g} / {h['curvature_half']:.3g}" + ("" if h.get("consistent") else " (not consistent)")


def _geometry_table(studies: dict[str, dict]) -> str:
    """The geometry instruments on trained tiny runs (docs/geometry.md section 10): per run the learned
    metric's spectrum and ranks, its agreement with the decoder's pullback metric, the small-loop
    curvatures, and whether transport and the geodesic solve gave a number."""
    runs = studies["geometry-tiny"]["runs"]
    rows = []
    for name in sorted(runs):
        r = runs[name]
        m, pb, ag, conn = r["metric"], r["pullback"], r["agreement"], r["connection"]
        transport = conn["transport"]
        geo = r["geodesics"][0]
        rows.append(
            [
                name,
                f"{r['val_ce']:.4f}",
                f"{m['eigenvalue_min']:.1e} / {m['eigenvalue_max']:.1e}",
                f"{m['numerical_rank_approx']['rank_rtol_1e-02']:g} / {m['exact_rank'][0]}",
                f"{pb['numerical_rank_approx']['rank_rtol_1e-02']:.1f}",
                f"{ag['energy_log_pearson']:+.2f}",
                f"{ag['principal_angle_largest_mean_rad']:.3f} ({ag['random_subspace_largest_angle_rad']:.3f})",
                "; ".join(_curvature_cell(h) for h in conn["holonomy"]),
                "no directions"
                if not transport
                else ("all completed" if all(t["completed"] for t in transport) else "stopped at the cap"),
                "converged" if geo["converged"] else f"not converged (residual {geo['residual']:.2f})",
                f"{geo['path_action'] / geo['action_upper_bound']:.1e}",
            ]
        )
    header = [
        "run",
        "val CE",
        "G eigenvalues min / max",
        "rank of G at rtol 1e-2 (approx.) / exact",
        "rank of G_pb at rtol 1e-2 (approx.)",
        "energies G vs G_pb, log Pearson",
        "top-8 subspace angle (random)",
        "curvature K(s) / K(s/2), block starts 0; 1",
        "transport of the directions",
        "geodesic, block 0",
        "path action / best action found",
    ]
    return _table(header, ["---"] + ["---:"] * 6 + ["---", "---", "---", "---:"], rows)


def _protocol_table(studies: dict[str, dict], name: str = "protocol-tiny") -> str:
    """The protocol at one preset, each model at its swept rate: bits per byte (mean +- population std over
    seeds, per seed), the whole-stream rescoring at the 1M and 2M milestones, tokens/s; a study still
    running shows its finished models and a row naming the rest, one not yet collected a row saying so."""
    header = ["model", "params", "lr (swept)", "bits/byte", "seeds 1 / 2 / 3", "at 1M tokens", "at 2M tokens", "tok/s"]
    align = ["---", "---:", "---:", "---", "---", "---:", "---:", "---:"]
    if name not in studies:
        return _table(header, align, [["not run yet", *["-"] * 7]])
    study = studies[name]
    rows = []
    for model, m in sorted(study["models"].items(), key=lambda kv: mean_std(_seed_values(kv[1]["per_seed"]))[0]):
        done, wanted = seeds_done(study, model)
        if done < wanted:  # its paired seeds so far, no mean
            cells = [f"{v / LN2:.4f}" for v in _seed_values(m["per_seed"])] + ["-"] * (wanted - done)
            rows.append([model, f"{m['params']:,}", _sci(m["lr"]), f"{done} of {wanted} seeds", " / ".join(cells)])
            rows[-1] += ["-"] * 3
            continue
        runs = sorted((r for r in study["runs"] if r["model"] == model), key=lambda r: r["seed"])
        marks = sorted({tokens for r in runs for tokens, _, _ in r["milestones"]})
        at = [mean_std([next(b for t, _, b in r["milestones"] if t == mark) for r in runs])[0] for mark in marks]
        speed = mean_std([r["tokens_per_s"] for r in runs])[0]
        rows.append(
            [model, f"{m['params']:,}", _sci(m["lr"]), *_bpb_cells(m), *(f"{v:.4f}" for v in at), f"{speed:,.0f}"]
        )
    waiting = [model for model in study["study"]["models"] if model not in study["models"]]
    if waiting:
        rows.append([f"still training: {', '.join(waiting)}", *["-"] * 7])
    return _table(header, align, rows)


def _precision_table(studies: dict[str, dict], fast: str = "protocol-small", plain: str = "protocol-small-fp32") -> str:
    """The float32 check beside a protocol run with ``--fast`` (docs/results-in-full.md section 6, "The float32 check"): per model of the float32
    record, both runs at the seeds they share (seed 1), the same rate, their bits per byte, the difference
    (``--fast`` less float32; negative: ``--fast`` lower) and each run's own tokens/s."""
    header = [
        "model",
        "lr",
        "seed",
        "--fast bits/byte",
        "float32 bits/byte",
        "--fast - float32",
        "tok/s --fast / float32",
    ]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:"]
    if plain not in studies:
        return _table(header, align, [["not run yet", *["-"] * 6]])
    rows = []
    for model in studies[plain]["study"]["models"]:
        for seed in studies[plain]["study"]["seeds"]:
            runs = [
                next((r for r in studies[name]["runs"] if r["model"] == model and r["seed"] == seed), None)
                for name in (fast, plain)
            ]
            if None in runs:
                rows.append([model, "-", str(seed), *["-"] * 4])
                continue
            lrs = {studies[name]["models"][model]["lr"] for name in (fast, plain)}
            if len(lrs) != 1:
                raise ValueError(f"{plain}: {model} ran at another rate than in {fast} ({sorted(lrs)})")
            (a, b), (sa, sb) = [r["val_bpb"] for r in runs], [r["tokens_per_s"] for r in runs]
            rows.append(
                [model, _sci(lrs.pop()), str(seed), f"{a:.4f}", f"{b:.4f}", f"{a - b:+.4f}", f"{sa:,.0f} / {sb:,.0f}"]
            )
    return _table(header, align, rows)


def _protocol_sweep_table(studies: dict[str, dict], name: str = "protocol-tiny") -> str:
    """The learning-rate sweep of a protocol study (docs/drm.md section A.7.1): tuning CE per model and
    rate, the chosen rate (:func:`drmlab.experiments.lr_sweep.choose`) in bold, edge flagged; a model whose
    sweep has not finished shows "-" at the rates it has not tried."""
    from drmlab.experiments.lr_sweep import choose

    if name not in studies:
        return _table(["model", "lr", "best"], ["---", "---:", "---"], [["not run yet", "-", "-"]])
    study = studies[name]
    grid = study["study"]["lr_grid"]
    rows = []
    for model, sweep in study["lr_sweep"].items():
        scores = {float(k): v for k, v in sweep["scores"].items()}
        best = choose(scores)
        cells = [
            ("**%.4f**" if lr == best["lr"] else "%.4f") % scores[lr]
            if scores.get(lr) is not None
            else ("diverged" if lr in best["diverged"] else "-")
            for lr in grid
        ]
        verdict = "-" if best["lr"] is None else _sci(best["lr"]) + (" (edge of the grid)" if best["edge"] else "")
        rows.append([model, *cells, verdict])
    return _table(["model", *(f"lr {_sci(lr)}" for lr in grid), "best"], ["---"] + ["---:"] * len(grid) + ["---"], rows)


def full_budget_sweeps(check: dict) -> dict[str, dict]:
    """Every model's sweep over the parts of the full-budget check (``lr_sweep`` of each part)."""
    return {model: sweep for part in check["parts"].values() for model, sweep in (part.get("lr_sweep") or {}).items()}


def full_budget_paired(check: dict) -> dict[str, dict]:
    """Every model's paired runs over the parts of the full-budget check (``models`` of each part)."""
    return {model: m for part in check["parts"].values() for model, m in part["models"].items()}


def _full_budget_sweep_table(studies: dict[str, dict]) -> str:
    """The protocol's rate choices checked at the full budget: per model the two rates tried again
    for 5,005,312 tokens (seed 1, the same held-out slice), beside their scores after 1M tokens in
    the protocol's own sweep; each budget's best rate in bold."""
    short = studies["protocol-tiny"]["lr_sweep"]
    check = studies["protocol-tiny-fullbudget"]
    sweeps = full_budget_sweeps(check)

    def cell(value: float | None, best: bool) -> str:
        return "-" if value is None else ("**%.4f**" if best else "%.4f") % value

    rows = []
    for model, sweep in sorted(sweeps.items(), key=lambda kv: list(short).index(kv[0])):
        full = {float(k): v for k, v in sweep["scores"].items()}
        early = {float(k): v for k, v in short[model]["scores"].items() if v is not None}
        best_full, best_early = min(full, key=full.get), min(early, key=early.get)
        for lr in sorted(full):
            rows.append([model, _sci(lr), cell(early.get(lr), lr == best_early), cell(full[lr], lr == best_full)])
    tokens = check["protocol"]["tokens"]
    return _table(
        ["model", "lr", "tuning CE after 1M tokens", f"after {tokens:,} tokens"], ["---", "---:", "---:", "---:"], rows
    )


def _full_budget_paired_table(studies: dict[str, dict]) -> str:
    """Paired runs (3 seeds, the protocol's budget and batches) of the models whose full-budget choice
    differs from the protocol's: bits per byte at each rate, and the gate against the protocol's
    other models at their own rates."""
    protocol = studies["protocol-tiny"]["models"]
    paired = full_budget_paired(studies["protocol-tiny-fullbudget"])
    rows = []
    for model, run in paired.items():
        for label, m in ((f"{model} (the protocol's rate)", protocol[model]), (f"{model} (full-budget choice)", run)):
            rows.append([label, _sci(m["lr"]), *_bpb_cells(m)])
    return _table(["model", "lr", "bits/byte", "seeds 1 / 2 / 3"], ["---", "---:", "---", "---"], rows)


def _headline_table(studies: dict[str, dict]) -> str:
    """The README's one results table: the protocol at tiny (each model at its swept rate, 5M tokens), bits per
    byte over its seeds and training tokens/s, best first, and beside it the same protocol at small where
    protocol-small is committed (a model still training there says so; one not in it, "-"); the header names
    each study's recipe."""
    from drmlab.experiments.ablate.recipe_verdicts import recipe_of

    study = studies["protocol-tiny"]
    small = studies.get("protocol-small")
    rows = []
    for model, m in sorted(study["models"].items(), key=lambda kv: mean_std(_seed_values(kv[1]["per_seed"]))[0]):
        speed = mean_std([r["tokens_per_s"] for r in study["runs"] if r["model"] == model])[0]
        row = [model, f"{m['params']:,}", _sci(m["lr"]), _bpb_cells(m)[0], f"{speed:,.0f}"]
        if small is not None:
            s = small["models"].get(model)
            done, wanted = seeds_done(small, model)
            if s is not None and done == wanted:
                row += [f"{s['params']:,}", _sci(s["lr"]), _bpb_cells(s)[0]]
            elif model in small["study"]["models"]:
                row += [f"training ({done} of {wanted} seeds)", "-", "-"]
            else:
                row += ["-"] * 3
        rows.append(row)
    n = len(study["study"]["seeds"])
    recipe = recipe_of(study)
    header = ["model", "params", f"lr (swept, {recipe} recipe)", f"val bits/byte, {n} seeds", "train tok/s (1 thread)"]
    if small is not None:
        header += [
            "small: params",
            f"small: lr ({recipe_of(small)} recipe)",
            f"small: val bits/byte, {len(small['study']['seeds'])} seeds",
        ]
    return _table(header, ["---", "---:", "---:", "---", "---:"] + ["---:", "---:", "---"][: len(header) - 5], rows)


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
    return _table(
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
        return _table(header, align, [["not run yet", *["-"] * 3]])
    first, second = studies[reference], studies[field]
    rows = []
    for r in side_by_side(first, second):
        cells = [_verdict_cell(r["at"][recipe_of(record)], r["a"], r["b"]) for record in (first, second)]
        rows.append([f"{r['a']} vs {r['b']}", *cells, r["across"]])
    if not rows:
        rows.append(["no pair is finished under both recipes yet", *["-"] * 3])
    return _table(header, align, rows)


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
        return _table(["arm", "scores"], ["---", "---"], [["not run yet", "-"]])
    record = studies[name]
    arms = record["arms"]
    cells = [(model, rate) for model, scores in next(iter(arms.values()))["scores"].items() for rate in scores]
    header = ["recipe", *(f"{model} at {_sci(float(rate))}" for model, rate in cells)]
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
    return _table(header, ["---"] + ["---:"] * len(cells), rows)


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
        return _table(header, align, [[f"not run yet: {', '.join(missing)}", *["-"] * 4]])
    rows = []
    for r in window_readings(*(studies[name] for name in WINDOW_STUDIES)):
        cells = [_verdict_cell(r[k], r["a"], r["b"]) for k in ("short", "long", "larger")]
        rows.append([f"{r['a']} vs {r['b']}", *cells, WINDOW_READINGS[r["reading"]]])
    if not rows:
        rows.append(["no pair is finished in all three records yet", *["-"] * 4])
    return _table(header, align, rows)


BLOCK_RENDERERS = {
    "headline": _headline_table,
    "protocol-tiny": _protocol_table,
    "protocol-tiny-sweep": _protocol_sweep_table,
    "protocol-small": functools.partial(_protocol_table, name="protocol-small"),
    "protocol-small-sweep": functools.partial(_protocol_sweep_table, name="protocol-small"),
    "protocol-small-fp32": _precision_table,
    "protocol-micro": functools.partial(_protocol_table, name="protocol-micro"),
    "protocol-micro-sweep": functools.partial(_protocol_sweep_table, name="protocol-micro"),
    "protocol-micro-ctx256": functools.partial(_protocol_table, name="protocol-micro-ctx256"),
    "protocol-micro-ctx256-sweep": functools.partial(_protocol_sweep_table, name="protocol-micro-ctx256"),
    "protocol-window": _window_table,
    "protocol-scales": _scales_table,
    "protocol-tiny-fullbudget": _full_budget_sweep_table,
    "protocol-tiny-field-sweep": functools.partial(_protocol_sweep_table, name="protocol-tiny-field"),
    "protocol-tiny-field": functools.partial(_protocol_table, name="protocol-tiny-field"),
    "recipe-parts-tiny": _recipe_parts_table,
    "protocol-recipes": _recipes_table,
    "protocol-tiny-fullbudget-paired": _full_budget_paired_table,
    "distance-tiny": _distance_table,
    "ablate-tiny-drm": _ablate_drm_table,
    "loop-study-tiny": _loop_study_table,
    "compare-tiny": _cross_family_table,
    "bench-models": _bench_models_table,
    "bench-reference": _bench_reference_table,
    "bench-fast-memory": functools.partial(_bench_reference_table, name="bench-fast-memory"),
    "bench-fast-memory-amd": functools.partial(_bench_reference_table, name="bench-fast-memory-amd"),
    "bench-decode": _bench_decode_table,
    "bench-solvers": _bench_solvers_table,
    "zoology-cpu": _zoology_table,
    "zoology-l64": functools.partial(_zoology_table, name="zoology-l64"),
    "zoology-budget": _zoology_budget_table,
    "pmcs-tiny": _pmcs_table,
    "asm-cm-controls": _asm_cm_controls_table,
    "asm-cm-capacity": _asm_cm_capacity_table,
    "geometry-tiny": _geometry_table,
}
