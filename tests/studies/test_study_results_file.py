"""The results file every study writes (drmlab.experiments.results): downsampled curves that keep
their end points and values, a provenance record, and JSON that reads back to the same numbers."""

import json

from hypothesis import given
from hypothesis import strategies as st

from drmlab.experiments import results as R


def _rows(n: int) -> list[dict]:
    rows = [{"kind": "eval", "step": 0, "tokens": 0, "val_ce": 5.5}]
    rows += [{"kind": "train", "step": s, "tokens": 8192 * s, "loss": 1.0 / s, "lr": 1e-3} for s in range(1, n + 1)]
    rows += [{"kind": "eval", "step": n, "tokens": 8192 * n, "val_ce": 2.25}, {"kind": "milestone", "tokens": 8}]
    return rows


@given(st.integers(1, 700), st.integers(2, 80))
def test_downsampling_keeps_the_ends_and_copies_values(n, cap):
    curve = R.curves(_rows(n), max_points=cap)["train"]
    steps = curve["step"]
    assert len(steps) == min(n, cap) and steps[0] == 1 and steps[-1] == n
    assert steps == sorted(set(steps))
    assert curve["loss"] == [round(1.0 / s, R.CURVE_DECIMALS) for s in steps]  # the picked rows' own values
    assert curve["tokens"] == [8192 * s for s in steps]


def test_curves_split_training_and_evaluation_rows():
    c = R.curves(_rows(611))
    assert len(c["train"]["step"]) == R.MAX_POINTS
    assert c["eval"] == {"step": [0, 611], "tokens": [0, 8192 * 611], "val_ce": [5.5, 2.25]}


def test_provenance_names_command_commit_date_and_settings():
    p = R.provenance({"lr": 1e-3}, command="drmlab ablate --models J", commit="abc1234", date="2026-12-01")
    assert p == {
        "command": "drmlab ablate --models J",
        "commit": "abc1234",
        "date": "2026-12-01",
        "settings": {"lr": 1e-3},
    }
    assert set(R.provenance()) == {"command", "commit", "date", "settings"}
    assert R.invoked_command(["/x/bin/drmlab", "ablate", "--out", "a b"]) == "drmlab ablate --out 'a b'"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
        lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
        max_leaves=40,
    )
)
def test_dumps_reads_back_to_the_same_value(value):
    assert json.loads(R.dumps(value)) == value


def test_dumps_keeps_number_lists_on_one_line(tmp_path):
    value = {"curves": {"loss": [1.0 / (i + 1) for i in range(64)]}, "name": "J"}
    text = R.dumps(value)
    assert len(text.splitlines()) == 6 and json.loads(text) == value
    R.write(tmp_path / "results.json", value)
    assert (tmp_path / "results.json").read_text() == text and list(tmp_path.iterdir()) == [tmp_path / "results.json"]
