"""The first studies at preset tiny, each a table of models: the DRM ablation (``ablate-tiny-drm``), the
loop study (``loop-study-tiny``) and the cross-family comparison of bits per byte beside MQAR recall
(``compare-tiny``), with the extractors the compare-tiny figure shares (:func:`cross_family_rows`).
"""

from __future__ import annotations

from drmlab.experiments.stats import mean_std

from .format import LN2, markdown_table, seed_values


def lm_bits_per_byte(ablate: dict) -> dict[str, dict]:
    """Per model of the tiny ablation: params, its table label (None: the name), bits per byte (mean,
    std) and, where per-seed CE was kept, the CE mean and std in nats per byte."""
    out = {}
    for name, m in ablate["models"].items():
        row = {"params": m["params"], "label": m.get("label")}
        if "ce_per_seed" in m:
            ce = seed_values(m["ce_per_seed"])
            row["ce_mean"], row["ce_std"] = mean_std(ce)
            row["bpb_mean"], row["bpb_std"] = row["ce_mean"] / LN2, row["ce_std"] / LN2
        else:
            row["bpb_mean"], row["bpb_std"] = m["bpb_mean"], m["bpb_std"]
        out[name] = row
    return out


def mqar_accuracy(mqar: dict) -> dict[str, dict]:
    """Per MQAR model: test accuracy mean and std in percent (computed where per-seed values were
    kept), first-query accuracy, train accuracy, params and label."""
    out = {}
    for name, m in mqar["models"].items():
        row = dict(m)
        if "acc_per_seed" in m:
            row["acc_mean"], row["acc_std"] = mean_std(seed_values(m["acc_per_seed"]))
        out[name] = row
    return out


def cross_family_rows(studies: dict[str, dict]) -> list[dict]:
    """The rows of the cross-family table: models with bits per byte first, best first, then the
    MQAR-only models in the MQAR study's order (as ``drmlab compare`` orders them)."""
    lm = lm_bits_per_byte(studies["ablate-tiny"])
    recall = mqar_accuracy(studies["mqar-tiny"])
    rows = []
    for name in list(lm) + [n for n in recall if n not in lm]:
        row = {"model": name, **recall.get(name, {}), **lm.get(name, {})}
        row["label"] = lm.get(name, {}).get("label") or recall.get(name, {}).get("label") or name
        row["has_mqar"] = name in recall
        rows.append(row)
    with_lm = sorted((r for r in rows if "bpb_mean" in r), key=lambda r: r["bpb_mean"])
    return with_lm + [r for r in rows if "bpb_mean" not in r]


def _ablate_drm_table(studies: dict[str, dict]) -> str:
    ablate = studies["ablate-tiny"]
    lm = lm_bits_per_byte(ablate)
    seeds = " / ".join(str(s) for s in ablate["protocol"]["seeds"])
    rows = []
    for name in sorted((n for n in lm if "ce_mean" in lm[n]), key=lambda n: lm[n]["ce_mean"]):
        r = lm[name]
        per_seed = " / ".join(f"{v:.4f}" for v in seed_values(ablate["models"][name]["ce_per_seed"]))
        rows.append(
            [name, f"{r['params']:,}", f"{r['ce_mean']:.4f} +- {r['ce_std']:.4f}", per_seed, f"{r['bpb_mean']:.3f}"]
        )
    return markdown_table(
        ["model", "params", "val CE", f"seeds {seeds}", "bits/byte"], ["---", "---:", "---", "---", "---:"], rows
    )


def _loop_study_table(studies: dict[str, dict]) -> str:
    study = studies["loop-study-tiny"]
    rows = []
    for a in study["arms"]:
        shape = f"{a['stored_blocks']} x {a['loops']}" + (f" ({a['note']})" if a.get("note") else "")
        rows.append([a["arm"], shape, a["eps"], f"{a['params']:,}", f"{a['ce_mean']:.4f} +- {a['ce_std']:.4f}"])
    n = len(study["protocol"]["seeds"])
    return markdown_table(
        ["arm", "stored L x loops N", "eps", "params", f"val CE (nats/token), {n} seeds"],
        ["---", "---", "---", "---:", "---"],
        rows,
    )


def _percent_pm(mean: float, std: float) -> str:
    return f"{mean:.1f}% +- {std:.1f}"


def _cross_family_table(studies: dict[str, dict]) -> str:
    kv = studies["mqar-tiny"]["protocol"]["kv"]
    rows = []
    for r in cross_family_rows(studies):
        bpb = f"{r['bpb_mean']:.4f} +- {r['bpb_std']:.4f}" if "bpb_mean" in r else "--"
        if r["has_mqar"]:
            acc = _percent_pm(r["acc_mean"], r["acc_std"])
            if "acc_per_seed" in r:
                acc += " (" + " / ".join(f"{v:.1f}" for v in seed_values(r["acc_per_seed"])) + ")"
            first = _percent_pm(r["first_query_mean"], r["first_query_std"])
            train = f"{r['train_acc']:.1f}%"
        else:
            acc = first = train = "--"
        rows.append([r["label"], f"{r['params']:,}", bpb, acc, first, train])
    return markdown_table(
        ["model", "params", "val bits/byte", f"MQAR kv={kv}", "first query", "MQAR train acc"],
        ["---", "---:", "---", "---", "---:", "---:"],
        rows,
    )
