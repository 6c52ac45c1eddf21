"""The resume checks: a run resumes only under its own data, tokenizer, model and schedule-defining settings.

:func:`check_resumable` compares the run's config.json with the one a resume would write and refuses,
listing each difference; :data:`RESUMABLE_CHANGES` may change, and a run stopped by the non-finite or
the divergence guard may also take the fixes in :data:`FIXES_AFTER_NON_FINITE`; each allowed change is
recorded in a ``resume`` row of metrics.jsonl. Another device or thread count (:data:`RUNTIME_BITS`) is
allowed with a one-line note (:func:`runtime_drift_note`): the float rounding, and so the last bits, differ.
"""

from __future__ import annotations

import dataclasses
import sys

from drmlab.runs import jsonable
from drmlab.training import distributed as dist_utils
from drmlab.training.config import TRAIN_DEFAULTS

# Train settings that may differ when resuming: they change neither the batches nor the updates
# (``tokens`` -- or ``steps``, which sets it -- only under the constant schedule, where it does not shape the
# learning rate; ``compile`` only the order of rounding, as another device or thread count does).
RESUMABLE_CHANGES = (
    "tokens",
    "steps",
    "eval_every",
    "eval_windows",
    "eval_tokens",
    "eval_batch_size",
    "checkpoint_every",
    "divergence_nats",
    "divergence_steps",
    "compile",
    "milestones",
)
# Runtime entries of config.json that a resume may change, though they change the float rounding.
RUNTIME_BITS = ("device", "threads")
# ... and after a stop by the non-finite guard or the divergence guard, the advised fixes too.
FIXES_AFTER_NON_FINITE = ("lr", "warmup_fraction", "grad_clip")
# Data provenance that must not change on resume (entries of config.json).
DATA_IDENTITY = ("tokenizer", "vocab_size")


def config_defaults(model) -> dict:
    """{field: default} of ``model.config``'s dataclass (empty for a model without one)."""
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return {}
    defaults = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return jsonable(defaults)


_ABSENT = object()


def _model_config_problems(saved: dict | None, fresh: dict | None, defaults: dict) -> list[str]:
    """The model-config fields that differ, one entry each. A field the run's config.json lacks (it was
    written before the field existed) counts as its default: at the default it changes nothing."""
    if not isinstance(saved, dict) or not isinstance(fresh, dict):
        return [] if saved == fresh else [f"model_config: {saved!r} in the run, {fresh!r} now"]
    problems = []
    for key in sorted(set(saved) | set(fresh)):
        before, now = saved.get(key, _ABSENT), fresh.get(key, _ABSENT)
        if before is _ABSENT and now == defaults.get(key, _ABSENT):
            continue
        if before != now:
            show = ["(absent)" if v is _ABSENT else repr(v) for v in (before, now)]
            problems.append(f"model_config.{key}: {show[0]} in the run, {show[1]} now")
    return problems


def check_resumable(
    saved: dict, fresh: dict, *, after_non_finite: bool = False, model_defaults: dict | None = None
) -> dict:
    """Refuse to resume a run under other data, model or schedule-defining settings, listing each
    difference; return the allowed changes ``{key: [before, now]}``. ``model_defaults``
    (:func:`config_defaults`): a model-config field newer than the run is accepted at its default."""
    problems, changed = [], {}
    for key in ("model", "preset", "overrides") + DATA_IDENTITY:
        if saved.get(key) != fresh.get(key):
            problems.append(f"{key}: {saved.get(key)!r} in the run, {fresh.get(key)!r} now")
    problems += _model_config_problems(saved.get("model_config"), fresh.get("model_config"), model_defaults or {})
    saved_hash = (saved.get("data") or {}).get("content_sha256")
    fresh_hash = (fresh.get("data") or {}).get("content_sha256")
    if saved_hash != fresh_hash:
        problems.append(f"training data: content sha256 {saved_hash} in the run, {fresh_hash} now")
    allowed = RESUMABLE_CHANGES + (FIXES_AFTER_NON_FINITE if after_non_finite else ())
    saved_train = saved.get("train", {})
    for key, value in fresh["train"].items():
        before = saved_train.get(key, TRAIN_DEFAULTS.get(key))
        if before == value:
            continue
        if key == "tokens" and fresh["train"].get("schedule") == "cosine":
            problems.append(
                f"tokens: {before!r} in the run, {value!r} now (under the cosine schedule the budget "
                "shapes the learning rate)"
            )
        elif key in allowed:
            changed[key] = [before, value]
        else:
            problems.append(f"{key}: {before!r} in the run, {value!r} now")
    if problems:
        raise ValueError("cannot resume: the settings differ from the run's config.json: " + "; ".join(problems))
    saved_runtime, fresh_runtime = saved.get("runtime") or {}, fresh.get("runtime") or {}
    for key in RUNTIME_BITS:  # allowed, but an uninterrupted run would have given other last bits
        if key in saved_runtime and saved_runtime[key] != fresh_runtime.get(key):
            changed[key] = [saved_runtime[key], fresh_runtime.get(key)]
    return changed


def runtime_drift_note(changed: dict) -> str | None:
    """One line when a resume runs on another device or thread count than the run's config.json records:
    allowed, but the float rounding differs, so the numbers part from an uninterrupted run's in their
    last bits (exact continuation needs the same device and --threads)."""
    drift = [f"{key} {now} (the run had {before})" for key, (before, now) in changed.items() if key in RUNTIME_BITS]
    if not drift:
        return None
    return (
        f"drmlab: resuming with {', '.join(drift)}: the run continues, but its numbers will differ in the last "
        "bits from an uninterrupted run's; resume with the same device and --threads for an exact continuation"
    )


class Resuming:
    """Resuming a run, as a method of :class:`~drmlab.training.trainer.Trainer`."""

    def _resume(self) -> tuple[dict, str | None]:
        """Check the run's config.json (:func:`check_resumable`), reload the checkpoint into the model and the
        optimizer, and cut metrics.jsonl back to it; return (the allowed changes, the note on lost rows or None)."""
        run, main = self.run, self.main
        changed: dict = {}
        lost_rows = None
        if not run.has_checkpoint():
            raise FileNotFoundError(f"nothing to resume in {run.path}: no checkpoint")
        if run.has_config():
            try:
                summary = run.read_summary() or {}
            except ValueError as exc:  # an output, rewritten at the end; only the last stop's kind is read
                print(f"note: {exc}; resuming as after an ordinary stop (it is written again)", file=sys.stderr)
                summary = {}
            saved = run.read_config()
            self.saved_runtime = saved.get("runtime") or {}  # what the run chose at its start (``compile``)
            changed = check_resumable(
                saved,
                self.config,
                after_non_finite=summary.get("stopped") in ("non-finite", "diverged"),
                model_defaults=config_defaults(self.model),
            )
            note = runtime_drift_note(changed)
            if note:
                print(note, file=sys.stderr)
        state = (
            dist_utils.load_sharded_checkpoint(run, self.model, self.optimizer)
            if self.sharded
            else run.load_checkpoint(self.model, self.optimizer)
        )
        self.start_step = self.last_ckpt_step = int(state["step"])
        self.elapsed_before = float(state.get("elapsed", 0.0))
        self.train_seconds_before = float(state.get("train_seconds", 0.0))
        self.paused_seconds_before = float(state.get("paused_seconds", 0.0))
        if main:
            lost_rows = run.truncate_metrics(self.start_step, state.get("metrics"))
            if lost_rows:  # resumable (the checkpoint holds the state), but the record has a hole: say so
                print(f"note: {lost_rows}", file=sys.stderr)
            run.summary_path.unlink(missing_ok=True)
        return changed, lost_rows
