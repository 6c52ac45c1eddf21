"""ASM_CM's capacity against pairs and width (docs/studies/asm-cm-capacity): what
docs/results.md and docs/results-in-full.md say of it."""

from study_results import fmt, load, stated

CAPACITY = load("asm-cm-capacity")
CONTROLS = load("asm-cm-controls")
ROWS = {(r["pairs"], r["fast_weight_dim"]): r for r in CAPACITY["rows"]}
said = stated("asm-cm-capacity")
LONGEST = "32768"


def pct(x: float) -> str:
    return fmt(100 * x, 1)


def at(row: dict, length: str, key: str = "acc") -> list[float]:
    return [row["runs"][s]["reads"][length][key] for s in sorted(row["runs"], key=int)]


def test_the_study_is_complete_with_three_seeds_per_cell():
    assert CAPACITY["pending"] == [] and set(ROWS) == {(p, d) for p in (8, 16, 32) for d in (64, 32)}
    assert all(r["complete"] and sorted(r["runs"]) == ["0", "1", "2"] for r in ROWS.values())
    assert {r["state_bytes"] for r in ROWS.values() if r["fast_weight_dim"] == 32} == {23_044}
    assert {r["state_bytes"] for r in ROWS.values() if r["fast_weight_dim"] == 64} == {47_620}
    said("23,044") and said("47,620")


def test_every_run_recalls_at_32768_tokens_and_every_control_falls():
    accs = [a for r in ROWS.values() for a in at(r, LONGEST)]
    assert len(accs) == 18 and min(accs) >= 0.8 and said("18")
    assert pct(min(accs)) == said("84.1") and min(at(ROWS[(32, 64)], LONGEST)) == at(ROWS[(32, 64)], LONGEST)[1]
    for row in ROWS.values():
        for run in row["runs"].values():
            assert all(c["verdict"] == "falls" for c in run["controls"].values())
    off = [row["mean"]["controls"][c]["4096"] for row in ROWS.values() for c in ("memory_read_off", "memory_write_off")]
    shuffled = [row["mean"]["controls"]["keys_shuffled"]["4096"] for row in ROWS.values()]
    assert (pct(min(off)), pct(max(off))) == ("1.3", "1.7") and said("1.3-1.7%")
    assert (pct(min(shuffled)), pct(max(shuffled))) == ("1.4", "1.8") and said("1.4-1.8%")
    bound = [r["controls"]["keys_shuffled"]["4096"]["bound_acc"] for row in ROWS.values() for r in row["runs"].values()]
    assert (pct(min(bound)), pct(max(bound))) == ("94.4", "100.0") and said("94.4-100%")


def test_more_pairs_cost_recall_only_at_the_longest_length():
    middle = [row["mean"]["reads"][L]["acc"] for row in ROWS.values() for L in ("512", "4096")]
    assert pct(min(middle)) == said("97.9")
    wide = [ROWS[(p, 64)]["mean"]["reads"][LONGEST]["acc"] for p in (8, 16, 32)]
    narrow = [ROWS[(p, 32)]["mean"]["reads"][LONGEST]["acc"] for p in (8, 16, 32)]
    assert wide == sorted(wide, reverse=True) and [pct(x) for x in wide] == [said("99.4"), said("92.4"), said("88.1")]
    assert [pct(x) for x in narrow] == [said("97.2"), said("93.5"), said("94.2")]


def test_half_the_width_reads_as_well_from_16_pairs_and_worse_at_8_on_every_seed():
    for pairs in (16, 32):
        assert ROWS[(pairs, 32)]["mean"]["reads"][LONGEST]["acc"] >= ROWS[(pairs, 64)]["mean"]["reads"][LONGEST]["acc"]
    wide, narrow = at(ROWS[(8, 64)], LONGEST), at(ROWS[(8, 32)], LONGEST)
    assert all(w > n for w, n in zip(wide, narrow))
    for x in wide + narrow + at(ROWS[(32, 32)], LONGEST):
        said(pct(x))
    # the narrow memory's control length reads worse than 512 tokens at 8 and 16 pairs
    for pairs, control in ((8, "40"), (16, "80")):
        reads = ROWS[(pairs, 32)]["mean"]["reads"]
        assert reads[control]["acc"] < reads["512"]["acc"]
        said(pct(reads[control]["acc"])) and said(pct(reads["512"]["acc"]))


def test_the_language_ce_after_the_specialisation_is_below_the_base_s_in_every_cell():
    drops = [r["mean"]["ce_before"] - r["mean"]["ce_after"] for r in ROWS.values()]
    assert 0.04 <= min(drops) and max(drops) <= 0.05 and said("0.04-0.05")


def test_the_8_pair_width_64_cell_repeats_the_x10_arm_of_the_controls_study():
    x10 = next(a for a in CONTROLS["arms"] if a["arm"] == "x10")["runs"]
    cell = ROWS[(8, 64)]["runs"]
    for seed in ("0", "1", "2"):
        assert abs(x10[seed]["ce_before"] - cell[seed]["ce_before"]) < 5e-4
        assert x10[seed]["reads"][LONGEST]["acc"] >= 0.99 and cell[seed]["reads"][LONGEST]["acc"] >= 0.98
        said(pct(x10[seed]["reads"][LONGEST]["acc"]))
    said("0.0005")


def test_the_wall_time_is_recorded_per_job():
    seconds = [run["wall_seconds"][k] for r in ROWS.values() for run in r["runs"].values() for k in run["wall_seconds"]]
    total = sum(seconds) + sum(b["wall_seconds"] for b in CAPACITY["base"].values())
    assert all(s > 0 for s in seconds) and fmt(total / 3600, 1) == said("1.9")
