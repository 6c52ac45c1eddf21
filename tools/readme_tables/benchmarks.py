"""The benchmark tables: training tokens/s per preset (``bench-models``), against the upstream reference
implementation (``bench-reference`` and its fast-memory runs), decoding time per token against context
(``bench-decode``) and the block solvers' iterations against speed and accuracy (``bench-solvers``).
"""

from __future__ import annotations

from .format import markdown_table, two_places_below_ten


def _bench_models_table(studies: dict[str, dict]) -> str:
    rows = []
    for p in studies["bench-models"]["presets"]:
        t = p["tokens_per_s"]
        cells = ["-" if t[m] is None else f"{t[m]:,}" for m in ("J", "J_NO_DIRECTION", "SSM_CONTROL")]
        rows.append([p["label"], *cells, f"{t['J'] / t['SSM_CONTROL']:.2f}"])
    return markdown_table(
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
        for side in ("plain", "compiled", "fast", "fast_memory")
        if all(side in v["cpu_tokens_per_s"] for p in presets for v in p["variants"].values())
    ]
    titles = {
        "plain": "fused off / reference",
        "compiled": "compiled (float32) / reference",
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
    return markdown_table(
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
            [m["label"], *(two_places_below_ten(x) for x in ms), two_places_below_ten(ms[-1] / ms[0]), m["state"]]
        )
    return markdown_table(header, ["---"] + ["---:"] * (len(header) - 1), rows)


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
    return markdown_table(
        ["step mode", "block solver", "iters", "x velocity", "max distance to rollout"],
        ["---", "---", "---:", "---:", "---:"],
        rows,
    )


def _bench_procs_table(studies: dict[str, dict]) -> str:
    """One row per model and preset: steady training tokens/s of one process at one thread, one at N threads
    and N one-thread processes (``drmlab train --procs N``), each with its ratio to one thread."""
    study = studies["bench-procs"]
    n = study["procs"]
    header = ["model", "preset", "1 thread", f"{n} threads", f"{n} processes (--procs {n})"]
    rows = []
    for r in study["results"]:
        rates, ratio = r["tokens_per_s"], r["vs_one_thread"]
        one, threads, procs = (rates[k] for k in ("one thread", f"{n} threads", f"{n} processes"))
        rows.append(
            [
                r["model"],
                r["preset"],
                f"{one:,.0f}",
                f"{threads:,.0f} ({ratio[f'{n} threads']:.2f}x)",
                f"**{procs:,.0f} ({ratio[f'{n} processes']:.2f}x)**",
            ]
        )
    return markdown_table(header, ["---", "---", "---:", "---:", "---:"], rows)


def _bench_compile_table(studies: dict[str, dict]) -> str:
    """One row per model: compiled over eager training tokens/s and the compile's seconds (cold, warm) in
    float32 and under bf16 autocast, the figures ``--compile auto`` starts from on a CPU."""
    study = studies["bench-compile"]
    f32, bf16 = study["float32"]["models"], study["bf16"]["models"]
    rows = []
    for model in f32:
        cells = [model]
        for side in (f32[model], bf16[model]):
            cells += [
                f"{side['ratio']:.2f}x",
                f"{side['compile_seconds_cold']:.0f} / {side['compile_seconds_warm']:.1f}",
            ]
        rows.append(cells)
    header = ["model", "float32: compiled / eager", "compile s (cold / warm)", "bf16: compiled / eager", "compile s"]
    return markdown_table(header, ["---", "---:", "---:", "---:", "---:"], rows)


def _bench_compile_runs_table(studies: dict[str, dict]) -> str:
    """Whole ``drmlab train`` runs eager and compiled (cold and warm cache): wall seconds, the saving, and what
    auto's arithmetic predicted from the run's own compile row."""
    rows = []
    for precision, record in studies["bench-compile"]["whole_runs"].items():
        runs = record["runs"]
        for name in ("eager", "compiled_cold", "compiled_warm"):
            r = runs[name]
            saved = "" if name == "eager" else f"{r['saved_seconds']:+.1f}"
            predicted = r.get("predicted_net_saving_seconds")
            rows.append(
                [
                    f"{record['model']} {precision}",
                    name.replace("_", ", "),
                    f"{r['wall_seconds']:.1f}",
                    f"{r['tokens_per_s']:,.0f}",
                    saved,
                    "" if predicted is None else f"{predicted:+.1f}",
                ]
            )
    header = ["run", "compile", "whole run s", "tok/s", "saved s", "predicted s"]
    return markdown_table(header, ["---", "---", "---:", "---:", "---:", "---:"], rows)
