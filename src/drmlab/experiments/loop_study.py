"""``drmlab loop-study``: train looped arms with paired seeds and compare eps = 1/N with eps = 1.

The arms of the looped-residual study (notes/looped-study.md; ``build_model("LOOPED", arm=...)``)
are trained through exactly the ablation protocol of ``drmlab ablate``: same trainer, same
batches per seed, deterministic rescoring, mean +- std, per-seed pairs and the promotion
gate. On top of the ablation's results it writes ``loop.md`` (each arm's stored blocks L,
loop count N, schedule, eps rule and validation CE) and ``loss_vs_n.png`` (validation CE
against N, one line for the scaled arms and one for the unscaled).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from drmlab.experiments import ablate

DEFAULT_ARMS = "A,B,C,I12u,I12"


def arm_settings(arm: str, preset: str) -> dict:
    from drmlab.models import build_model

    import torch

    with torch.device("meta"):
        model = build_model("LOOPED", preset=preset, arm=arm)
    c = model.config
    return {"n_stored": c.n_stored, "n_loop": c.n_loop, "schedule": c.schedule, "eps": str(c.eps),
            "mixer": c.mixer, "scaled": str(c.eps) != "1.0" and c.eps != 1}


def loop_report(out: Path, results: dict, preset: str) -> str:
    per_model = results.get("models", {})
    rows = ["| arm | L stored | N loops | schedule | eps | mixer | val CE mean | std | seeds |", "|---|---:|---:|---|---|---|---:|---:|---:|"]
    points = {True: [], False: []}
    for arm, stats in per_model.items():
        s = arm_settings(arm, preset)
        rows.append(f"| {arm} | {s['n_stored']} | {s['n_loop']} | {s['schedule']} | {s['eps']} | {s['mixer']} | "
                    f"{stats['ce_mean']:.4f} | {stats['ce_std']:.4f} | {stats['n_seeds']} |")
        points[s["scaled"]].append((s["n_loop"], stats["ce_mean"], arm))
    text = "\n".join(rows) + "\n"
    (out / "loop.md").write_text(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for scaled, label in ((True, "eps = 1/N (scaled)"), (False, "eps = 1 (unscaled)")):
            pts = sorted(points[scaled])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
                for n, ce, arm in pts:
                    ax.annotate(arm, (n, ce), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (applications per stored block)")
        ax.set_ylabel("validation CE (nats/token)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "loss_vs_n.png", dpi=120)
        plt.close(fig)
    except ImportError:  # pragma: no cover
        pass
    return text


def add_parser(subparsers) -> argparse.ArgumentParser:
    from drmlab.cli.common import add_data_arguments

    parser = subparsers.add_parser(
        "loop-study", help="train looped arms with paired seeds (eps = 1/N against eps = 1)",
        description="Train arms of the looped-residual study through the ablation protocol and tabulate "
                    "validation CE against the loop count N for scaled and unscaled arms.",
        epilog="example:\n  drmlab loop-study --arms A,B,C,I12u,I12 --seeds 1,2,3 --preset tiny --tokens 1M",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated LOOPED arms (default {DEFAULT_ARMS})")
    parser.add_argument("--seeds", default=ablate.DEFAULT_SEEDS, help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--tokens", default="1M", metavar="N", help="token budget per run (default 1M)")
    parser.add_argument("--out", default=None, metavar="DIR", help="study directory (default studies/loop-PRESET)")
    add_data_arguments(parser)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--eval-tokens", default=None, metavar="N")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="a train setting for every run, repeatable")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import torch

    from drmlab.models.looped import ARMS
    from drmlab.models.registry import suggest
    from drmlab.cli.common import load_corpus_for

    if args.threads:
        torch.set_num_threads(args.threads)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ARMS:
            raise ValueError(f"unknown LOOPED arm {arm!r}{suggest(arm, ARMS)}; known: {', '.join(ARMS)}")
    corpus = load_corpus_for(args.data, args.tokenizer, args.cache_dir)
    ablate_args = argparse.Namespace(models="LOOPED", seeds=args.seeds, preset=args.preset, tokens=args.tokens,
                                     lr=args.lr, bf16=args.bf16, eval_tokens=args.eval_tokens,
                                     assignments=args.assignments, data=args.data, tokenizer=args.tokenizer)
    base = ablate.build_study(ablate_args, corpus.vocab_size)
    study = ablate.Study(models=arms, seeds=base.seeds, preset=base.preset, train=base.train,
                         model_overrides={arm: {"arm": arm} for arm in arms}, data_source=base.data_source,
                         tokenizer=base.tokenizer, registry_names={arm: "LOOPED" for arm in arms})
    out = Path(args.out or f"studies/loop-{args.preset}")
    results = ablate.run_study(study, out, corpus, device=args.device, quiet=args.quiet,
                               log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(ablate.markdown(results))
    print(loop_report(out, results, args.preset))
    print(f"results in {out}/: results.md, results.json, loop.md, curves.png, seeds.png, loss_vs_n.png")
    return 0
