"""Training throughput of drmlab's MAMBA against Hugging Face's MambaForCausalLM on CPU.

Run: python benchmarks/bench_mamba.py [--steps 4] [--hf-steps 1] [--hf-paths loop,pscan] [--threads N]

Both models have the same configuration and start from the same weights (ours loads the HF
state dict): d_model 384, 6 layers, d_state 16, expand 2, d_conv 4, dt_rank 24, vocabulary 65,
tied embeddings = 5,810,688 parameters (the 5.81M-parameter Mamba of docs/results-in-full.md's benchmark figures).
A training step is forward + next-token cross-entropy + backward + AdamW on a batch of
8 x 256 tokens; tokens/s = 2048 / the median step time.

Hugging Face has no CPU kernel: its slow path runs the selective scan either as a Python loop
over time (``loop``, the default) or, when the ``mambapy`` package is importable and
``use_mambapy=True``, with mamba.py's parallel scan (``pscan``). Both are slow, so each is
timed over ``--hf-steps`` steps (after a short untimed call that triggers its lazy imports);
ours is timed before and after them (the median over both blocks), so the ratios come from
one run under the same machine load. Ours is also timed with its selective scan forced onto the
chunked ``linear_scan`` path (``backend="torch"``, the path off the CPU), which measures the fused
C kernel's gain inside the whole step. ``--ceiling`` also times our model with the selective
scan replaced by a zero-cost stand-in (y = x dt): what the projections, the convolution and
the optimizer cost alone, an upper bound for any scan.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import drmlab.models.layers.mamba_mixer as mamba_module  # the module whose selective_scan the mixer calls
from drmlab.models.mamba import MambaLM, config_from_hf, load_hf_state_dict
from drmlab.ops.selective_scan import AUTO_CHUNK_ELEMENTS, selective_scan, selective_scan_backend

BATCH, LENGTH, VOCAB = 8, 256, 65
DIMS = dict(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, state_size=16, expand=2, conv_kernel=4)


def hf_model(path: str):
    import transformers

    config = transformers.MambaConfig(**DIMS, use_cache=False, use_mambapy=path == "pscan")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.MambaForCausalLM(config).train()


def mambapy_available() -> bool:
    try:
        import mambapy.pscan  # noqa: F401
    except ImportError:
        return False
    return True


def make_step(model, logits_of):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(window: torch.Tensor) -> tuple[float, float]:
        start = time.perf_counter()
        logits = logits_of(model, window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - start, loss.item()

    return step


def ours_logits(model, tokens):
    return model(tokens).logits


def hf_logits(model, tokens):
    return model(input_ids=tokens, use_cache=False).logits


def zero_cost_scan(x, dt, A, Bm, Cm, h0=None, chunk=0, recompute=False):
    return x * dt, None


def torch_path_scan(*args, **kwargs):
    return selective_scan(*args, **kwargs, backend="torch")


def time_with_scan(scan, config, window, steps):
    """Step times (after one warm-up step) of a fresh model whose mixer calls ``scan``."""
    saved = mamba_module.selective_scan
    mamba_module.selective_scan = scan
    try:
        model = MambaLM(config)
        step = make_step(model, ours_logits)
        step(window)
        return [step(window)[0] for _ in range(steps)]
    finally:
        mamba_module.selective_scan = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="timed steps of ours per block (two blocks)")
    parser.add_argument("--hf-steps", type=int, default=1, help="timed steps of each Hugging Face path")
    parser.add_argument("--hf-paths", default="loop,pscan", help="comma list of loop, pscan (or 'none')")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--ceiling", action="store_true", help="also time ours with a zero-cost scan")
    parser.add_argument("--chunk", type=int, default=0, help="our scan_chunk (0: auto)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    paths = [p for p in args.hf_paths.split(",") if p and p != "none"]
    window = torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    tokens = BATCH * LENGTH

    reference = hf_model("loop")
    import transformers

    config = config_from_hf(transformers.MambaConfig(**DIMS), scan_chunk=args.chunk)
    ours = load_hf_state_dict(MambaLM(config), reference.state_dict())
    chunk = args.chunk or max(1, AUTO_CHUNK_ELEMENTS // (BATCH * config.d_inner * config.d_state))
    params = sum(p.numel() for p in ours.parameters())
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(
        f"config: d_model 384, n_layer 6, d_state 16, expand 2, d_conv 4, dt_rank {ours.config.dt_rank}, "
        f"vocab {VOCAB}; {params:,} parameters; batch {BATCH} x {LENGTH}; AdamW; our scan: "
        f"{selective_scan_backend(window.float())} (torch-path chunk {chunk}{' auto' if not args.chunk else ''})"
    )

    ours_step = make_step(ours, ours_logits)
    _, first_loss = ours_step(window)  # warm-up (builds the C scan kernel on first use)
    times = [ours_step(window)[0] for _ in range(args.steps)]

    rates: dict[str, float] = {}
    notes: dict[str, str] = {}
    for path in paths:
        if path not in ("loop", "pscan"):
            raise SystemExit(f"unknown Hugging Face path {path!r}: use loop or pscan")
        if path == "pscan" and not mambapy_available():
            print("HF pscan: skipped (mambapy is not installed: pip install mambapy)")
            continue
        model = hf_model(path)
        model.load_state_dict(reference.state_dict())
        with torch.no_grad():
            hf_logits(model, window[:1, :8])  # lazy imports, kernel look-ups: untimed
        hf_step = make_step(model, hf_logits)
        hf_times, hf_losses = zip(*(hf_step(window) for _ in range(args.hf_steps)))
        rates[f"HF {path}"] = tokens / statistics.median(hf_times)
        notes[f"HF {path}"] = f"{len(hf_times)} step(s), first loss {hf_losses[0]:.6f}"
        del model

    times += [ours_step(window)[0] for _ in range(args.steps)]
    rates["drmlab MAMBA"] = tokens / statistics.median(times)
    notes["drmlab MAMBA"] = f"{len(times)} steps, first loss {first_loss:.6f}"

    torch_times = time_with_scan(torch_path_scan, config, window, args.steps)
    rates["ours, torch-path scan"] = tokens / statistics.median(torch_times)
    notes["ours, torch-path scan"] = "the chunked linear_scan path"
    if args.ceiling:
        stub_times = time_with_scan(
            zero_cost_scan, config_from_hf(transformers.MambaConfig(**DIMS)), window, args.steps
        )
        rates["ours, zero-cost scan"] = tokens / statistics.median(stub_times)
        notes["ours, zero-cost scan"] = "upper bound for any scan"

    print(f"\n{'model':<24}{'tok/s':>10}   notes")
    for name, rate in rates.items():
        print(f"{name:<24}{rate:>10,.1f}   {notes[name]}")
    print(f"fused C scan / torch-path scan, whole step: {rates['drmlab MAMBA'] / rates['ours, torch-path scan']:.2f}x")
    for name, rate in rates.items():
        if name.startswith("HF"):
            print(f"drmlab MAMBA / {name}: {rates['drmlab MAMBA'] / rate:.1f}x")
            if "ours, zero-cost scan" in rates:
                print(f"  (zero-cost-scan ceiling / {name}: {rates['ours, zero-cost scan'] / rate:.1f}x)")


if __name__ == "__main__":
    main()
