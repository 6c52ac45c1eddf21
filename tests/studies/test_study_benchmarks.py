"""The benchmark figures of docs/results.md and docs/results-in-full.md and the README's first training run
(docs/studies/bench-*, first-train-run): each figure the text quotes, computed from the committed measurements
and found in the text."""

from pathlib import Path

from study_results import fmt, load, stated, study_text

said = stated(
    "bench-linear-scan",
    "bench-models",
    "bench-reference",
    "bench-fast-memory",
    "bench-decode",
    "bench-resolvent",
    "bench-solvers",
    "bench-fast-weight",
    "bench-mamba",
    "bench-selective-scan",
    "bench-sharing",
)


def test_the_first_run_takes_about_a_minute():
    run, said_first = load("first-train-run"), stated("first-train-run")
    assert f"{round(run['wall_seconds'], -1):.0f}" == said_first("70")
    assert (f"{run['train_seconds']:.0f}", f"{run['eval_seconds']:.0f}") == (said_first("36"), said_first("27"))
    assert f"{run['val_targets']:,}" == said_first("1,027,413") and run["python"] == said_first("3.11.7")


def test_linear_scan_ratios():
    scan = load("bench-linear-scan")
    ms, ops = scan["fwd_bwd_ms"], scan["ops_fwd_bwd"]
    x = {k: v / ms["addcmul"] for k, v in ms.items()}
    assert [fmt(x[k], 2) for k in ("c_kernel", "torch_log_depth", "time_loop_old")] == [
        said("0.91"),
        said("1.74"),
        said("1.98"),
    ]
    assert f"{x['naive_autograd_loop']:.0f}" == said("364")
    assert fmt(ms["c_kernel"] / scan["fwd_bwd_floor_ms"], 2) == said("2.34") and scan["copy_bandwidth_GBs"] == float(
        said("10.5")
    )
    growth = {k: v["T4096"] / v["T256"] for k, v in ops.items()}
    assert (fmt(growth["torch_log_depth"], 2), fmt(growth["time_loop_old"], 1)) == (said("1.47"), said("15.5"))


def test_resolvent_operator_ratios():
    res = load("bench-resolvent")
    assert res["operator_ratio_to_sdpa"] == {
        "softmax_corner": said("1.00"),
        "phase_free_blockwise": said("1.2-1.6"),
        "phased": said("2.0"),
        "path_product_scan": said("0.19"),
        "dense": said("15.8"),
    }
    assert res["peak_memory"] == {"phase_free_blockwise": said("135 MB"), "dense": said("1.1 GB")}
    assert res["lm_tokens_per_s_ratio_to_softmax_twin"] == said("0.84")


def test_mamba_fused_kernel_and_the_ceiling():
    mamba = load("bench-mamba")
    tps, early = mamba["tokens_per_s"], mamba["earlier_run"]
    assert (tps["fused_kernel"], tps["chunked_linear_scan"], tps["zero_cost_scan"]) == (
        int(said("600")),
        int(said("381")),
        int(said("848")),
    )
    assert fmt(tps["fused_kernel"] / tps["chunked_linear_scan"], 2) == said("1.57")
    assert (early["x_hf_default"], early["x_hf_pscan"]) == (int(said("73")), [4, 5]) and said("4-5x")
    # the ceiling: even a free scan would not reach the target over pscan
    ceiling = tps["zero_cost_scan"] / tps["chunked_linear_scan"] * max(early["x_hf_pscan"])
    assert ceiling < mamba["target_over_pscan"] == 20


def test_the_selective_scan_kernel():
    sel = load("bench-selective-scan")
    fwd, both, saved = sel["forward_ms"], sel["forward_backward_ms"], sel["saved_mb"]
    assert fmt(fwd["fused_kernel"] / fwd["chunked_linear_scan"], 2) == said("0.17")
    assert fmt(both["fused_kernel"] / both["chunked_linear_scan"], 2) == said("0.15")
    assert (f"{saved['fused_kernel']:.0f} MB", f"{saved['chunked_linear_scan']:.0f} MB") == (
        said("32 MB"),
        said("659 MB"),
    )
    assert sel["max_abs_error"] < 1e-5  # float32 round-off of the float64 loop


def test_the_fast_weight_memory_is_within_its_cost_target():
    s = load("bench-fast-weight")
    step, op = s["step_ms"], s["delta_rule_ms"]
    cpu = step["ASM_CM"]["cpu"] / step["J_NO_DIRECTION"]["cpu"]
    wall = step["ASM_CM"]["wall"] / step["J_NO_DIRECTION"]["wall"]
    assert cpu <= 1.5 and (fmt(cpu, 2), fmt(wall, 2)) == (said("1.31"), said("1.34"))
    assert fmt(op["sequential"] / op["chunked"], 1) == said("10.1")


def test_against_the_reference_only_the_drm_variants_are_clearly_faster():
    ratio = {}
    for p in load("bench-reference")["presets"]:
        for name, v in p["variants"].items():
            cpu = v["cpu_tokens_per_s"]
            ratio[p["preset"], name] = cpu["ours"] / cpu["ref"]
            assert v["f64_gap"] <= 1e-9  # both computed the same function before they were timed
    drm = [ratio[p, m] for p in ("tiny", "small") for m in ("J", "J_NO_DIRECTION")]
    controls = [ratio[p, m] for p in ("tiny", "small") for m in ("SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED")]
    assert (fmt(min(drm), 2), fmt(max(drm), 2)) == (said("1.69"), said("2.02"))
    assert (fmt(min(controls), 2), fmt(max(controls), 2)) == (said("1.15"), said("1.41"))
    assert max(ratio[p, "SSM_CONTROL"] for p in ("tiny", "small")) < 1.5  # the controls' 1.5x target: not met
    assert ratio["small", "J"] >= 2.0 and min(drm) < 2.0  # the DRM variants' 2.0x: met by J at small only


def test_the_fast_setting_against_the_reference_and_the_factors_the_trainer_quotes():
    from drmlab.training.fast import FAST_FACTORS

    fast, fused = {}, {}
    for p in load("bench-reference")["presets"]:
        for name, v in p["variants"].items():
            cpu = v["cpu_tokens_per_s"]
            fast[p["preset"], name] = cpu["fast"] / cpu["ref"]
            fused[p["preset"], name] = cpu["ours"] / cpu["plain"]
            if p["preset"] == "tiny" and name == "J_NO_DIRECTION":  # not in bench-fast-memory: this record's
                assert FAST_FACTORS[name] == round(cpu["fast"] / cpu["ours"], 2)
    assert (fmt(min(fast.values()), 2), fmt(max(fast.values()), 2)) == (said("2.06"), said("3.68"))
    assert fmt(fused["tiny", "J"], 2) == said("1.14")
    # the 2.5x target of --fast: met by J and J_NO_DIRECTION at both presets, not by the controls
    assert min(fast[p, m] for p in ("tiny", "small") for m in ("J", "J_NO_DIRECTION")) >= 2.5
    assert max(fast[p, m] for p in ("tiny", "small") for m in ("SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED")) < 2.5
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for p in load("bench-reference")["presets"]:  # the README's --fast paragraph: --fast over the float32 default
        gain = [v["cpu_tokens_per_s"]["fast"] / v["cpu_tokens_per_s"]["ours"] for v in p["variants"].values()]
        said_range = f"{fmt(min(gain), 2)}x to {fmt(max(gain), 2)}x"
        phrase = {
            "tiny": f"{said_range} faster than the float32 default at tiny",
            "small": f"and {said_range} at small",
        }
        assert phrase[p["preset"]] in readme


def test_the_controls_memory_in_bf16_against_the_fast_setting_as_it_is():
    ratio = {}
    for p in load("bench-fast-memory")["presets"]:
        for name, v in p["variants"].items():
            cpu = v["cpu_tokens_per_s"]
            ratio[p["preset"], name] = (cpu["fast"] / cpu["ref"], cpu["fast_memory"] / cpu["ref"])
            assert v["f64_gap"] <= 1e-9
    quoted = {
        ("tiny", "SSM_CONTROL"): ("2.03", "2.75"),
        ("small", "SSM_CONTROL"): ("2.08", "3.31"),
        ("tiny", "J_DIRECT_CONTROL_MATCHED"): ("2.08", "2.44"),
        ("small", "J_DIRECT_CONTROL_MATCHED"): ("2.37", "3.06"),
    }
    from drmlab.training.fast import FAST_FACTORS

    gain = {}
    for p in load("bench-fast-memory")["presets"]:  # today's --fast puts the memory's products in bf16
        for name, v in p["variants"].items():
            cpu = v["cpu_tokens_per_s"]
            gain[p["preset"], name] = fmt(cpu["fast_memory"] / cpu["ours"], 2)
            if p["preset"] == "tiny":  # the factor a long default run is told --fast would bring
                assert FAST_FACTORS[name] == round(cpu["fast_memory"] / cpu["ours"], 2)
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    both = {name: f"{gain['tiny', name]}x and {gain['small', name]}x" for _, name in gain}
    assert f"SSM_CONTROL trained {both['SSM_CONTROL']} faster" in readme  # the README's --fast paragraph
    assert f"J_DIRECT_CONTROL_MATCHED {both['J_DIRECT_CONTROL_MATCHED']} (J {both['J']})" in readme
    for key, (before, after) in quoted.items():
        assert (fmt(ratio[key][0], 2), fmt(ratio[key][1], 2)) == (said(before), said(after))
        assert ratio[key][1] > 1.15 * ratio[key][0]  # the controls gain
    assert all(abs(after / before - 1) < 0.05 for (_, m), (before, after) in ratio.items() if m == "J")  # J barely
    # the same-run float32 ratio of J at small: the 2.0x target is met in one record and not in this one
    j_small = load("bench-fast-memory")["presets"][1]["variants"]["J"]["cpu_tokens_per_s"]
    assert fmt(j_small["ours"] / j_small["ref"], 2) == said("1.92")


def test_runs_sharing_the_machine_keep_the_quoted_fractions_of_solo():
    """Threads on a busy CPU: two default runs each keep >= 0.40 of solo (benchmarks/bench_sharing.py's target)."""
    results = load("bench-sharing")["results"]
    pair = lambda name: [f"{p['fraction_of_solo']:.2f}" for p in results[name]["pair"]]
    assert pair("default") == [said("0.82"), said("0.85")] and pair("before") == [said("0.23"), said("0.14")]
    assert all(p["fraction_of_solo"] >= 0.40 for p in results["default"]["pair"])
    solo = {name: f"{results[name]['solo']['tokens_per_s']:,.0f}" for name in ("default", "before")}
    assert solo == {"default": said("25,415"), "before": said("32,273")}


def test_the_backend_self_check_costs_under_a_hundredth_of_a_training_step():
    """docs/architecture.md "First-use self-check": what the check costs a process, once."""
    s = load("bench-self-check")
    checks = s["checks"]
    assert all(c["max_error"] <= c["tolerance"] for c in checks.values())  # every kernel here passed
    cold = sorted(c["cold_ms"]["cpu"] for c in checks.values())
    warm = sorted(c["warm_ms"]["cpu"] for c in checks.values())
    assert (fmt(cold[0], 1), fmt(cold[-1], 1)) == ("2.1", "4.3") and (fmt(warm[0], 1), fmt(warm[-1], 1)) == (
        "0.7",
        "2.3",
    )
    t = s["training"]
    assert t["J"]["checks"] == ["linear_scan/c/float32"] and t["MAMBA"]["checks"] == ["selective_scan/c/float32"]
    assert [fmt(t[m]["check_ms"]["cpu"], 1) for m in ("J", "MAMBA")] == ["2.8", "4.4"]
    assert [f"{t[m]['step_ms']['cpu']:,.0f}" for m in ("J", "MAMBA")] == ["370", "1,527"]
    ratio = [t[m]["check_ms"]["cpu"] / t[m]["step_ms"]["cpu"] for m in ("J", "MAMBA")]
    assert [fmt(r, 4) for r in ratio] == ["0.0075", "0.0029"] and max(ratio) < 0.01
    d = s["decode"]
    assert (
        fmt(d["check_ms_cold"]["cpu"], 1) == "1.5"
        and fmt(d["check_ms_cold"]["cpu"] / d["fused_step_ms"]["cpu"], 1) == "5.2"
    )


def test_today_s_fast_on_an_amd_cpu_without_amx():
    """docs/studies/bench-fast-memory-amd: today's --fast over the float32 default per variant at tiny, as the
    README and docs/results-in-full.md quote it, within 0.3 of the Xeon's factors the trainer quotes."""
    from drmlab.training.fast import FAST_FACTORS

    record = load("bench-fast-memory-amd")
    assert "AMD EPYC" in record["provenance"]["machine"] and "no AMX" in record["provenance"]["machine"]
    (tiny,) = record["presets"]
    gain = {
        name: v["cpu_tokens_per_s"]["fast_memory"] / v["cpu_tokens_per_s"]["ours"]
        for name, v in tiny["variants"].items()
    }
    assert set(gain) == set(FAST_FACTORS) and all(abs(gain[m] - FAST_FACTORS[m]) < 0.3 for m in gain)
    assert max(gain, key=lambda m: abs(gain[m] - FAST_FACTORS[m])) == "SSM_CONTROL"
    assert all(v["f64_gap"] < 1e-13 for v in tiny["variants"].values())
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    quoted = ", ".join(f"{m} {fmt(gain[m], 2)}x" for m in ("J", "J_NO_DIRECTION", "SSM_CONTROL"))
    quoted += f" and J_DIRECT_CONTROL_MATCHED {fmt(gain['J_DIRECT_CONTROL_MATCHED'], 2)}x faster"
    assert quoted in readme
    assert quoted in study_text("bench-fast-memory-amd")


def test_one_run_as_two_processes_reaches_the_target_and_the_quoted_figures():
    """Every core (docs/guide.md section 3): two one-thread processes at >= 1.7x one thread on 2 cores
    (benchmarks/bench_procs.py's target), and the README's first command as two processes against one."""
    study, said_procs = load("bench-procs"), stated("bench-procs")
    ratios = [r["vs_one_thread"]["2 processes"] for r in study["results"]]
    assert study["procs"] == 2 and min(ratios) >= 1.7
    assert (fmt(min(ratios), 2), fmt(max(ratios), 2)) == (said_procs("1.75"), said_procs("2.18"))
    faster = [r["vs_one_thread"]["2 processes"] > r["vs_one_thread"]["2 threads"] for r in study["results"]]
    assert sum(faster) == 7 and len(faster) == 8  # "faster ... in seven of the eight cases"
    first = study["first_command"]
    assert [fmt(first["auto"][k], 1) for k in ("wall_seconds", "train_seconds", "eval_seconds")] == [
        said_procs("54.8"),
        said_procs("26.0"),
        said_procs("19.3"),
    ]
    assert [fmt(first["procs_1"][k], 1) for k in ("wall_seconds", "train_seconds", "eval_seconds")] == [
        said_procs("72.8"),
        said_procs("41.1"),
        said_procs("26.1"),
    ]
    assert f"{abs(first['auto']['val_ce'] - first['procs_1']['val_ce']):.1e}".replace("e-0", "e-") == said_procs(
        "3.5e-7"
    )


def test_compile_auto_starts_from_the_benchmarks_figures_and_the_text_quotes_them():
    """drmlab.training.compile_choice.MEASURED is docs/studies/bench-compile's float32 and bf16 figures (ratio to
    two places, cold compile seconds to the second); the whole runs' savings quoted are the record's."""
    from drmlab.training.compile_choice import MEASURED

    study, said_compile = load("bench-compile"), stated("bench-compile")
    table = {}
    for precision in ("float32", "bf16"):
        for model, r in study[precision]["models"].items():
            table[model, precision] = (round(r["ratio"], 2), float(round(r["compile_seconds_cold"])))
    assert MEASURED == table
    sides = [r for precision in ("float32", "bf16") for r in study[precision]["models"].values()]
    cold, warm = [r["compile_seconds_cold"] for r in sides], [r["compile_seconds_warm"] for r in sides]
    said_compile(f"{min(cold):.0f} s to {max(cold):.0f} s from a cold cache and {min(warm):.1f} s to {max(warm):.0f} s")
    for model, precision in (("J", "bf16"), ("SSM_CONTROL", "bf16"), ("J", "float32"), ("SSM_CONTROL", "float32")):
        said_compile(f"{study[precision]['models'][model]['ratio']:.2f}x")
    for record in study["whole_runs"].values():
        runs = record["runs"]
        for name in ("compiled_cold", "compiled_warm"):
            said_compile(f"{runs[name]['saved_seconds']:+.1f}")


def test_the_reference_ratios_again_on_this_code_and_the_targets_they_miss():
    """docs/studies/bench-reference-amd: ours, compiled float32 and --fast against the reference (CPU time),
    each figure the text quotes; float32 misses the 2.0x and 1.5x targets eager and compiled, --fast meets both."""
    study, said_amd = load("bench-reference-amd"), stated("bench-reference-amd")
    (tiny,) = study["presets"]
    order = ("J", "J_NO_DIRECTION", "SSM_CONTROL", "J_DIRECT_CONTROL_MATCHED")
    target = {"J": 2.0, "J_NO_DIRECTION": 2.0, "SSM_CONTROL": 1.5, "J_DIRECT_CONTROL_MATCHED": 1.5}
    for side in ("ours", "compiled", "fast_memory"):
        for name in order:
            cpu = tiny["variants"][name]["cpu_tokens_per_s"]
            ratio = cpu[side] / cpu["ref"]
            said_amd(f"{ratio:.2f}x" if name == "J" else f"{ratio:.2f}")
            assert (ratio >= target[name]) == (side == "fast_memory"), (side, name, ratio)
