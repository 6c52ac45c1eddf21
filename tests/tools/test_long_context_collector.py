"""The long-context study's collector (tools/collect_long_context.py), its table (tools/readme_tables/
long_context.py) and its figure (tools/readme_figures.py): over fake eval files of one recurrent model (the
state carried) and one attention model (a learned position table of 256 rows, "n/a" past it, scored in
windows when carried), the record keeps each evaluation's numbers and none of the corpus's machine paths,
derives its three numbers as its docstring says, and the table prints them."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
LN2 = math.log(2)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


collect = _load(TOOLS / "collect_long_context.py", "drmlab_tool_collect_long_context")
readme = _load(TOOLS / "readme.py", "drmlab_readme_tool_long_context")  # puts tools/ on sys.path
long_context_table = readme.tables._long_context_table

# what drmlab eval writes about the corpus: machine paths that must stay out of the record
CORPUS = {
    "source": "stdlib",
    "stdlib_path": "/opt/python/lib/python3.11",
    "cache_dir": "/var/cache/drmlab/corpora/stdlib",
    "manifest": "/var/cache/drmlab/corpora/stdlib/manifest.json",
    "shards": {"val": "/var/cache/drmlab/corpora/stdlib/val.bin"},
}
EDGES = [(0, 1)] + [(2**k, 2 ** (k + 1)) for k in range(12)]  # [0,1), [1,2), ..., [2048,4096)


def _bucket(lo: int, hi: int, ce, tokens: int = 10) -> dict:
    if ce == "n/a":
        return {"lo": lo, "hi": hi, "tokens": 0, "ce": "n/a", "low": None, "high": None, "groups": 0, "reason": "r"}
    return {"lo": lo, "hi": hi, "tokens": tokens, "ce": ce, "low": ce - 0.1, "high": ce + 0.1, "groups": 5}


def _run_facts(model: str, params: int) -> dict:
    return {
        "model": model,
        "preset": "tiny",
        "seed": 1,
        "step": 611,
        "params": params,
        "tokens_trained": 5005312,
        "train_seq_len": 256,
        "tokenizer": "bytes",
        "data_matches_run": True,
        "data": CORPUS,
    }


def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


# per model: params, windowed CE, by-position CE per bucket (one per EDGES), carried CE
RECURRENT_CE = [2.6, 2.1, 1.9, 1.7, 1.6, 1.5, 1.45, 1.47, 1.48, 1.49, 1.5, 1.52, 1.55]
ATTENTION_CE = [2.7, 2.2, 1.95, 1.8, 1.65, 1.55, 1.5, 1.49, 1.52] + ["n/a"] * 4


def _study(tmp_path: Path) -> Path:
    """A studies/ folder with J (recurrent) and GPT2 (attention) evaluated, and no other model."""
    studies = tmp_path / "studies"
    for model, params, windowed, by_position, carried in (
        ("J", 1000, 1.51, RECURRENT_CE, 1.47),
        ("GPT2", 2000, 1.60, ATTENTION_CE, 1.58),
    ):
        run = studies / "protocol-tiny-field" / "runs" / f"{model}-seed1"
        summary = {"model": model, "params": params, "steps": 611, "tokens": 5005312, "val_ce": windowed}
        _write(run / "summary.json", {**summary, "val_bpb": windowed / LN2, "out_dir": str(run)})
        _write(run / "config.json", {"model": model, "train": {"seq_len": 256}})
        attention = model == "GPT2"
        _write(
            studies / "long-context-tiny" / model / "by-position.json",
            {
                "mode": "windows",
                "seq_len": 4096,
                "windows": 4,
                "targets": 16384 if not attention else 1024,
                "ce": 1.5,
                **({} if attention else {"bpb": 1.5 / LN2, "bytes": 16384}),  # none where targets go unscored
                "position_limit": 256 if attention else None,
                "position_limit_reason": "GPT2 has a learned position table of 256 rows" if attention else None,
                "bucket_rule": "log2 buckets",
                "band": "95% normal interval",
                "buckets": [_bucket(lo, hi, ce) for (lo, hi), ce in zip(EDGES, by_position)],
                "seconds": 12.5,
                **_run_facts(model, params),
            },
        )
        shape = {"context": "windows", "window": 256, "windows": 70} if attention else {"context": "carried"}
        note = "GPT2 has no fixed-size state: scored in windows of 256 tokens" if attention else None
        _write(
            studies / "long-context-tiny" / model / "carried.json",
            {
                **shape,
                **({} if attention else {"chunk": 8192, "lanes": 32}),
                "note": note,
                "resets": "documents",
                "segments": 3,
                "longest_segment": 9000,
                "targets": 16384,
                "ce": carried,
                "bpb": carried / LN2,
                "bucket_rule": "log2 buckets",
                "band": "95% normal interval",
                "buckets": [_bucket(0, 1, 3.0), _bucket(1, 2, 2.5, tokens=3)],
                "seconds": 99.0,
                **_run_facts(model, params),
            },
        )
    _write(studies / "protocol-tiny-field" / "results.json", {"provenance": {"commit": "abcdef123456"}})
    return studies


def _walk(value, key=None):
    """Every (key, value) pair of a nested record, with the leaves."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)


def test_the_record_keeps_each_evaluation_and_says_what_is_missing(tmp_path):
    record = collect.record(_study(tmp_path), "a CPU", "one process", commit="0123456789ab", date="2026-12-07")
    assert list(record["models"]) == ["J", "GPT2"] and record["complete"] is False
    prov = record["provenance"]
    assert (prov["machine"], prov["how"], prov["commit"], prov["date"]) == (
        "a CPU",
        "one process",
        "0123456789ab",
        "2026-12-07",
    )
    assert prov["command_recorded"] is True
    assert "--by-position --seq-len 4096" in prov["command"] and "--carry-state --by-position" in prov["command"]
    assert "runs/M-seed1" in prov["command"] and "for M in J J_NO_DIRECTION SSM_CONTROL" in prov["command"]
    runs = record["runs"]
    assert (runs["study"], runs["seed"], runs["train_seq_len"], runs["commit"]) == (
        "protocol-tiny-field",
        1,
        256,
        "abcdef123456",
    )
    assert runs["models"] == list(collect.MODELS)

    j, gpt2 = record["models"]["J"], record["models"]["GPT2"]
    assert j["params"] == 1000 and j["windowed"] == {"seq_len": 256, "ce": 1.51, "bpb": 1.51 / LN2}
    assert j["by_position"]["seq_len"] == 4096 and j["by_position"]["position_limit"] is None
    assert j["by_position"]["buckets"][0] == {"lo": 0, "hi": 1, "tokens": 10, "ce": 2.6, "low": 2.5, "high": 2.7}
    assert j["by_position"]["seconds"] == 12.5 and j["carried"]["seconds"] == 99.0
    assert j["carried"]["context"] == "carried" and (j["carried"]["chunk"], j["carried"]["lanes"]) == (8192, 32)
    assert j["carried"]["note"] is None and j["carried"]["resets"] == "documents" and j["carried"]["segments"] == 3
    assert (
        gpt2["by_position"]["position_limit"] == 256
        and "learned position table" in gpt2["by_position"]["position_limit_reason"]
    )
    assert [b["ce"] for b in gpt2["by_position"]["buckets"][-4:]] == ["n/a"] * 4
    assert gpt2["by_position"]["bpb"] is None and gpt2["by_position"]["targets"] == 1024
    assert gpt2["carried"]["context"] == "windows" and gpt2["carried"]["window"] == 256
    assert "windows of 256" in gpt2["carried"]["note"] and "chunk" not in gpt2["carried"]

    # nothing of the machine: no corpus description, no absolute path, no groups or reasons of the buckets
    keys = {k for k, _ in _walk(record)}
    assert not keys & {"data", "cache_dir", "manifest", "stdlib_path", "shards", "out_dir", "groups", "reason"}
    strings = [v for _, v in _walk(record) if isinstance(v, str)]
    assert not [s for s in strings if s.startswith("/") or re.search(r"(^|\s)/\w", s)]
    assert str(tmp_path) not in json.dumps(record)


def test_the_derived_numbers_follow_their_rules(tmp_path):
    record = collect.record(_study(tmp_path), "m", "h", commit="0123456789ab")
    j, gpt2 = (record["models"][m]["derived"] for m in ("J", "GPT2"))
    # lowest: the by-position bucket with the lowest CE -- [32, 64) for J, [64, 128) for GPT2 (n/a left out)
    assert j["lowest"] == {"lo": 32, "hi": 64, "ce": 1.45}
    assert gpt2["lowest"] == {"lo": 64, "hi": 128, "ce": 1.49}
    # past the window: CE[2048, 4096) - CE[128, 256); none where the far bucket is n/a
    assert j["past_window"] == pytest.approx(1.55 - 1.48)
    assert gpt2["past_window"] is None
    # carrying gains: windowed CE - carried CE
    assert j["carried_gain"] == pytest.approx(1.51 - 1.47)
    assert gpt2["carried_gain"] == pytest.approx(1.60 - 1.58)


def test_a_model_with_one_evaluation_so_far_is_kept_and_the_study_is_not_complete(tmp_path):
    studies = _study(tmp_path)
    (studies / "long-context-tiny" / "J" / "carried.json").unlink()
    j = collect.record(studies, "m", "h", commit="0123456789ab")["models"]["J"]
    assert j["carried"] is None and j["derived"]["carried_gain"] is None and j["derived"]["past_window"] is not None


def test_an_eval_file_of_another_checkpoint_is_refused(tmp_path):
    studies = _study(tmp_path)
    path = studies / "long-context-tiny" / "GPT2" / "carried.json"
    report = json.loads(path.read_text())
    path.write_text(json.dumps({**report, "step": 488}))
    with pytest.raises(ValueError, match="GPT2/carried.json: step is 488, the run's is 611"):
        collect.record(studies, "m", "h", commit="0123456789ab")


def test_main_writes_the_record_where_it_is_told_in_the_studies_layout(tmp_path, capsys):
    from drmlab.experiments.results import dumps

    out = tmp_path / "out" / "results.json"
    collect.main(["--studies", str(_study(tmp_path)), "--machine", "m", "--how", "h", "--out", str(out)])
    assert "2 models, complete: False" in capsys.readouterr().out
    text = out.read_text()
    assert dumps(json.loads(text)) == text
    assert re.fullmatch(r"[0-9a-f]{7,40}", json.loads(text)["provenance"]["commit"])


def test_the_table_prints_each_models_cells(tmp_path):
    record = collect.record(_study(tmp_path), "m", "h", commit="0123456789ab")
    table = long_context_table({"long-context-tiny": record})
    lines = table.splitlines()
    assert len(lines[0].split(" | ")) <= 9  # at most 9 columns
    assert "[0, 1) / [16, 32) / [128, 256) / [2048, 4096)" in lines[0]
    j_row = (
        f"| J | 1,000 | {1.51 / LN2:.4f} | {1.5 / LN2:.4f} | {1.47 / LN2:.4f} | +{(1.51 - 1.47) / LN2:.4f} "
        "| 2.600 / 1.500 / 1.480 / 1.550 | [32, 64): 1.450 |"
    )
    gpt2_row = (
        f"| GPT2 | 2,000 | {1.60 / LN2:.4f} | {1.5 / LN2:.4f} (first 256 of each) | {1.58 / LN2:.4f} (windows of 256) "
        f"| +{(1.60 - 1.58) / LN2:.4f} | 2.700 / 1.550 / 1.520 / n/a | [64, 128): 1.490 |"
    )
    assert j_row in lines and gpt2_row in lines
    assert lines[-1].startswith("| not evaluated yet: J_NO_DIRECTION, SSM_CONTROL, MAMBA, RESOLVENT, LLAMA |")
    assert "| not collected yet |" in long_context_table({})


def test_the_figure_draws_every_model_with_a_number_and_redraws_identically(tmp_path):
    figures = readme.figures
    record = collect.record(_study(tmp_path), "m", "h", commit="0123456789ab")
    inputs = figures.long_context_figure_inputs({"long-context-tiny": record})
    assert list(inputs["curves"]) == ["J", "GPT2"] and (inputs["train_seq_len"], inputs["seq_len"]) == (256, 4096)
    assert len(inputs["curves"]["J"]) == 13 and len(inputs["curves"]["GPT2"]) == 9  # the n/a buckets left out
    drawn = []
    for name in ("a.png", "b.png"):
        assert figures.plot_long_context(inputs, tmp_path / name, metadata={figures.FIGURE_KEY: "sha256:x"})
        drawn.append((tmp_path / name).read_bytes())
    assert drawn[0] == drawn[1] and drawn[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert figures.png_text(tmp_path / "a.png")[figures.FIGURE_KEY] == "sha256:x"
