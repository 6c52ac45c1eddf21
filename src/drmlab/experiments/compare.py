"""The cross-model table: language-modelling quality beside associative recall.

``drmlab compare --ablate DIR --mqar DIR`` joins finished studies by model name: validation bits
per byte from ``drmlab ablate`` (``results.json``: deterministic rescoring of the whole
validation stream, mean +- population std over seeds) and test accuracy on multi-query
associative recall from ``drmlab mqar`` (``mqar.json``, one number of pairs). Nothing is
trained or re-scored here; every figure is read from the studies, and the protocols of both are
printed above the table so the numbers cannot be quoted without them.

Writes ``compare.md`` (the table) and ``compare.png`` (MQAR accuracy against bits per byte, one
point per model with its seed spread) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(path: str | Path, filename: str, verb: str) -> dict:
    path = Path(path)
    file = path / filename if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no {filename} (run `drmlab {verb} --out {path}` first)")
    return json.loads(file.read_text())


def load_ablate(path: str | Path) -> dict:
    """The ``results.json`` of a ``drmlab ablate`` study (its folder or the file)."""
    return _load(path, "results.json", "ablate")


def load_mqar(path: str | Path) -> dict:
    """The ``mqar.json`` of a ``drmlab mqar`` output folder (or the file)."""
    return _load(path, "mqar.json", "mqar")


def join(ablates: list[dict], mqar: dict | None, kv: int | None) -> tuple[list[dict], int | None]:
    """One row per model: the ablation's numbers (if any) and the MQAR cell at ``kv`` (if any).
    Rows with bits per byte come first, best first; MQAR-only rows follow in the study's order."""
    rows: dict[str, dict] = {}
    for results in ablates:
        for name, m in results["models"].items():
            if name in rows:
                raise ValueError(f"model {name!r} appears in two ablation studies; pass each model once")
            rows[name] = {"model": name, "lm_params": m["params"], "bpb_mean": m["bpb_mean"],
                          "bpb_std": m["bpb_std"], "ce_mean": m["ce_mean"], "lm_seeds": m["n_seeds"]}
    if mqar is not None:
        kvs = mqar["study"]["kvs"]
        if kv is None:
            kv = kvs[0]
        elif kv not in kvs:
            raise ValueError(f"--kv {kv}: the MQAR study has kv {', '.join(map(str, kvs))}")
        for name, m in mqar["models"].items():
            cell = m["cells"].get(str(kv))
            if cell is None:
                continue
            row = rows.setdefault(name, {"model": name})
            row.update(acc_mean=cell["acc_mean"], acc_std=cell["acc_std"], acc_seeds=cell["n_seeds"],
                       first_mean=cell.get("first_query_mean"), first_std=cell.get("first_query_std"),
                       train_acc=cell["train_acc_mean"], mqar_params=cell["params"], chance=cell["chance"])
    ordered = sorted((r for r in rows.values() if "bpb_mean" in r), key=lambda r: r["bpb_mean"])
    ordered += [r for r in rows.values() if "bpb_mean" not in r]
    return ordered, kv


def _protocols(ablates: list[dict], mqar: dict | None, kv: int | None) -> list[str]:
    lines = []
    for results in ablates:
        s, t = results["study"], results["study"]["train"]
        lines.append(f"* Bits per byte: `drmlab ablate`, preset `{s['preset']}`, a {t['tokens']:,}-token budget per run "
                     f"(batch {t['batch_size']} x {t['seq_len']}), lr {t['lr']:g} {t['schedule']}, seeds "
                     f"{', '.join(map(str, s['seeds']))}; data `{s.get('data_source') or 'stdlib'}` "
                     f"({s['tokenizer']} tokenizer); whole validation stream rescored.")
    if mqar is not None:
        s = mqar["study"]
        lr = s.get("train_overrides", {}).get("lr", 1e-3)
        width = "" if s["width"] is None else f", width {s['width']}"
        train = "fresh training sequences every step" if s["n_train"] == 0 else f"{s['n_train']:,} training"
        lines.append(f"* MQAR: `drmlab mqar`, {kv} key-value pairs, {s['vocab_kv']} keys, {train} / "
                     f"{s['n_test']:,} test sequences, {s['steps']:,} steps at batch {s['batch_size']}, lr {lr:g}, "
                     f"preset `{s['preset']}`{width}, seeds "
                     f"{', '.join(map(str, s['seeds']))}; accuracy on the query positions only, chance "
                     f"{100 * mqar['chance']:.2f}%.")
        level = mqar.get("levels", {}).get(str(kv))
        if level:
            lines.append(f"* Without any key-value binding a model scores {100 * level['context_guess']:.1f}% by answering "
                         f"with a random value from its context and {100 * level['elimination_guess']:.1f}% by also "
                         f"skipping values already queried; the first query of a sequence allows no elimination, so "
                         f"first-query accuracy above {100 * level['context_guess']:.1f}% is recall.")
    return lines


def _pm(mean, std, n, scale=1.0, digits=4, unit=""):
    if mean is None:
        return "--"
    return f"{scale * mean:.{digits}f}{unit} +- {scale * std:.{digits}f} ({n})"


def markdown(rows: list[dict], ablates: list[dict], mqar: dict | None, kv: int | None) -> str:
    out = ["# Language modelling and associative recall", ""]
    out += _protocols(ablates, mqar, kv)
    out += ["", "Mean +- population std over seeds (number of seeds in brackets). Lower bits per byte is better; "
            "higher MQAR accuracy is better. MQAR parameters differ from the LM ones only through the "
            "vocabulary (and the anchor arms' own width).", ""]
    out += [f"| model | params (LM) | val bits/byte | MQAR kv={kv} test acc | first query | MQAR train acc | params (MQAR) |",
            "|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['lm_params']:,} | " if "lm_params" in r else f"| {r['model']} | -- | ")
        out[-1] += _pm(r.get("bpb_mean"), r.get("bpb_std"), r.get("lm_seeds")) + " | "
        out[-1] += (_pm(r["acc_mean"], r["acc_std"], r["acc_seeds"], 100, 1, "%") if "acc_mean" in r else "--") + " | "
        first = r.get("first_mean")
        out[-1] += ("--" if first is None else f"{100 * first:.1f}% +- {100 * r['first_std']:.1f}") + " | "
        out[-1] += (f"{100 * r['train_acc']:.1f}%" if r.get("train_acc") is not None else "--") + " | "
        out[-1] += (f"{r['mqar_params']:,}" if "mqar_params" in r else "--") + " |"
    out.append("")
    return "\n".join(out)


def plot(rows: list[dict], path: Path, kv: int | None, levels: dict | None) -> bool:
    """MQAR accuracy against bits per byte, one point per model with both, and the no-binding levels."""
    both = [r for r in rows if "bpb_mean" in r and "acc_mean" in r]
    if not both:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    offsets = [(5, 4), (5, -11), (5, 15), (5, -22)]  # staggered so neighbouring labels stay readable
    for i, r in enumerate(sorted(both, key=lambda r: r["bpb_mean"])):
        ax.errorbar(r["bpb_mean"], 100 * r["acc_mean"], xerr=r["bpb_std"], yerr=100 * r["acc_std"], fmt="o", capsize=3)
        ax.annotate(r["model"], (r["bpb_mean"], 100 * r["acc_mean"]), textcoords="offset points",
                    xytext=offsets[i % len(offsets)], fontsize=8)
    for key, label, style in (("chance", "chance", ":"), ("context_guess", "context guess (no binding)", "--"),
                              ("elimination_guess", "elimination (no binding)", "-.")):
        if levels and key in levels:
            ax.axhline(100 * levels[key], color="grey", lw=0.8, ls=style, label=label)
    if levels:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("validation bits per byte (lower is better)")
    ax.set_ylabel(f"MQAR test accuracy, kv={kv} (%)")
    ax.set_title("Language modelling vs associative recall")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare", help="join ablation (bits per byte) and MQAR studies into one table and plot",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  drmlab compare --ablate studies/ablate-tiny --mqar studies/mqar-tiny --out studies/compare")
    p.add_argument("--ablate", action="append", default=[], metavar="DIR",
                   help="a `drmlab ablate` study folder (repeatable)")
    p.add_argument("--mqar", metavar="DIR", help="a `drmlab mqar` output folder")
    p.add_argument("--kv", type=int, default=None, help="the MQAR number of pairs to show (default: the study's first)")
    p.add_argument("--out", default="compare", help="output folder for compare.md and compare.png (default compare)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if not args.ablate and not args.mqar:
        raise ValueError("give at least one --ablate DIR or --mqar DIR")
    ablates = [load_ablate(d) for d in args.ablate]
    mqar = load_mqar(args.mqar) if args.mqar else None
    rows, kv = join(ablates, mqar, args.kv)
    text = markdown(rows, ablates, mqar, kv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text)
    levels = None if mqar is None else mqar.get("levels", {}).get(str(kv), {"chance": mqar["chance"]})
    plotted = plot(rows, out / "compare.png", kv, levels)
    print(text, end="")
    print(f"wrote {out / 'compare.md'}" + (", compare.png" if plotted else ""), file=sys.stderr)
    return 0
