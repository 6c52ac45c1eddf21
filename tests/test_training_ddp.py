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
    import json, sys
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
        if summary["world_size"] > 1 and torch.distributed.is_available():
            pass
        with open(out + "/losses.json", "w") as f:
            json.dump(summary["rows"], f)
    """
)


def test_two_gloo_processes_match_one(tmp_path):
    script = tmp_path / "ddp_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    run_dir = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(run_dir)]
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
        single = train(namespace["SmallLM"](seed=3), tr, va, TrainConfig(**namespace["CFG"]), tmp_path / "single",
                       quiet=True, device="cpu", evaluate=namespace["rescorer"](va, namespace["CFG"]["seq_len"]))
    finally:
        torch.set_num_threads(old)
    pick = lambda rows, kind, field: [r[field] for r in rows if r["kind"] == kind]
    a, b = pick(single["rows"], "train", "loss"), pick(ddp_rows, "train", "loss")
    assert len(a) == len(b) == 5
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pick(ddp_rows, "train", "grad_norm"), pick(single["rows"], "train", "grad_norm"), rtol=1e-5)
    np.testing.assert_allclose(pick(ddp_rows, "eval", "val_ce"), pick(single["rows"], "eval", "val_ce"), rtol=1e-5)
    assert summary["val_ce"] == pytest.approx(single["val_ce"], rel=1e-5)
