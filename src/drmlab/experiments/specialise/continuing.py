"""Whether a specialisation saved in a run folder may be continued by the command given now (docs/mqar.md
section 9): the saved ``specialise.json``'s settings against today's, with the settings added since it was
written at their defaults, the advised fixes allowed after a non-finite stop, and for a setting that a
command of before now turns on, the way to continue the run as it ran."""

from __future__ import annotations

import dataclasses

from drmlab.experiments.specialise.curriculum import Settings

RESULT_FILE = "specialise.json"
# settings that may change when continuing a run stopped by a non-finite value (the advised fix)
FIXES_AFTER_NON_FINITE = ("backbone_lr", "memory_lr")
# a setting added later that a command of before now turns on: how to continue such a run as it ran
LATER_SETTINGS = {
    "settings.bf16_memory_products: False in the run, True now": " (--fast now includes the memory's products in bf16, docs/drm.md A.4.7; "
    "--bf16 without --fast continues the run as it ran)",
}


def with_new_defaults(saved_spec: dict) -> dict:
    """A saved spec with the settings added since it was written at their defaults (a run from before
    the interleaved recipe is a distill run)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Settings) if f.default is not dataclasses.MISSING}
    settings = saved_spec.get("settings")
    if not isinstance(settings, dict):
        return saved_spec
    return dict(saved_spec, settings={**{k: v for k, v in defaults.items() if k not in settings}, **settings})


def differences(saved, now, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ, with both values."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(saved) | set(now)):
            out += differences(saved.get(key), now.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == now else [f"{prefix[:-1]}: {saved!r} in the run, {now!r} now"]


def why_not_continue(run, saved: dict | None, summary: dict | None, spec: dict) -> str | None:
    """What the run folder ``run`` (a :class:`~drmlab.runs.RunDir`) holds that the command of ``spec`` may
    not continue, in words for "already holds ..." (another run, a finished specialisation, other settings
    with at most four of them named); None where it may continue. ``saved`` is its specialise.json, ``summary``
    its summary.json (None where missing)."""
    if saved is None or "spec" not in saved:
        return run.describe() if run.holds_run() else f"a {RESULT_FILE} without its run"
    if summary and summary.get("finished"):
        return f"a finished specialisation (step {summary.get('steps')})"
    changed = differences(with_new_defaults(saved["spec"]), spec)
    if summary and summary.get("stopped") == "non-finite":
        changed = [d for d in changed if d.split(":")[0].rsplit(".", 1)[-1] not in FIXES_AFTER_NON_FINITE]
    if changed:
        hint = "".join(h for d, h in LATER_SETTINGS.items() if d in changed)
        return "a specialisation under other settings (" + "; ".join(changed[:4]) + ")" + hint
    return None
