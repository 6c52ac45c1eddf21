"""Two gloo processes under torchrun give the loss curve of one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from drmlab.training import TrainConfig, train

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    import torch.nn as nn
    from drmlab.models.output import ModelOutput
    from drmlab.evaluation import rescorer
    from drmlab.training import TrainConfig, train

    torch.set_num_threads(1)

    class SmallLM(nn.Module):
        def __init__(self, seed=0, vocab=64, d=16):
            super().__init__()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.emb = nn.Embedding(vocab, d)
                self.mix = nn.Linear(d, d)
                self.out = nn.Linear(d, vocab)
                self.unused = nn.Linear(2, 2)  # exercises DDP's unused-parameter handling

        def forward(self, tokens, step=None):
            h = self.emb(tokens)
            h = torch.cumsum(h, 1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
            logits = self.out(torch.tanh(self.mix(h)))
            return ModelOutput(logits=logits, aux={"loss_aux": 0.01 * h.pow(2).mean()})

    def data():
        rng = np.random.default_rng(0)
        stream = ((np.arange(6000) * 5) % 61 + rng.integers(0, 3, 6000)).astype(np.uint8)
        return stream[:5000], stream[5000:]

    CFG = dict(tokens=8 * 2 * 12 * 5, batch_size=8, grad_accum=2, seq_len=12, lr=1e-2, schedule="cosine",
               eval_every=8 * 2 * 12 * 2, eval_windows=4, eval_batch_size=4)

    if __name__ == "__main__":
        tr, va = data()
        out = sys.argv[1]
        summary = train(SmallLM(seed=3), tr, va, TrainConfig(**CFG), out, quiet=True, device="cpu",
                        evaluate=rescorer(va, CFG["seq_len"]))
        if os.environ.get("RANK", "0") == "0":  # one writer: both ranks writing at once could interleave
            with open(out + "/losses.json", "w") as f:
                json.dump(summary["rows"], f)
    """
)


def test_two_gloo_processes_match_one(tmp_path):
    script = tmp_path / "ddp_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    run_dir = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        str(run_dir),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp_rows = json.loads((run_dir / "losses.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2

    namespace: dict = {"__name__": "ddp_reference"}
    exec(compile(SCRIPT, str(script), "exec"), namespace)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr, va = namespace["data"]()
        single = train(
            namespace["SmallLM"](seed=3),
            tr,
            va,
            TrainConfig(**namespace["CFG"]),
            tmp_path / "single",
            quiet=True,
            device="cpu",
            evaluate=namespace["rescorer"](va, namespace["CFG"]["seq_len"]),
        )
    finally:
        torch.set_num_threads(old)
    pick = lambda rows, kind, field: [r[field] for r in rows if r["kind"] == kind]
    a, b = pick(single["rows"], "train", "loss"), pick(ddp_rows, "train", "loss")
    assert len(a) == len(b) == 5
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        pick(ddp_rows, "train", "grad_norm"), pick(single["rows"], "train", "grad_norm"), rtol=1e-5
    )
    np.testing.assert_allclose(pick(ddp_rows, "eval", "val_ce"), pick(single["rows"], "eval", "val_ce"), rtol=1e-5)
    assert summary["val_ce"] == pytest.approx(single["val_ce"], rel=1e-5)


AGREE_SCRIPT = SCRIPT.split('if __name__ == "__main__":')[0] + textwrap.dedent(
    """
    if __name__ == "__main__":
        import gc
        from torch.nn.parallel import DistributedDataParallel
        from drmlab.runs import RunDir
        from drmlab.training import distributed

        saved, save = [], RunDir.save_checkpoint
        wrappers, teardown = [], distributed.teardown

        def recording(self, model, optimizer, state, **kwargs):
            saved.append(state["step"])
            return save(self, model, optimizer, state, **kwargs)

        def counting(info):  # the data-parallel wrappers still alive when the group is destroyed
            wrappers.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
            teardown(info)

        RunDir.save_checkpoint, distributed.teardown = recording, counting
        rank, out = int(os.environ["RANK"]), sys.argv[1]
        tr, va = data()
        # only rank 1's clock ever says a checkpoint is due (after every step); rank 0 keeps none of its own
        train(SmallLM(seed=3), tr, va, TrainConfig(**CFG), out, quiet=True, device="cpu",
              checkpoint_seconds=0 if rank == 1 else None)
        if rank == 0:  # the one writer of checkpoints
            with open(out + "/saved.json", "w") as f:
                json.dump({"saved": saved, "wrappers": wrappers}, f)
    """
)


def test_a_checkpoint_due_on_one_process_is_committed_by_all_after_the_same_step(tmp_path):
    """Time-based checkpoints in a distributed run: when one process's clock says a checkpoint is due, every
    process commits it after the same step (rank 0 writes it). Rank 0 here has no clock of its own, so each
    checkpoint it writes before the last step comes from rank 1's. And the run ends cleanly: no
    data-parallel wrapper is left when the trainer destroys the process group (were its reducer the group's
    last holder, the group's destructor could deadlock against gloo's threads, as it did in about one run of
    this test in four before the trainer dropped the wrapper first)."""
    script = tmp_path / "agree_script.py"
    script.write_text(AGREE_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(script), str(tmp_path / "ddp")], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((tmp_path / "ddp" / "saved.json").read_text()) == {"saved": [1, 2, 3, 4, 5], "wrappers": [0]}


FSDP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from drmlab.models.output import ModelOutput
    from drmlab.evaluation import rescorer
    from drmlab.training import TrainConfig, train

    torch.set_num_threads(1)

    class BlockLM(nn.Module):
        # Two residual blocks in ``blocks`` (each one FSDP unit), an output tied to the embedding and a
        # parameter that never gets a gradient (no optimizer state: the sharded load must accept that).
        def __init__(self, seed=0, vocab=64, d=16):
            super().__init__()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.emb = nn.Embedding(vocab, d)
                self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d)) for _ in range(2))
                self.out = nn.Linear(d, vocab, bias=False)
                self.out.weight = self.emb.weight
                self.unused = nn.Linear(2, 2)

        def forward(self, tokens, step=None):
            h = self.emb(tokens)
            h = torch.cumsum(h, 1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
            for block in self.blocks:
                h = h + torch.tanh(block(h))
            return ModelOutput(logits=self.out(h), aux={"loss_aux": 0.01 * h.pow(2).mean()})

    def data():
        rng = np.random.default_rng(0)
        stream = ((np.arange(6000) * 5) % 61 + rng.integers(0, 3, 6000)).astype(np.uint8)
        return stream[:5000], stream[5000:]

    CFG = dict(tokens=8 * 2 * 12 * 5, batch_size=8, grad_accum=2, seq_len=12, lr=1e-2, schedule="cosine",
               eval_every=8 * 2 * 12 * 2, eval_windows=4, eval_batch_size=4)

    def run(out, **kwargs):
        tr, va = data()
        model = BlockLM(seed=3)
        summary = train(model, tr, va, TrainConfig(**CFG), out, quiet=True, device="cpu",
                        evaluate=rescorer(va, CFG["seq_len"]), fsdp=True, **kwargs)
        from torch.distributed.fsdp import FSDPModule
        summary["units"] = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
        summary["local_rows"] = model.blocks[0][1].weight.to_local().shape[0]  # a block's weight, resharded
        return summary

    if __name__ == "__main__":
        dist.init_process_group("gloo")  # one group for the three runs below
        base = sys.argv[1]
        whole = run(base + "/whole")
        rows = {"whole": whole["rows"], "units": whole["units"], "local_rows": whole["local_rows"]}
        run(base + "/stopped", stop_after_step=2)
        rows["resumed"] = run(base + "/stopped", resume=True)["rows"]
        if dist.get_rank() == 0:
            with open(base + "/rows.json", "w") as f:
                json.dump(rows, f)
        dist.destroy_process_group()
    """
)


def test_fsdp_two_gloo_processes_match_one_and_resume(tmp_path):
    """FSDP2 (fully_shard on each block and the root) over 2 gloo processes: losses, gradient norms and
    evaluations equal one process within 1e-6; a run stopped at step 2 and resumed under FSDP ends
    bit-exactly as the uninterrupted one; the checkpoint has the single-process format and loads into
    one process."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from drmlab.runs import RunDir

    script = tmp_path / "fsdp_script.py"
    script.write_text(FSDP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    whole, resumed = RunDir(tmp_path / "whole"), RunDir(tmp_path / "stopped")
    summary = whole.read_summary()
    assert summary["world_size"] == 2 and whole.read_config()["runtime"]["data_parallel"] == "fsdp"
    assert rows["units"] == ["", "blocks.0", "blocks.1"] and rows["local_rows"] == 8  # each process: half of 16 rows

    namespace: dict = {"__name__": "fsdp_reference"}
    exec(compile(FSDP_SCRIPT, str(script), "exec"), namespace)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr, va = namespace["data"]()
        cfg, evaluate = TrainConfig(**namespace["CFG"]), namespace["rescorer"](va, namespace["CFG"]["seq_len"])
        single = train(
            namespace["BlockLM"](seed=3), tr, va, cfg, tmp_path / "single", quiet=True, device="cpu", evaluate=evaluate
        )
        # the FSDP run's directory, read by one process: its final weights and their evaluation
        model = namespace["BlockLM"](seed=0)
        optimizer = torch.optim.AdamW(model.parameters())
        whole.load_checkpoint(model, optimizer, restore_rng=False)
        one_process_eval = evaluate(model.eval(), torch.device("cpu"), False)
        reference = namespace["BlockLM"](seed=0)
        RunDir(tmp_path / "single").load_checkpoint(reference)
    finally:
        torch.set_num_threads(old)

    pick = lambda rows, kind, field: [r[field] for r in rows if r["kind"] == kind]
    assert len(pick(single["rows"], "train", "loss")) == len(pick(rows["whole"], "train", "loss")) == 5
    for kind, field in (("train", "loss"), ("train", "ce"), ("train", "grad_norm"), ("eval", "val_ce")):
        np.testing.assert_allclose(
            pick(rows["whole"], kind, field), pick(single["rows"], kind, field), rtol=1e-6, atol=1e-6
        )
    assert summary["val_ce"] == pytest.approx(single["val_ce"], rel=1e-6)
    # stopped at step 2 and resumed under FSDP: the same steps 3-5, bit for bit, and the same weights
    assert pick(rows["resumed"], "train", "step") == [3, 4, 5]
    for kind, field in (("train", "loss"), ("train", "grad_norm"), ("eval", "val_ce")):
        assert (
            pick(rows["resumed"], kind, field)
            == pick(rows["whole"], kind, field)[-len(pick(rows["resumed"], kind, field)) :]
        )
    assert resumed.read_summary()["val_ce"] == summary["val_ce"]
    files = lambda run, name: run.checkpoint_dir() / name
    for name in ("model.safetensors", "optimizer.safetensors"):  # every tensor bit for bit (header order varies)
        a, b = load_file(files(resumed, name)), load_file(files(whole, name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # the single-process format: the same tensor names, shapes and metadata (the tied output stored once)
    for name in ("model.safetensors", "optimizer.safetensors"):
        with safe_open(files(whole, name), "pt") as a, safe_open(files(RunDir(tmp_path / "single"), name), "pt") as b:
            assert a.metadata() == b.metadata()
            assert {k: a.get_slice(k).get_shape() for k in a.keys()} == {
                k: b.get_slice(k).get_shape() for k in b.keys()
            }  # noqa: SIM118
    assert "out.weight" not in safe_open(files(whole, "model.safetensors"), "pt").keys()  # noqa: SIM118 (safe_open has no __contains__)
    assert whole.read_state()["optimizer"] == RunDir(tmp_path / "single").read_state()["optimizer"]
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
    assert one_process_eval["ce"] == pytest.approx(summary["val_ce"], rel=1e-6)


def test_torchrun_of_one_process_shards_over_one_rank_and_equals_a_plain_run(tmp_path):
    """``torchrun --nproc_per_node 1 -m drmlab train --fsdp`` joins a process group of one and wraps the
    model with FSDP2 (what a one-GPU machine can check of FSDP over NCCL); the numbers equal a plain run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    train = [
        "train",
        "--model",
        "J",
        "--preset",
        "micro",
        "--tokens",
        "2k",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--eval-tokens",
        "2k",
        "--quiet",
    ]
    sharded, plain = tmp_path / "fsdp", tmp_path / "plain"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "drmlab",
        *train,
        "--fsdp",
        "--out",
        str(sharded),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "drmlab", *train, "--out", str(plain)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((sharded / "config.json").read_text())
    assert config["runtime"]["data_parallel"] == "fsdp" and config["runtime"]["world_size"] == 1
    assert json.loads((plain / "config.json").read_text())["runtime"]["data_parallel"] is None
    val = lambda run: json.loads((run / "summary.json").read_text())["val_ce"]
    assert val(sharded) == val(plain)
