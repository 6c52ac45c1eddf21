"""The loop study (docs/looped.md section 4): looped arms with paired seeds, eps = 1/N against eps = 1.

The arms of the looped-residual study (``build_model("LOOPED", arm=...)``, docs/looped.md section 3)
are trained through exactly the ablation protocol of :mod:`drmlab.experiments.ablate`: same trainer,
same batches per seed, deterministic rescoring, mean +- std, per-seed pairs and the promotion gate;
each arm is a label of the study (run folders ``OUT/runs/ARM-seedS``). On top of the ablation's
report, :mod:`drmlab.experiments.loop_study_report` writes ``loop.md`` (each arm's stored blocks L,
loop count N, schedule, eps rule and validation CE) and ``loss_vs_n.png``.

Python: ``run_study(arms, seeds, out=..., preset=..., tokens=..., train=..., data=...)``.
"""

from __future__ import annotations

from pathlib import Path

from drmlab.experiments import ablate, loop_study_report

DEFAULT_ARMS = ("A", "B", "C", "I12u", "I12")
DEFAULT_TOKENS = 1_000_000


def plan_study(arms, seeds, preset: str = "tiny", *, tokens: int | str | None = None, train: dict | None = None,
               data: str | None = None, tokenizer: str = "bytes") -> ablate.Study:
    """The ablation study whose labels are LOOPED arms; every arm and setting is checked here."""
    arms = ablate.distinct_names(arms, "arms")
    return ablate.plan_study(arms, seeds, preset, tokens=DEFAULT_TOKENS if tokens is None else tokens, train=train,
                             model_settings={arm: {"arm": arm} for arm in arms}, data=data, tokenizer=tokenizer,
                             registry_names={arm: "LOOPED" for arm in arms})


def arm_settings(arm: str, preset: str) -> dict:
    """The arm's stored blocks, loop count, schedule, eps rule and mixer, and whether eps is scaled."""
    from drmlab.models.registry import config_fields

    c = config_fields("LOOPED", preset, arm=arm)
    eps = str(c["eps"])
    return {"n_stored": c["n_stored"], "n_loop": c["n_loop"], "schedule": c["schedule"], "eps": eps,
            "mixer": c["mixer"], "scaled": eps != "1.0" and c["eps"] != 1}


def run_study(arms=DEFAULT_ARMS, seeds=ablate.DEFAULT_SEEDS, *, out: str | Path, preset: str = "tiny",
              tokens: int | str | None = None, train: dict | None = None, data: str | None = None,
              tokenizer: str = "bytes", cache_dir: str | None = None, corpus=None, device="auto", quiet: bool = True,
              log=None) -> tuple[dict, str]:
    """Plan, run or resume, and report the loop study: (the ablation results, the loop table)."""
    study = plan_study(arms, seeds, preset, tokens=tokens, train=train, data=data, tokenizer=tokenizer)
    results = ablate.run_planned(study, out, corpus=corpus, cache_dir=cache_dir, device=device, quiet=quiet, log=log)
    settings = {arm: arm_settings(arm, preset) for arm in results["models"]}
    return results, loop_study_report.write_report(results, settings, out, log=log)
