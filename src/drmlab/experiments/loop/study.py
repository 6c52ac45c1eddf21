"""The loop study (docs/looped.md section 4): looped arms with paired seeds, eps = 1/N against eps = 1.

The arms of the looped-residual study (``build_model("LOOPED", arm=...)``, docs/looped.md section 3)
are trained through exactly the ablation protocol of :mod:`drmlab.experiments.ablate.protocol`: same trainer,
same batches per seed, deterministic rescoring, mean +- std, per-seed pairs and the promotion gate;
each arm is a label of the study (run folders ``OUT/runs/ARM-seedS``). On top of the ablation's
report, :mod:`drmlab.experiments.loop.report` writes ``loop.md`` (each arm's stored blocks L,
loop count N, schedule, eps rule and validation CE) and ``loss_vs_n.png``.

Loop count at evaluation (docs/looped.md section 4.1, the reference study's extrapolation probe):
with ``eval_loops`` (N' values) every finished run of a looped arm is reloaded and rescored -- the
same deterministic rescoring of the same validation tokens as its final evaluation -- with its stored
blocks applied N' times (:meth:`~drmlab.models.looped.LoopedLM.set_loop_count`), eps frozen at the
trained value and eps re-set to 1/N'. Scores are cached per run in ``OUT/eval_loops/ARM-seedS.json``
(keyed by the checkpoint and the rescoring settings); the table, mean +- population std over seeds,
goes into ``results.json`` (key ``eval_loops``), ``results.md``, ``loop.md`` and ``eval_loops.png``.
A vanilla arm (no loop) is reported as not applicable.

Python: ``run_study(LoopSpec(models=arms, seeds=..., tokens=..., eval_loops=...), Runtime(...), out)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from drmlab.experiments.ablate import protocol as ablate
from drmlab.experiments.loop import report
from drmlab.experiments.spec import Runtime, StudySpec
from drmlab.experiments.stats import mean_std

DEFAULT_ARMS = ("A", "B", "C", "I12u", "I12")
DEFAULT_TOKENS = 1_000_000
# eps at the evaluation loop count N': the trained value, or re-set to 1/N' (LoopedLM.set_loop_count's eps)
EPS_MODES = {"frozen": "frozen", "1/N'": "1/N"}
EVAL_LOOPS_DIR = "eval_loops"


@dataclass(frozen=True)
class LoopSpec(StudySpec):
    """The loop study: ``models`` are LOOPED arms (labels of the ablation study, each building LOOPED
    with ``arm=`` itself; ``model_settings`` may add settings per arm), the default budget 1M tokens.
    ``eval_loops``: N' values (a list or ``"2,4,8"``) at which every finished looped run is rescored."""

    models: tuple = DEFAULT_ARMS
    seeds: tuple = ablate.DEFAULT_SEEDS
    eval_loops: tuple | str | None = None


def ablation_spec(spec: LoopSpec) -> StudySpec:
    """The ablation study whose labels are the arms of ``spec``."""
    arms = ablate.distinct_names(spec.models, "arms")
    given = dict(spec.model_settings)
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(StudySpec)}
    return StudySpec(
        **dict(
            fields,
            models=tuple(arms),
            tokens=DEFAULT_TOKENS if spec.tokens is None else spec.tokens,
            model_settings={arm: {"arm": arm, **given.get(arm, {})} for arm in arms},
            registry_names={arm: "LOOPED" for arm in arms},
        )
    )


def plan_study(spec: LoopSpec) -> ablate.Study:
    """The ablation study whose labels are LOOPED arms; every arm and setting is checked here."""
    return ablate.plan_study(ablation_spec(spec))


def arm_settings(arm: str, preset: str) -> dict:
    """The arm's stored blocks, loop count, schedule, eps rule and mixer, and whether eps is scaled."""
    from drmlab.models.registry import config_fields

    c = config_fields("LOOPED", preset, arm=arm)
    eps = str(c["eps"])
    return {
        "n_stored": c["n_stored"],
        "n_loop": c["n_loop"],
        "schedule": c["schedule"],
        "eps": eps,
        "mixer": c["mixer"],
        "scaled": eps != "1.0" and c["eps"] != 1,
    }


def run_study(
    spec: LoopSpec, runtime: Runtime, out: str | Path, *, corpus=None, sweep_only: bool = False
) -> tuple[dict, str] | None:
    """Plan, run or resume, and report the loop study: (the ablation results, the loop table), or None where
    ``runtime.leave_held`` left runs to other processes; with
    ``spec.lr_grid`` each arm first sweeps its learning rate (:mod:`drmlab.experiments.lr_sweep`); with
    ``spec.eval_loops`` every finished looped run is also rescored at each N', eps frozen and re-set
    (:func:`evaluate_loop_counts`; ``results["eval_loops"]``); ``sweep_only``: stop after the sweep
    (:func:`drmlab.experiments.ablate.protocol.run_planned`)."""
    study = plan_study(spec)
    eval_loops = spec.eval_loops
    loop_counts = parse_loop_counts(eval_loops) if eval_loops is not None else None
    if loop_counts and corpus is None:  # one load for the training and the rescoring
        from drmlab.data import load_corpus

        corpus = load_corpus(source=study.data_source, tokenizer=study.tokenizer, cache_dir=runtime.cache_dir)
    results = ablate.run_planned(study, runtime, out, corpus=corpus, sweep_only=sweep_only)
    if results is None:
        return None
    settings = {arm: arm_settings(arm, study.preset) for arm in results["models"]}
    loop_eval = None
    if loop_counts:
        loop_eval = evaluate_loop_counts(
            study, runtime, out, loop_counts, corpus=corpus, settings=settings, seeds=results["study"]["seeds"]
        )
        results["eval_loops"] = loop_eval
        report.add_to_results(results, out)
    return results, report.write_report(results, settings, out, log=runtime.log, loop_eval=loop_eval)


# ---------------------------------------------------------------- loop count at evaluation


def parse_loop_counts(value) -> list[int]:
    """``"2,4,8,16"`` or ``[2, 4, 8, 16]`` -> distinct positive loop counts, in the order given."""
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    counts = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit() or int(text) <= 0:
            raise ValueError(f"eval_loops: {item!r} is not a positive integer loop count (give e.g. 2,4,8,16)")
        counts.append(int(text))
    if not counts:
        raise ValueError("eval_loops: give at least one loop count (e.g. 2,4,8,16)")
    if len(set(counts)) != len(counts):
        raise ValueError(f"eval_loops lists a loop count twice: {counts}")
    return counts


def evaluate_loop_counts(
    study: ablate.Study,
    runtime: Runtime,
    out: str | Path,
    loop_counts: list[int],
    *,
    corpus,
    settings: dict,
    seeds=None,
) -> dict:
    """Rescore every finished run (of ``seeds``, default the study's) of the looped arms in ``settings``
    (:func:`arm_settings` by arm) at each N' of ``loop_counts``, eps frozen and re-set to 1/N'; per arm
    and cell the mean +- population std of the validation CE over seeds.

    The rescoring is the runs' final evaluation (validation tokens, window, batch, token cap), so the
    trained model's own score (``trained``, also rescored here) reproduces each run's ``val_ce``.
    """
    from drmlab.evaluation import byte_counter

    count_bytes = byte_counter(corpus.val, corpus.tokenizer, corpus.meta.get("val_bytes"))
    rescoring = {
        "seq_len": study.train["seq_len"],
        "batch_size": study.train["eval_batch_size"],
        "max_targets": study.train["eval_tokens"],
        "data": corpus.meta.get("content_sha256"),
    }
    arms = {}
    for arm, arm_setting in settings.items():
        if arm_setting["schedule"] == "vanilla":
            arms[arm] = {
                "applicable": False,
                "n_loop": arm_setting["n_loop"],
                "eps": arm_setting["eps"],
                "reason": "vanilla stack: each stored block is applied once, there is no loop to change",
            }
            continue
        per_seed = {}
        for seed in study.seeds if seeds is None else seeds:
            run_path = ablate.run_dir(out, arm, seed)
            scores = _run_scores(runtime, run_path, arm, seed, loop_counts, rescoring, corpus, count_bytes)
            if scores is not None:
                per_seed[seed] = scores
        if per_seed:
            arms[arm] = _arm_summary(arm_setting, per_seed, loop_counts)
    return {"loop_counts": list(loop_counts), "eps_modes": list(EPS_MODES), "rescoring": rescoring, "arms": arms}


def _cell_key(n_loop: int, mode: str) -> str:
    return f"{n_loop} {mode}"


def _run_scores(
    runtime: Runtime, run_path: Path, arm: str, seed: int, loop_counts, rescoring: dict, corpus, count_bytes
) -> dict | None:
    """One finished run's scores {"trained": {...}, "cells": {"N' mode": {"eps", "ce", "bpb"}}}, or None
    when the run has not finished; cells already in the run's cache file are not rescored."""
    from drmlab.evaluation import rescore
    from drmlab.runs import RunDir, read_json, write_json_atomic

    run = RunDir(run_path)
    summary = run.finished_summary()
    if summary is None:
        return None
    cache_path = Path(run_path).parent.parent / EVAL_LOOPS_DIR / f"{Path(run_path).name}.json"
    identity = {"checkpoint": run.read_pointer(), "rescoring": rescoring}
    cached = read_json(cache_path) if cache_path.is_file() else {}
    by_eps = dict(cached.get("scores", {})) if cached.get("identity") == identity else {}
    model, _, _ = run.load_model(runtime.device)
    trained_loops = model.config.n_loop
    fresh = 0

    def score(n_loop: int, eps) -> dict:
        nonlocal fresh
        model.set_loop_count(n_loop, eps)
        key = f"{n_loop} {model.eps!r}"  # frozen and re-set coincide where 1/N' is the trained eps
        if key not in by_eps:
            result = rescore(
                model,
                corpus.val,
                rescoring["seq_len"],
                batch_size=rescoring["batch_size"],
                max_targets=rescoring["max_targets"],
                count_bytes=count_bytes,
            )
            by_eps[key] = {"n_loop": n_loop, "eps": model.eps, "ce": result["ce"], "bpb": result["bpb"]}
            fresh += 1
        return by_eps[key]

    cells = {_cell_key(n_loop, mode): score(n_loop, eps) for n_loop in loop_counts for mode, eps in EPS_MODES.items()}
    trained = score(trained_loops, "frozen")
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cache_path, {"identity": identity, "scores": by_eps})
    runtime.say(
        f"eval-loops {arm} seed {seed}: N' in {', '.join(map(str, loop_counts))}, {len(cells)} cells and the "
        f"trained N = {trained_loops}: {fresh} rescored, the rest from the cache or equal to another cell"
    )
    return {"trained": trained, "run_val_ce": summary["val_ce"], "cells": cells}


def _arm_summary(arm_setting: dict, per_seed: dict, loop_counts) -> dict:
    """Mean +- population std over seeds of every cell (and of the trained model's own CE)."""
    trained = mean_std([scores["trained"]["ce"] for scores in per_seed.values()])
    cells = []
    for n_loop in loop_counts:
        for mode in EPS_MODES:
            values = {seed: scores["cells"][_cell_key(n_loop, mode)] for seed, scores in per_seed.items()}
            ce_mean, ce_std = mean_std([v["ce"] for v in values.values()])
            bpb_mean, _ = mean_std([v["bpb"] for v in values.values()])
            cells.append(
                {
                    "n_loop": n_loop,
                    "eps_mode": mode,
                    "eps": next(iter(values.values()))["eps"],
                    "ce_mean": ce_mean,
                    "ce_std": ce_std,
                    "bpb_mean": bpb_mean,
                    "n_seeds": len(values),
                    "per_seed": {seed: v["ce"] for seed, v in values.items()},
                }
            )
    return {
        "applicable": True,
        "n_loop": arm_setting["n_loop"],
        "eps": arm_setting["eps"],
        "eps_trained": next(iter(per_seed.values()))["trained"]["eps"],
        "trained_ce_mean": trained[0],
        "trained_ce_std": trained[1],
        "trained_per_seed": {seed: scores["trained"]["ce"] for seed, scores in per_seed.items()},
        "run_val_ce_per_seed": {seed: scores["run_val_ce"] for seed, scores in per_seed.items()},
        "cells": cells,
    }
