"""drmlab.runs as a package: one job per module, one module that knows the models, one public surface,
and the on-disk format its modules share (docs/runs.md, "What a run directory promises")."""

from __future__ import annotations

import ast
import hashlib
import json

import torch

import drmlab.runs
from drmlab.runs import RunDir
from test_architecture import SRC, _imports, _module_name

RUNS = SRC / "runs"
ROOT = SRC.parent.parent


def _importers_of(package: str) -> list[str]:
    """The modules of drmlab/runs/ that import ``package`` or one of its modules, anywhere in their source."""
    found = []
    for path in sorted(RUNS.rglob("*.py")):
        targets = [t for _, t in _imports(path.read_text(), _module_name(path), path.name == "__init__.py")]
        if any(t == package or t.startswith(package + ".") for t in targets):
            found.append(path.relative_to(RUNS).as_posix())
    return found


def test_only_loading_imports_the_models():
    assert _importers_of("drmlab.models") == ["loading.py"]


def test_the_importer_check_sees_a_lazy_import():
    text = "def f():\n    from drmlab.models import build_model\n"
    assert _imports(text, "drmlab.runs.checkpoint") == [(2, "drmlab.models")]


def test_every_name_imported_from_drmlab_runs_exists():
    """The package re-exports what the old module offered: no caller outside runs/ had to change."""
    wanted = {}
    for folder in ("src", "tests", "benchmarks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if RUNS in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "drmlab.runs" and not node.level:
                    for alias in node.names:
                        wanted.setdefault(alias.name, path.relative_to(ROOT).as_posix())
    assert {"RunDir", "load_run_model", "read_json", "write_json_atomic", "non_finite_parameters"} <= set(wanted)
    missing = {name: where for name, where in wanted.items() if not hasattr(drmlab.runs, name)}
    assert not missing, f"names imported from drmlab.runs that it lacks: {missing}"
    assert set(drmlab.runs.__all__) <= set(dir(drmlab.runs))


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5)
        self.out.weight = self.emb.weight  # tied: stored once


def test_the_on_disk_format_is_the_committed_one(tmp_path):
    """File names, pointer keys and sums as committed runs have them; the layout's names are the files."""
    model = _Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.out(model.emb(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    run = RunDir(tmp_path / "run")
    final = run.save_checkpoint(model, optimizer, {"step": 3, "tokens": 30})
    pointer = json.loads((run.path / "checkpoint.json").read_text())
    assert final == run.path / "checkpoints" / "step-00000003" == run.checkpoint_dir()
    assert sorted(pointer) == ["dir", "files", "format", "step"]
    assert (pointer["format"], pointer["step"], pointer["dir"]) == (
        "drmlab-checkpoint-2",
        3,
        "checkpoints/step-00000003",
    )
    assert sorted(p.name for p in final.iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ]
    assert json.loads((final / "manifest.json").read_text()) == pointer
    for name, entry in pointer["files"].items():
        data = (final / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoint.json", "checkpoints"]  # no leftovers
    assert (run.pointer_path, run.config_path, run.metrics_path) == (
        run.path / "checkpoint.json",
        run.path / "config.json",
        run.path / "metrics.jsonl",
    )

    fresh = _Tiny()
    state = run.load_checkpoint(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3))
    assert state["step"] == 3 and state["format"] == "drmlab-checkpoint-2"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))


def test_a_run_written_before_the_seal_reads_as_finished(tmp_path):
    """A finished run of an older drmlab (config.json without config.seal.json, no checkpoint kept, as the
    studies' raw run directories are) is a finished run to this one, so rerunning a study skips it."""
    written = {"model": "GPT2", "steps": 611, "finished": True, "val_ce": 1.83}
    (tmp_path / "config.json").write_text(json.dumps({"model": "GPT2", "preset": "tiny", "train": {}, "runtime": {}}))
    (tmp_path / "summary.json").write_text(json.dumps(written))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 5.5}) + "\n")
    run = RunDir(tmp_path)
    assert run.holds_run() and run.describe() == "a finished run (step 611)"
    assert run.finished_summary() == written
    assert run.read_config()["model"] == "GPT2" and run.read_metrics()[0]["step"] == 1
