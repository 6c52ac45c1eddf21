"""The cross-model table: language-modelling quality beside associative recall (docs/mqar.md
section 7).

It joins finished studies by model name: validation bits per byte from the ablation study
(``results.json``: deterministic rescoring of the whole validation stream, mean +- population std
over seeds; :mod:`drmlab.experiments.ablate.protocol`) and test accuracy on multi-query associative recall
from the MQAR study (``mqar.json``, one number of pairs; :mod:`drmlab.experiments.mqar.study`). Nothing is
trained or re-scored here; every figure is read from the studies, and the protocols of both are
written above the table so the numbers cannot be quoted without them.

Plain functions, for any caller: :func:`load_ablate`, :func:`load_mqar`, :func:`join` (the rows),
:func:`markdown` (the table), :func:`plot` (MQAR accuracy against bits per byte, one point per model
with its seed spread) and :func:`write_compare`, which writes ``compare.md`` and ``compare.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from drmlab.experiments.plotting import draw_or_log, pyplot


def _load(path: str | Path, filename: str, study: str) -> dict:
    path = Path(path)
    file = path / filename if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no {filename} (not the folder of a finished {study} study)")
    return json.loads(file.read_text())


def load_ablate(path: str | Path) -> dict:
    """The ``results.json`` of a ``drmlab ablate`` study (its folder or the file)."""
    return _load(path, "results.json", "ablation")


def load_mqar(path: str | Path) -> dict:
    """The ``mqar.json`` of a ``drmlab mqar`` output folder (or the file)."""
    return _load(path, "mqar.json", "MQAR")


def join(ablates: list[dict], mqar: dict | None, kv: int | None) -> tuple[list[dict], int | None]:
    """One row per model: the ablation's numbers (if any) and the MQAR cell at ``kv`` (if any).
    Rows with bits per byte come first, best first; MQAR-only rows follow in the study's order."""
    rows: dict[str, dict] = {}
    for results in ablates:
        for name, m in results["models"].items():
            if name in rows:
                raise ValueError(f"model {name!r} appears in two ablation studies; pass each model once")
            rows[name] = {
                "model": name,
                "lm_params": m["params"],
                "bpb_mean": m["bpb_mean"],
                "bpb_std": m["bpb_std"],
                "ce_mean": m["ce_mean"],
                "lm_seeds": m["n_seeds"],
            }
    if mqar is not None:
        kvs = mqar["study"]["kvs"]
        if kv is None:
            kv = kvs[0]
        elif kv not in kvs:
            raise ValueError(f"kv {kv}: the MQAR study has kv {', '.join(map(str, kvs))}")
        for name, m in mqar["models"].items():
            cell = m["cells"].get(str(kv))
            if cell is None:
                continue
            row = rows.setdefault(name, {"model": name})
            row.update(
                acc_mean=cell["acc_mean"],
                acc_std=cell["acc_std"],
                acc_seeds=cell["n_seeds"],
                first_mean=cell.get("first_query_mean"),
                first_std=cell.get("first_query_std"),
                train_acc=cell["train_acc_mean"],
                mqar_params=cell["params"],
                chance=cell["chance"],
            )
    ordered = sorted((r for r in rows.values() if "bpb_mean" in r), key=lambda r: r["bpb_mean"])
    ordered += [r for r in rows.values() if "bpb_mean" not in r]
    return ordered, kv


def _protocols(ablates: list[dict], mqar: dict | None, kv: int | None) -> list[str]:
    lines = []
    for results in ablates:
        s, t = results["study"], results["study"]["train"]
        lines.append(
            f"* Bits per byte: `drmlab ablate`, preset `{s['preset']}`, a {t['tokens']:,}-token budget per run "
            f"(batch {t['batch_size']} x {t['seq_len']}), lr {t['lr']:g} {t['schedule']}, seeds "
            f"{', '.join(map(str, s['seeds']))}; data `{s.get('data_source') or 'stdlib'}` "
            f"({s['tokenizer']} tokenizer); whole validation stream rescored."
        )
    if mqar is not None:
        s = mqar["study"]
        lr = s.get("train_overrides", {}).get("lr", 1e-3)
        width = "" if s["width"] is None else f", width {s['width']}"
        train = "fresh training sequences every step" if s["n_train"] == 0 else f"{s['n_train']:,} training"
        lines.append(
            f"* MQAR: `drmlab mqar`, {kv} key-value pairs, {s['vocab_kv']} keys, {train} / "
            f"{s['n_test']:,} test sequences, {s['steps']:,} steps at batch {s['batch_size']}, lr {lr:g}, "
            f"preset `{s['preset']}`{width}, seeds "
            f"{', '.join(map(str, s['seeds']))}; accuracy on the query positions only, chance "
            f"{100 * mqar['chance']:.2f}%."
        )
        level = mqar.get("levels", {}).get(str(kv))
        if level:
            lines.append(
                f"* Without any key-value binding a model scores {100 * level['context_guess']:.1f}% by answering "
                f"with a random value from its context and {100 * level['elimination_guess']:.1f}% by also "
                f"skipping values already queried; the first query of a sequence allows no elimination, so "
                f"first-query accuracy above {100 * level['context_guess']:.1f}% is recall."
            )
    return lines


def _pm(mean, std, n, scale=1.0, digits=4, unit=""):
    if mean is None:
        return "--"
    return f"{scale * mean:.{digits}f}{unit} +- {scale * std:.{digits}f} ({n})"


def markdown(rows: list[dict], ablates: list[dict], mqar: dict | None, kv: int | None) -> str:
    out = ["# Language modelling and associative recall", ""]
    out += _protocols(ablates, mqar, kv)
    out += [
        "",
        "Mean +- population std over seeds (number of seeds in brackets). Lower bits per byte is better; "
        "higher MQAR accuracy is better. MQAR parameters differ from the LM ones only through the "
        "vocabulary (and the anchor arms' own width).",
        "",
    ]
    out += [
        f"| model | params (LM) | val bits/byte | MQAR kv={kv} test acc | first query | MQAR train acc | params (MQAR) |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        out.append(f"| {r['model']} | {r['lm_params']:,} | " if "lm_params" in r else f"| {r['model']} | -- | ")
        out[-1] += _pm(r.get("bpb_mean"), r.get("bpb_std"), r.get("lm_seeds")) + " | "
        out[-1] += (_pm(r["acc_mean"], r["acc_std"], r["acc_seeds"], 100, 1, "%") if "acc_mean" in r else "--") + " | "
        first = r.get("first_mean")
        out[-1] += ("--" if first is None else f"{100 * first:.1f}% +- {100 * r['first_std']:.1f}") + " | "
        out[-1] += (f"{100 * r['train_acc']:.1f}%" if r.get("train_acc") is not None else "--") + " | "
        out[-1] += (f"{r['mqar_params']:,}" if "mqar_params" in r else "--") + " |"
    out.append("")
    return "\n".join(out)


def plot(rows: list[dict], path: Path, kv: int | None, levels: dict | None, metadata: dict | None = None) -> bool:
    """MQAR accuracy against bits per byte, one point per model with both, and the no-binding levels;
    ``metadata`` goes into the PNG's text chunks (matplotlib's ``savefig(metadata=...)``)."""
    both = [r for r in rows if "bpb_mean" in r and "acc_mean" in r]
    if not both:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    offsets = [(5, 4), (5, -11), (5, 15), (5, -22)]  # staggered so neighbouring labels stay readable
    for i, r in enumerate(sorted(both, key=lambda r: r["bpb_mean"])):
        ax.errorbar(r["bpb_mean"], 100 * r["acc_mean"], xerr=r["bpb_std"], yerr=100 * r["acc_std"], fmt="o", capsize=3)
        ax.annotate(
            r["model"],
            (r["bpb_mean"], 100 * r["acc_mean"]),
            textcoords="offset points",
            xytext=offsets[i % len(offsets)],
            fontsize=8,
        )
    for key, label, style in (
        ("chance", "chance", ":"),
        ("context_guess", "context guess (no binding)", "--"),
        ("elimination_guess", "elimination (no binding)", "-."),
    ):
        if levels and key in levels:
            ax.axhline(100 * levels[key], color="grey", lw=0.8, ls=style, label=label)
    if levels:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("validation bits per byte (lower is better)")
    ax.set_ylabel(f"MQAR test accuracy, kv={kv} (%)")
    ax.set_title("Language modelling vs associative recall")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=metadata)
    plt.close(fig)
    return True


def write_compare(
    ablate_dirs: list[str | Path],
    mqar_dir: str | Path | None,
    out: str | Path,
    kv: int | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[str, bool]:
    """Join the studies, write ``out/compare.md`` and ``out/compare.png``; (the table, whether the plot was written)."""
    if not ablate_dirs and mqar_dir is None:
        raise ValueError("nothing to compare: give at least one ablation study or an MQAR study")
    ablates = [load_ablate(d) for d in ablate_dirs]
    mqar = load_mqar(mqar_dir) if mqar_dir is not None else None
    rows, kv = join(ablates, mqar, kv)
    text = markdown(rows, ablates, mqar, kv)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text)
    levels = None if mqar is None else mqar.get("levels", {}).get(str(kv), {"chance": mqar["chance"]})
    plotted = draw_or_log(lambda: plot(rows, out / "compare.png", kv, levels), log, "compare.png")
    return text, plotted
