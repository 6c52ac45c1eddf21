"""The protocol studies one at a time: each model at its swept rate (``protocol-tiny``, ``-small``,
``-micro`` ...), the learning-rate sweep that chose it, the float32 check beside ``--fast``, the rate
choices checked again at the full budget, and the README's headline table.
"""

from __future__ import annotations

from drmlab.experiments.ablate.scales import seeds_done
from drmlab.experiments.stats import mean_std

from .format import LN2, bits_per_byte_cells, markdown_table, scientific, seed_values


def _protocol_table(studies: dict[str, dict], name: str = "protocol-tiny") -> str:
    """The protocol at one preset, each model at its swept rate: bits per byte (mean +- population std over
    seeds, per seed), the whole-stream rescoring at the 1M and 2M milestones, tokens/s; a study still
    running shows its finished models and a row naming the rest, one not yet collected a row saying so."""
    header = ["model", "params", "lr (swept)", "bits/byte", "seeds 1 / 2 / 3", "at 1M tokens", "at 2M tokens", "tok/s"]
    align = ["---", "---:", "---:", "---", "---", "---:", "---:", "---:"]
    if name not in studies:
        return markdown_table(header, align, [["not run yet", *["-"] * 7]])
    study = studies[name]
    rows = []
    for model, m in sorted(study["models"].items(), key=lambda kv: mean_std(seed_values(kv[1]["per_seed"]))[0]):
        done, wanted = seeds_done(study, model)
        if done < wanted:  # its paired seeds so far, no mean
            cells = [f"{v / LN2:.4f}" for v in seed_values(m["per_seed"])] + ["-"] * (wanted - done)
            rows.append(
                [model, f"{m['params']:,}", scientific(m["lr"]), f"{done} of {wanted} seeds", " / ".join(cells)]
            )
            rows[-1] += ["-"] * 3
            continue
        runs = sorted((r for r in study["runs"] if r["model"] == model), key=lambda r: r["seed"])
        marks = sorted({tokens for r in runs for tokens, _, _ in r["milestones"]})
        at = [mean_std([next(b for t, _, b in r["milestones"] if t == mark) for r in runs])[0] for mark in marks]
        speed = mean_std([r["tokens_per_s"] for r in runs])[0]
        rows.append(
            [
                model,
                f"{m['params']:,}",
                scientific(m["lr"]),
                *bits_per_byte_cells(m),
                *(f"{v:.4f}" for v in at),
                f"{speed:,.0f}",
            ]
        )
    waiting = [model for model in study["study"]["models"] if model not in study["models"]]
    if waiting:
        rows.append([f"still training: {', '.join(waiting)}", *["-"] * 7])
    return markdown_table(header, align, rows)


def _precision_table(studies: dict[str, dict], fast: str = "protocol-small", plain: str = "protocol-small-fp32") -> str:
    """The float32 check beside a protocol run with ``--fast`` (docs/results-in-full.md section 6, "The float32 check"): per model of the float32
    record, both runs at the seeds they share (seed 1), the same rate, their bits per byte, the difference
    (``--fast`` less float32; negative: ``--fast`` lower) and each run's own tokens/s."""
    header = [
        "model",
        "lr",
        "seed",
        "--fast bits/byte",
        "float32 bits/byte",
        "--fast - float32",
        "tok/s --fast / float32",
    ]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:"]
    if plain not in studies:
        return markdown_table(header, align, [["not run yet", *["-"] * 6]])
    rows = []
    for model in studies[plain]["study"]["models"]:
        for seed in studies[plain]["study"]["seeds"]:
            runs = [
                next((r for r in studies[name]["runs"] if r["model"] == model and r["seed"] == seed), None)
                for name in (fast, plain)
            ]
            if None in runs:
                rows.append([model, "-", str(seed), *["-"] * 4])
                continue
            lrs = {studies[name]["models"][model]["lr"] for name in (fast, plain)}
            if len(lrs) != 1:
                raise ValueError(f"{plain}: {model} ran at another rate than in {fast} ({sorted(lrs)})")
            (a, b), (sa, sb) = [r["val_bpb"] for r in runs], [r["tokens_per_s"] for r in runs]
            rows.append(
                [
                    model,
                    scientific(lrs.pop()),
                    str(seed),
                    f"{a:.4f}",
                    f"{b:.4f}",
                    f"{a - b:+.4f}",
                    f"{sa:,.0f} / {sb:,.0f}",
                ]
            )
    return markdown_table(header, align, rows)


def _protocol_sweep_table(studies: dict[str, dict], name: str = "protocol-tiny") -> str:
    """The learning-rate sweep of a protocol study (docs/drm.md section A.7.1): tuning CE per model and
    rate, the chosen rate (:func:`drmlab.experiments.lr_sweep.choose`) in bold, edge flagged; a model whose
    sweep has not finished shows "-" at the rates it has not tried."""
    from drmlab.experiments.lr_sweep import choose

    if name not in studies:
        return markdown_table(["model", "lr", "best"], ["---", "---:", "---"], [["not run yet", "-", "-"]])
    study = studies[name]
    grid = study["study"]["lr_grid"]
    rows = []
    for model, sweep in study["lr_sweep"].items():
        scores = {float(k): v for k, v in sweep["scores"].items()}
        best = choose(scores)
        cells = [
            ("**%.4f**" if lr == best["lr"] else "%.4f") % scores[lr]
            if scores.get(lr) is not None
            else ("diverged" if lr in best["diverged"] else "-")
            for lr in grid
        ]
        verdict = (
            "-" if best["lr"] is None else scientific(best["lr"]) + (" (edge of the grid)" if best["edge"] else "")
        )
        rows.append([model, *cells, verdict])
    return markdown_table(
        ["model", *(f"lr {scientific(lr)}" for lr in grid), "best"], ["---"] + ["---:"] * len(grid) + ["---"], rows
    )


def full_budget_sweeps(check: dict) -> dict[str, dict]:
    """Every model's sweep over the parts of the full-budget check (``lr_sweep`` of each part)."""
    return {model: sweep for part in check["parts"].values() for model, sweep in (part.get("lr_sweep") or {}).items()}


def full_budget_paired(check: dict) -> dict[str, dict]:
    """Every model's paired runs over the parts of the full-budget check (``models`` of each part)."""
    return {model: m for part in check["parts"].values() for model, m in part["models"].items()}


def _full_budget_sweep_table(
    studies: dict[str, dict], protocol: str = "protocol-tiny", check: str = "protocol-tiny-fullbudget"
) -> str:
    """The protocol's rate choices checked at the full budget: per model the rates tried again for
    5,005,312 tokens (seed 1, the same held-out slice), beside their scores after the protocol's own short
    sweep; each budget's best rate in bold, a rate still training as "training"."""
    short = studies[protocol]["lr_sweep"]
    record = studies[check]
    sweeps = full_budget_sweeps(record)
    short_tokens = record["protocol"].get("short_tune_tokens") or 1_000_000

    def cell(value: float | None, best: bool) -> str:
        return "-" if value is None else ("**%.4f**" if best else "%.4f") % value

    rows = []
    for model, sweep in sorted(sweeps.items(), key=lambda kv: list(short).index(kv[0])):
        full = {float(k): v for k, v in sweep["scores"].items()}
        scored = {k: v for k, v in full.items() if v is not None}
        early = {float(k): v for k, v in short[model]["scores"].items() if v is not None}
        best_full = min(scored, key=scored.get) if sweep.get("complete") and scored else None
        best_early = min(early, key=early.get)
        for lr in sorted(full):
            late = "training" if full[lr] is None else cell(full[lr], lr == best_full)
            rows.append([model, scientific(lr), cell(early.get(lr), lr == best_early), late])
    tokens = record["protocol"]["tokens"]
    return markdown_table(
        ["model", "lr", f"tuning CE after {short_tokens / 1e6:g}M tokens", f"after {tokens:,} tokens"],
        ["---", "---:", "---:", "---:"],
        rows,
    )


def _full_budget_paired_table(studies: dict[str, dict]) -> str:
    """Paired runs (3 seeds, the protocol's budget and batches) of the models whose full-budget choice
    differs from the protocol's: bits per byte at each rate, and the gate against the protocol's
    other models at their own rates."""
    protocol = studies["protocol-tiny"]["models"]
    paired = full_budget_paired(studies["protocol-tiny-fullbudget"])
    rows = []
    for model, run in paired.items():
        for label, m in ((f"{model} (the protocol's rate)", protocol[model]), (f"{model} (full-budget choice)", run)):
            rows.append([label, scientific(m["lr"]), *bits_per_byte_cells(m)])
    return markdown_table(["model", "lr", "bits/byte", "seeds 1 / 2 / 3"], ["---", "---:", "---", "---"], rows)


def _headline_table(studies: dict[str, dict]) -> str:
    """The README's one results table: the protocol at tiny (each model at its swept rate, 5M tokens), bits per
    byte over its seeds, best first under the reference's recipe; beside it the same protocol under the field's
    recipe (protocol-tiny-field, where committed: its rate and bits per byte, or how many seeds have finished)
    and at small (protocol-small). A model one study lacks shows "-" there; a model only the field's study has
    comes last. The header names each study's recipe."""
    from drmlab.experiments.ablate.recipe_verdicts import recipe_of

    study = studies["protocol-tiny"]
    others = [(studies.get("protocol-tiny-field"), "field"), (studies.get("protocol-small"), "small")]
    others = [(record, label) for record, label in others if record is not None]

    def by_mean(record: dict) -> list[str]:
        return sorted(record["models"], key=lambda m: mean_std(seed_values(record["models"][m]["per_seed"]))[0])

    field_models = others[0][0]["study"]["models"] if others and others[0][1] == "field" else []
    order = by_mean(study) + [m for m in field_models if m not in study["models"]]
    rows = []
    for model in order:
        m = study["models"].get(model)
        row = [model, f"{m['params']:,}" if m is not None else _params_elsewhere(model, others)]
        row += [scientific(m["lr"]), bits_per_byte_cells(m)[0]] if m is not None else ["-", "-"]
        for record, label in others:
            row += _headline_cells(record, model, params=label == "small")
        rows.append(row)
    header = [
        "model",
        "params",
        f"lr ({recipe_of(study)} recipe)",
        f"val bits/byte, {len(study['study']['seeds'])} seeds",
    ]
    align = ["---", "---:", "---:", "---"]
    for record, label in others:
        n = len(record["study"]["seeds"])
        if label == "small":
            header += ["small: params"]
            align += ["---:"]
        header += [f"{label}: lr ({recipe_of(record)} recipe)", f"{label}: val bits/byte, {n} seeds"]
        align += ["---:", "---"]
    return markdown_table(header, align, rows)


def _params_elsewhere(model: str, others: list[tuple[dict, str]]) -> str:
    """The parameter count of ``model`` from the first other study that has finished a seed of it, else "-"."""
    return next((f"{r['models'][model]['params']:,}" for r, _ in others if model in r["models"]), "-")


def _headline_cells(record: dict, model: str, params: bool) -> list[str]:
    """A study's cells of one headline row: (params,) rate and bits per byte; while its seeds run, the rate
    its sweep chose and "training (k of n seeds)"; "-" for a model it does not train."""
    m = record["models"].get(model)
    done, wanted = seeds_done(record, model)
    size = ([f"{m['params']:,}"] if m is not None else ["-"]) if params else []
    if m is not None and done == wanted:
        return size + [scientific(m["lr"]), bits_per_byte_cells(m)[0]]
    if model in record["study"]["models"]:
        chosen = (record.get("lr_sweep") or {}).get(model, {}).get("lr")
        return size + [scientific(chosen) if chosen else "-", f"training ({done} of {wanted} seeds)"]
    return ["-"] * (3 if params else 2)
