r"""The distance MQAR protocol (docs/mqar.md section 8; the upstream project's recall-over-distance
test): train on a 40-token recall task, then ask for the same eight associations after L - 40 tokens
of filler, for L up to 32,768, reading long sequences at constant memory.

**Task** (:func:`draw_example`, :func:`split_tokens`). Vocabulary 256: the query marker is token 1,
the keys 2..33 (32), the values 34..97 (64), the filler 98..255. An example of L tokens is

    k1 v1 ... k8 v8  |  L - 40 filler tokens  |  1 k_pi(1) v_pi(1)  ...  1 k_pi(8) v_pi(8)

with 8 distinct keys, 8 values drawn independently (repeats allowed), filler drawn uniformly and pi a
random permutation. The model reads tokens[:-1] and is scored on the 8 positions whose next token is
a queried value (the key right after each marker); accuracy is the argmax over all 256 logits
against that value (chance 1/64). L = 40 is the short control, without filler.

**Random draws.** A training batch of step k, micro-batch m, comes from ``default_rng([seed, k, m])``
(steps count from 1), a fresh batch every step. Evaluation row r draws its keys, values and
permutation from ``default_rng([eval_seed, 0, r, 1])`` and its filler from ``default_rng([eval_seed,
0, r, 2])``: the same row carries the same associations at every length and only its filler differs,
so two lengths compare the same questions asked at two distances. (numpy pads a seed list with zeros,
so ``[a, b, c]`` and ``[a, b, c, 0]`` are one stream; a last word of 1 or 2 keeps the evaluation
streams apart from every three-word training stream, whatever its step.)

**Reading** (:func:`read_scored`). A sequence of at most ``chunk`` input tokens is one parallel
forward. A longer one runs its first ``chunk`` tokens through ``model(tokens, return_state=True)``
(the prefill of :mod:`drmlab.generation`) and then steps the rest one token at a time with
``model.step``, carrying the decoding state and keeping only the logits of the scored positions, so
memory does not grow with L for a model whose state does not. A model with a learned position table,
or whose decoding state grows with every token (a key/value cache), is read only up to its context:
longer lengths are reported "n/a (context N)" (:func:`context_limit`).

**Statistics and gates.** Each length reports correct / total over ``n_eval`` sequences x 8 targets
with a Wilson 95% interval (:func:`wilson_interval`). Gates (:func:`gate_verdicts`): the control
passes at >= 80%, and only a passed control authorises the long reads; each longer length passes at
>= 80%; the decoding state at the longest length read is at most 1.1 x the state at the length
before it. Without ``read_all`` the long lengths of a model whose control failed are not read.

**Training** (:class:`DistanceStudy`): the 40-token control through the ordinary trainer, AdamW with
weight decay 0.01 on every tensor, constant learning rate, clip 1.0, fresh batches; at each milestone
the run stops with a checkpoint, the control accuracy is measured and the run resumes. Each run's
files and ``result.json`` sit in ``OUT/runs/<model>_s<seed>/``; a finished milestone or length whose
settings match is reused, so a rerun skips what is done. A run directory from elsewhere (``ckpts``)
is evaluated through the same reads, its results in ``OUT/evals/<name>/result.json``. The report is
:mod:`drmlab.experiments.mqar.distance_report`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from drmlab.experiments.mqar import distance_report
from drmlab.experiments.mqar.models import ANCHOR_ARMS, POSITION_FIELDS, width_overrides
from drmlab.experiments.mqar.task import probe_train_config
from drmlab.experiments.spec import Runtime, Spec
from drmlab.naming import suggest
from drmlab.runs import jsonable
from drmlab.training.batches import BatchSource
from drmlab.training.run_info import RunInfo

VOCAB_SIZE = 256
MARKER = 1
FIRST_KEY, N_KEYS = 2, 32
FIRST_VALUE, N_VALUES = 34, 64
FIRST_FILLER = 98
PAIRS = 8
CONTROL_LENGTH = 2 * PAIRS + 3 * PAIRS  # 40: the pairs and the queries, no filler
IGNORE = BatchSource.IGNORE_INDEX
CHANCE = 1.0 / N_VALUES
GATE_THRESHOLD = 0.8
STATE_GROWTH_LIMIT = 1.1
WILSON_Z = 1.959963984540054  # the 97.5% normal quantile
# Levels reached without binding a key to its value (docs/mqar.md section 3, with 8 pairs of 64 values):
# a random one of the 8 values in the context, and the same among the values not yet queried.
CONTEXT_GUESS = (1 + (PAIRS - 1) / N_VALUES) / PAIRS
ELIMINATION_GUESS = sum((1 + (r - 1) / N_VALUES) / r for r in range(1, PAIRS + 1)) / PAIRS

DEFAULT_MODELS = ("J_NO_DIRECTION", "SSM_CONTROL")
DEFAULT_SEEDS = (1234,)
DEFAULT_LENGTHS = (40, 512, 4096, 32768)
DEFAULT_STEPS = 2000
DEFAULT_MILESTONES = (250, 500, 1000, 2000)
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 1e-3
DEFAULT_N_EVAL = 512  # x 8 targets = 4,096 per length, as the notes
DEFAULT_EVAL_BATCH = 128
DEFAULT_EVAL_SEED = 0
DEFAULT_CHUNK = 512


# ---------------------------------------------------------------------------------- the task
def check_length(length) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < CONTROL_LENGTH:
        raise ValueError(
            f"a distance MQAR length must be an integer >= {CONTROL_LENGTH} (the pairs and the queries), got {length!r}"
        )
    return length


def draw_example(pairs_rng: np.random.Generator, filler_rng: np.random.Generator, length: int) -> np.ndarray:
    """One example of ``length`` tokens (int64): keys, values and permutation from ``pairs_rng``, in
    that order, then the filler from ``filler_rng`` (they may be the same generator)."""
    keys = pairs_rng.choice(np.arange(FIRST_KEY, FIRST_KEY + N_KEYS), size=PAIRS, replace=False)
    values = pairs_rng.integers(FIRST_VALUE, FIRST_VALUE + N_VALUES, size=PAIRS)
    order = pairs_rng.permutation(PAIRS)
    filler = filler_rng.integers(FIRST_FILLER, VOCAB_SIZE, size=length - CONTROL_LENGTH)
    queries = np.stack([np.full(PAIRS, MARKER), keys[order], values[order]], axis=1).reshape(-1)
    return np.concatenate([np.stack([keys, values], axis=1).reshape(-1), filler, queries]).astype(np.int64)


def scored_positions(length: int) -> np.ndarray:
    """The 8 input positions (of tokens[:-1]) whose next token is a queried value: each query's key."""
    return length - 3 * PAIRS + 3 * np.arange(PAIRS) + 1


def split_tokens(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Examples [n, L] -> (inputs tokens[:, :-1], targets): the next token at the scored positions,
    :data:`IGNORE` everywhere else."""
    inputs = tokens[:, :-1]
    targets = torch.full_like(inputs, IGNORE)
    cols = torch.from_numpy(scored_positions(tokens.shape[1]))
    targets[:, cols] = tokens[:, cols + 1]
    return inputs, targets


def training_tokens(seed: int, step: int, micro: int, batch_size: int, length: int = CONTROL_LENGTH) -> torch.Tensor:
    """The examples of one training micro-batch, all from ``default_rng([seed, step, micro])``."""
    rng = np.random.default_rng([seed, step, micro])
    return torch.from_numpy(np.stack([draw_example(rng, rng, length) for _ in range(batch_size)]))


def evaluation_tokens(eval_seed: int, length: int, rows: range) -> torch.Tensor:
    """Evaluation examples ``rows`` at ``length``; row r's associations are the same at every length."""
    check_length(length)
    return torch.from_numpy(
        np.stack(
            [
                draw_example(
                    np.random.default_rng([eval_seed, 0, r, 1]), np.random.default_rng([eval_seed, 0, r, 2]), length
                )
                for r in rows
            ]
        )
    )


class DistanceBatches(BatchSource):
    """Fresh training batches of ``length``-token examples (:func:`training_tokens`), scored on the queries."""

    def __init__(self, batch_size: int, length: int = CONTROL_LENGTH):
        self.batch_size, self.length = batch_size, check_length(length)

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_tokens(training_tokens(seed, step, micro, self.batch_size, self.length))


# ---------------------------------------------------------------------------------- statistics
def wilson_interval(correct: int, total: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion correct/total:
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    if total <= 0 or not 0 <= correct <= total:
        raise ValueError(f"a Wilson interval needs 0 <= correct <= total and total > 0, got {correct}/{total}")
    p, n, z2 = correct / total, total, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if correct == 0 else max(0.0, centre - half)  # exact at the ends, where rounding would leave 1e-18
    return low, 1.0 if correct == total else min(1.0, centre + half)


def gate_verdicts(lengths: dict, threshold: float = GATE_THRESHOLD, control: int = CONTROL_LENGTH) -> dict:
    """The protocol's verdicts from per-length records (``{length: record}``; a record has ``status``
    "read" with ``acc`` and ``state_bytes``, "n/a" with ``context``, or "not read").

    ``control``: pass at acc >= threshold; it authorises the long reads. ``lengths``: per longer length
    "pass" / "fail" (acc against threshold), "not authorised" (the control failed or is missing),
    "n/a (context N)" or "not read". ``state``: the decoding state of the longest length read against
    the length read before it (<= 1.1 x), when two longer lengths were read. ``passed``: every verdict
    passes; ``reasons`` says why not.
    """
    records = {int(k): v for k, v in lengths.items()}
    reasons: list[str] = []
    rec = records.get(control)
    control_pass = bool(rec and rec.get("status") == "read" and rec["acc"] >= threshold)
    if rec is None or rec.get("status") != "read":
        reasons.append(f"the {control}-token control was not read")
    elif not control_pass:
        reasons.append(f"control {100 * rec['acc']:.2f}% < {100 * threshold:.0f}%: the long reads are not authorised")
    verdicts: dict[str, str] = {}
    for length in sorted(k for k in records if k != control):
        r = records[length]
        if r.get("status") == "n/a":
            verdict = f"n/a (context {r['context']})"
        elif not control_pass:
            verdict = "not authorised"
        elif r.get("status") != "read":
            verdict = "not read"
        else:
            verdict = "pass" if r["acc"] >= threshold else "fail"
        verdicts[str(length)] = verdict
        if verdict != "pass" and control_pass:
            reasons.append(f"{length}: {verdict}" + (f" ({100 * r['acc']:.2f}%)" if verdict == "fail" else ""))
    read = [k for k in sorted(records) if k != control and records[k].get("status") == "read"]
    state = None
    if len(read) >= 2:
        shorter, longest = read[-2], read[-1]
        a, b = records[shorter]["state_bytes"], records[longest]["state_bytes"]
        state = {"lengths": [shorter, longest], "bytes": [a, b], "pass": b <= STATE_GROWTH_LIMIT * a}
        if not state["pass"]:
            reasons.append(f"the decoding state grew from {a:,} bytes at {shorter} to {b:,} at {longest}")
    return {
        "threshold": threshold,
        "control": {"length": control, "pass": control_pass},
        "lengths": verdicts,
        "state": state,
        "passed": not reasons,
        "reasons": reasons,
    }


# ---------------------------------------------------------------------------------- reading
def state_nbytes(state) -> int:
    """Bytes of every tensor in a decoding state (dataclasses, tuples, lists and dicts walked), without the
    fields a state type lists in ``CACHE_FIELDS`` (caches recomputable from the rest, such as the DRM
    fast step's block constants): the state a sequence must carry."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    derived = getattr(type(state), "CACHE_FIELDS", ())
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_nbytes(getattr(state, f.name)) for f in dataclasses.fields(state) if f.name not in derived)
    if derived and hasattr(state, "_fields"):  # a NamedTuple
        return sum(state_nbytes(getattr(state, name)) for name in state._fields if name not in derived)
    if isinstance(state, (tuple, list)):
        return sum(state_nbytes(s) for s in state)
    if isinstance(state, dict):
        return sum(state_nbytes(s) for s in state.values())
    return 0


@torch.no_grad()
def decode_state_grows(model: nn.Module, probe: int = 8) -> bool:
    """Whether the decoding state gets larger with every token (a key/value cache): steps ``probe``
    tokens at batch 1 and checks the state's bytes rise at each step after the first."""
    device = next(model.parameters()).device
    state = model.init_state(1)
    sizes = []
    for _ in range(probe):
        _, state = model.step(torch.full((1,), MARKER, dtype=torch.long, device=device), state)
        sizes.append(state_nbytes(state))
    return all(b > a for a, b in zip(sizes[1:], sizes[2:]))


def context_limit(model: nn.Module) -> int | None:
    """The most input tokens the model can read, or None for no limit: the rows of a learned position
    table (``has_position_limit``: n_positions or max_seq_len), or the training window max_seq_len of a
    model whose decoding state grows with every token; None for a constant-size state."""
    config = getattr(model, "config", None)
    if getattr(model, "has_position_limit", False):
        return int(getattr(config, "n_positions", None) or config.max_seq_len)
    was_training = model.training
    model.eval()
    try:
        grows = decode_state_grows(model)
    finally:
        model.train(was_training)
    if grows:
        window = getattr(config, "max_seq_len", None) or getattr(config, "n_positions", None)
        if not isinstance(window, int):
            raise ValueError(
                f"{getattr(model, 'model_name', type(model).__name__)}'s decoding state grows with "
                "every token and its config names no window (max_seq_len)"
            )
        return window
    return None


@torch.no_grad()
def read_scored(model: nn.Module, inputs: torch.Tensor, positions, chunk: int) -> tuple[torch.Tensor, object]:
    """(logits [B, len(positions), vocab] at the input ``positions``, the decoding state after the last
    input): one forward with ``return_state=True`` when the inputs have at most ``chunk`` tokens;
    otherwise the first ``chunk`` so, then ``model.step`` over the rest."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    positions = [int(p) for p in positions]
    length = inputs.shape[1]
    out = model(inputs[:, :chunk].long(), return_state=True)
    if length <= chunk:
        return out.logits[:, positions], out.state
    kept = {p: out.logits[:, p] for p in positions if p < chunk}
    state, wanted = out.state, set(positions)
    del out
    for t in range(chunk, length):
        logits, state = model.step(inputs[:, t].long(), state)
        if t in wanted:
            kept[t] = logits
    return torch.stack([kept[p] for p in positions], dim=1), state


@torch.no_grad()
def read_length(
    model: nn.Module,
    length: int,
    n_eval: int,
    *,
    eval_seed: int = DEFAULT_EVAL_SEED,
    eval_batch: int = DEFAULT_EVAL_BATCH,
    chunk: int = DEFAULT_CHUNK,
    context: int | None = None,
    control: str | None = None,
) -> dict:
    """Score ``n_eval`` evaluation examples of ``length``: correct, total, accuracy, its Wilson 95%
    interval, the same for the first query of each sequence (``first_*``), per-query accuracy, the
    decoding state's bytes per sequence, tokens/s, seconds (and peak CUDA memory). A length whose
    inputs exceed ``context`` is not read: ``status`` "n/a". ``control``: one of the recall controls
    of :mod:`drmlab.experiments.mqar.controls` (section 8.1) read instead of the plain examples; with
    ``keys_shuffled`` also the hits on the values the queried keys are now bound to (``bound_*``) and
    ``binder_level``, the share of targets equal to that bound value (a perfect binder's accuracy)."""
    from drmlab.experiments.mqar import controls

    check_length(length)
    record = {"length": length, "n_eval": n_eval, "eval_seed": eval_seed}
    if control is not None:
        record["control"] = controls.parse_controls([control])[0]
    if context is not None and length - 1 > context:
        return dict(record, status="n/a", context=context)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    positions = scored_positions(length)
    by_query = torch.zeros(PAIRS, dtype=torch.long)
    bound_hits = binder_hits = 0
    state_bytes = 0
    t0 = time.perf_counter()
    try:
        with controls.memory_switched(model, control):
            for start in range(0, n_eval, eval_batch):
                rows = range(start, min(start + eval_batch, n_eval))
                tokens, bound = evaluation_tokens(eval_seed, length, rows), None
                if control is not None:
                    tokens, bound = controls.control_tokens(control, tokens, eval_seed, rows)
                inputs, targets = split_tokens(tokens)
                if control == "pairs_unwritten":
                    logits, state = controls.read_pairs_unwritten(model, inputs.to(device), positions)
                else:
                    logits, state = read_scored(model, inputs.to(device), positions, chunk)
                pred = logits.argmax(dim=-1).cpu()
                by_query += (pred == targets[:, positions]).sum(0)
                if bound is not None:
                    bound_hits += int((pred == bound).sum())
                    binder_hits += int((bound == targets[:, positions]).sum())
                state_bytes = max(state_bytes, state_nbytes(state) // len(rows))
    finally:
        model.train(was_training)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    correct, total = int(by_query.sum()), n_eval * PAIRS
    first = int(by_query[0])
    record.update(
        status="read",
        correct=correct,
        total=total,
        acc=correct / total,
        ci95=list(wilson_interval(correct, total)),
        first_correct=first,
        first_total=n_eval,
        first_acc=first / n_eval,
        first_ci95=list(wilson_interval(first, n_eval)),
        by_query=(by_query.double() / n_eval).tolist(),
        state_bytes=state_bytes,
        mode=(
            "prefill 16 + steps"
            if control == "pairs_unwritten"
            else "parallel"
            if length - 1 <= chunk
            else f"prefill {chunk} + steps"
        ),
        chunk=chunk,
        seconds=seconds,
        tokens_per_s=n_eval * (length - 1) / seconds if seconds > 0 else None,
    )
    if control == "keys_shuffled":
        record.update(
            bound_correct=bound_hits,
            bound_acc=bound_hits / total,
            bound_ci95=list(wilson_interval(bound_hits, total)),
            binder_level=binder_hits / total,
        )
    if cuda:
        record["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return record


# ---------------------------------------------------------------------------------- the study
@dataclass(frozen=True)
class DistanceSpec(Spec):
    """A distance MQAR study as asked for: ``models`` (registered ``NAME`` or ``NAME:ARM``) x ``seeds``
    trained on the control and read at ``lengths``, and run directories ``ckpts`` read without training;
    ``milestones`` None: those of :data:`DEFAULT_MILESTONES` below ``steps``; ``settings``: TrainConfig or
    model-config fields for every run."""

    models: tuple = DEFAULT_MODELS
    seeds: tuple = DEFAULT_SEEDS
    lengths: tuple = DEFAULT_LENGTHS
    ckpts: tuple = ()
    preset: str = "tiny"
    width: int | None = None
    steps: int = DEFAULT_STEPS
    milestones: tuple | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: float = DEFAULT_LR
    n_eval: int = DEFAULT_N_EVAL
    eval_batch: int = DEFAULT_EVAL_BATCH
    eval_seed: int = DEFAULT_EVAL_SEED
    chunk: int = DEFAULT_CHUNK
    read_all: bool = False
    controls: tuple = ()
    settings: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class DistanceStudy:
    """A planned distance study (:func:`plan_study`): lengths and milestones complete, settings split."""

    models: list[str]
    seeds: list[int]
    lengths: list[int]
    ckpts: list[str] = dataclasses.field(default_factory=list)
    preset: str = "tiny"
    width: int | None = None
    steps: int = DEFAULT_STEPS
    milestones: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_MILESTONES))
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: float = DEFAULT_LR
    n_eval: int = DEFAULT_N_EVAL
    eval_batch: int = DEFAULT_EVAL_BATCH
    eval_seed: int = DEFAULT_EVAL_SEED
    chunk: int = DEFAULT_CHUNK
    read_all: bool = False
    controls: list[str] = dataclasses.field(default_factory=list)
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)

    def train_config(self, seed: int):
        return probe_train_config(
            batch_size=self.batch_size,
            seq_len=CONTROL_LENGTH - 1,
            seed=seed,
            lr=self.lr,
            steps=self.steps,
            overrides=self.train_overrides,
        )

    def eval_spec(self) -> dict:
        """What a length's result depends on besides the weights (the chunk changes only rounding)."""
        return {"n_eval": self.n_eval, "eval_seed": self.eval_seed}


def _positive_ints(values, what: str) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        raise ValueError(f"{what} must be a non-empty list of positive integers, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what} lists a value twice: {values!r}")
    return values


def resolve_model(name: str, preset: str, width: int | None, overrides: dict) -> tuple[str, dict]:
    """(registered name, overrides) of a registered ``NAME`` or ``NAME:ARM``: the width, then
    ``overrides``, then a position table at least as long as the 39 training inputs."""
    from drmlab.models.registry import config_fields, parse_model_spec

    if name in ANCHOR_ARMS:
        raise ValueError(
            f"{name} is an anchor arm of the fixed MQAR protocol (vocabulary 130, no decoding "
            "state); the distance protocol takes registered models (NAME or NAME:ARM)"
        )
    registry, kw = parse_model_spec(name)
    kw.update(width_overrides(config_fields(registry, preset, VOCAB_SIZE, **kw), width))
    kw.update(overrides)
    fields = config_fields(registry, preset, VOCAB_SIZE, **kw)
    for key in POSITION_FIELDS:
        if key in fields and key not in overrides and isinstance(fields[key], int) and fields[key] < CONTROL_LENGTH:
            kw[key] = CONTROL_LENGTH
    return registry, kw


def plan_study(spec: DistanceSpec) -> DistanceStudy:
    """Check every model, run directory, length and setting of ``spec`` and plan the study. The
    milestones (steps at which the control accuracy is measured) always end at ``steps``; the 40-token
    control is always among the lengths."""
    from drmlab.experiments.mqar import controls as recall_controls
    from drmlab.models import list_models
    from drmlab.models.registry import config_fields
    from drmlab.runs import RunDir
    from drmlab.training.config import split_overrides

    preset, width, steps, lr = spec.preset, spec.width, spec.steps, spec.lr
    models = [str(m).strip() for m in spec.models or ()]
    ckpts = [str(c) for c in spec.ckpts or ()]
    if not models and not ckpts:
        raise ValueError("give at least one model to train or one run directory to evaluate (--ckpt)")
    if any(not m for m in models):
        raise ValueError("models: no empty names")
    known = set(list_models())
    fields: set = set()
    for name in models:
        if name not in ANCHOR_ARMS and name.partition(":")[0] not in known:
            raise ValueError(f"unknown model {name!r}{suggest(name, known)}")
        registry, kw = resolve_model(name, preset, width, {})
        fields |= set(config_fields(registry, preset, VOCAB_SIZE, **kw))
    for path in ckpts:
        run = RunDir(path)
        if not run.has_config() or not run.has_checkpoint():
            raise FileNotFoundError(
                f"--ckpt {path}: not a drmlab run directory with a checkpoint (config.json and checkpoint.json)"
            )
    names = [Path(c).resolve().name for c in ckpts]
    if len(set(names)) != len(names):
        raise ValueError(f"--ckpt: two run directories share a name ({', '.join(names)}); their results would collide")
    seeds = list(spec.seeds)
    if (
        not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds!r}")
    lengths = sorted(set([CONTROL_LENGTH] + [check_length(L) for L in spec.lengths]))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if spec.milestones is None:  # the defaults below steps (none below 250), then steps itself
        milestones = sorted({m for m in DEFAULT_MILESTONES if m < steps} | {steps})
    else:
        milestones = sorted(set(_positive_ints(spec.milestones, "milestones")) | {steps})
    if milestones[-1] > steps:
        raise ValueError(f"milestone {milestones[-1]} is beyond the {steps} training steps")
    for what, value in (("n_eval", spec.n_eval), ("eval_batch", spec.eval_batch), ("chunk", spec.chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    controls = recall_controls.parse_controls(spec.controls)
    memory = [c for c in controls if c in recall_controls.MEMORY_CONTROLS]
    holders = [_has_memory(*resolve_model(name, preset, width, {}), preset) for name in models]
    holders += [_has_memory(c["model"], c.get("overrides") or {}, c["preset"]) for c in map(_ckpt_config, ckpts)]
    if memory and not any(holders):
        raise ValueError(
            f"--controls {','.join(memory)}: none of the study's models has a fast-weight memory "
            "(ASM_CM, or a DRM with fast_weight_memory=True)"
        )
    train_kw, model_kw = split_overrides(spec.settings, fields) if spec.settings else ({}, {})
    for key in ("tokens", "seq_len", "seed", "lr", "batch_size"):
        if key in train_kw:
            raise ValueError(
                f"the train setting {key!r} is the protocol's own (its steps, length, seeds, "
                "lr and batch size decide it)"
            )
    study = DistanceStudy(
        models=models,
        seeds=seeds,
        lengths=lengths,
        ckpts=ckpts,
        preset=preset,
        width=width,
        steps=steps,
        milestones=milestones,
        batch_size=spec.batch_size,
        lr=float(lr),
        n_eval=spec.n_eval,
        eval_batch=spec.eval_batch,
        eval_seed=spec.eval_seed,
        chunk=spec.chunk,
        read_all=spec.read_all,
        controls=controls,
        model_overrides=model_kw,
        train_overrides=train_kw,
    )
    for name in models:  # a bad model setting fails now, on the meta device
        registry, kw = resolve_model(name, preset, width, study.model_overrides)
        config_fields(registry, preset, VOCAB_SIZE, **kw)
    if models:
        study.train_config(seeds[0])  # validate early
    return study


def _has_memory(registry: str, overrides: dict, preset: str) -> bool:
    from drmlab.models.registry import config_fields

    return bool(config_fields(registry, preset, VOCAB_SIZE, **overrides).get("fast_weight_memory"))


def _ckpt_config(path: str) -> dict:
    from drmlab.runs import RunDir

    return RunDir(path).read_config()


def _write(path: Path, result: dict) -> None:
    from drmlab.runs import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, result)


def _read_lengths(study: DistanceStudy, runtime: Runtime, model: nn.Module, result: dict, path: Path) -> None:
    """Fill ``result["lengths"]`` with every length of ``study`` not yet read under its settings;
    the long ones only after a passed control unless ``read_all``; then each length read gets the
    study's recall controls (its ``controls``) not yet read there. Saves after each read."""
    lengths = result.setdefault("lengths", {})
    spec = study.eval_spec()
    for length in study.lengths:
        saved = lengths.get(str(length))
        if saved is None or saved.get("spec") != spec or saved.get("status") not in ("read", "n/a"):
            record = _read_one(study, runtime, model, result, length, None)
            if record is None:  # not authorised
                lengths[str(length)] = {
                    "length": length,
                    "status": "not read",
                    "spec": spec,
                    "why": "the control did not pass (read_all reads anyway)",
                }
                continue
            lengths[str(length)] = dict(record, spec=spec)
            _write(path, result)
        plain = lengths[str(length)]
        if plain.get("status") != "read":
            continue
        controls = plain.setdefault("controls", {})
        for control in study.controls:
            saved = controls.get(control)
            if saved is not None and saved.get("spec") == spec and saved.get("status") in ("read", "n/a"):
                continue
            controls[control] = dict(_read_one(study, runtime, model, result, length, control), spec=spec)
            _write(path, result)
    _write(path, result)


def _read_one(
    study: DistanceStudy, runtime: Runtime, model: nn.Module, result: dict, length: int, control: str | None
) -> dict | None:
    """One length read plain (``control`` None) or under a recall control, said in one line; None for
    a long plain length that the 40-token control did not authorise; a memory control on a model
    without the memory is "n/a" with the reason."""
    from drmlab.experiments.mqar import controls as recall_controls

    lengths = result["lengths"]
    if control is None and length != CONTROL_LENGTH and not study.read_all:
        rec = lengths.get(str(CONTROL_LENGTH)) or {}
        if not (rec.get("status") == "read" and rec["acc"] >= GATE_THRESHOLD):
            return None
    label = result["label"] + ("" if control is None else f" [{control}]")
    why = None if control is None else recall_controls.applies(control, model)
    if why is not None:
        runtime.say(f"mqar-distance {label} L={length}: n/a ({why})")
        return {
            "length": length,
            "n_eval": study.n_eval,
            "eval_seed": study.eval_seed,
            "control": control,
            "status": "n/a",
            "why": why,
        }
    if result.get("context", "unknown") == "unknown":
        result["context"] = context_limit(model)
    record = read_length(
        model,
        length,
        study.n_eval,
        eval_seed=study.eval_seed,
        eval_batch=study.eval_batch,
        chunk=study.chunk,
        context=result["context"],
        control=control,
    )
    if record["status"] == "read":
        lo, hi = record["ci95"]
        flo, fhi = record["first_ci95"]
        bound = ""
        if "bound_acc" in record:
            bound = f"; on the values now bound to the keys {100 * record['bound_acc']:.2f}%"
        runtime.say(
            f"mqar-distance {label} L={length}: {100 * record['acc']:.2f}% [{100 * lo:.2f}, "
            f"{100 * hi:.2f}] ({record['correct']}/{record['total']}), first query {100 * record['first_acc']:.2f}% "
            f"[{100 * flo:.2f}, {100 * fhi:.2f}]{bound}, state {record['state_bytes']:,} B/seq, "
            f"{record['seconds']:.1f} s"
        )
    else:
        runtime.say(f"mqar-distance {label} L={length}: n/a (context {record['context']})")
    return record


def train_one(study: DistanceStudy, runtime: Runtime, out: Path, name: str, seed: int) -> dict:
    """Train ``name`` with ``seed`` on the control (resuming at the last milestone done), measure the
    control at each milestone, then read every length; the run's result (also its ``result.json``)."""
    from drmlab.models import build_model
    from drmlab.models.registry import spec_path_name
    from drmlab.runs import RunDir
    from drmlab.training.trainer import train

    cfg = study.train_config(seed)
    registry, kw = resolve_model(name, study.preset, study.width, study.model_overrides)
    run_dir = out / "runs" / f"{spec_path_name(name)}_s{seed}"
    path = run_dir / "result.json"
    spec = jsonable(
        {
            "model": name,
            "registry_model": registry,
            "preset": study.preset,
            "overrides": kw,
            "train_length": CONTROL_LENGTH,
            "milestones": study.milestones,
            "train": dataclasses.asdict(cfg),
        }
    )
    result = json.loads(path.read_text()) if path.is_file() else None
    run = RunDir(run_dir)
    # The run directory continues only under the same settings (result.json is written before training).
    continue_run = result is not None and result.get("spec") == spec
    if not continue_run:
        result = {
            "label": f"{name} s{seed}",
            "kind": "trained",
            "model": name,
            "registry_model": registry,
            "seed": seed,
            "spec": spec,
            "milestones": [],
            "lengths": {},
        }
        _write(path, result)
    model = build_model(registry, preset=study.preset, vocab_size=VOCAB_SIZE, seed=seed, **kw)
    done = {m["step"] for m in result["milestones"]}
    batches = DistanceBatches(cfg.batch_size)
    trained_here = False
    for milestone in study.milestones:
        if milestone in done:
            continue
        resume = continue_run and run.has_checkpoint()
        continue_run = True
        summary = train(
            model,
            batches,
            None,
            cfg,
            run_dir,
            resume=resume,
            overwrite=not resume,
            run_info=RunInfo(
                name,
                study.preset,
                kw,
                registry_model=registry,
                study={"mqar_distance": {"train_length": CONTROL_LENGTH, "milestones": study.milestones}},
            ),
            device=runtime.device,
            quiet=runtime.quiet,
            stop_after_step=milestone,
            **({"tensorboard": True} if runtime.tensorboard else {}),
        )
        trained_here = True
        if summary["steps"] != milestone:
            raise RuntimeError(
                f"{run_dir}: training stopped at step {summary['steps']}, expected milestone {milestone}"
            )
        record = read_length(
            model,
            CONTROL_LENGTH,
            study.n_eval,
            eval_seed=study.eval_seed,
            eval_batch=study.eval_batch,
            chunk=study.chunk,
        )
        result["params"] = summary["params"]
        loss = summary["final_loss"]
        if loss is None:  # resumed at the milestone itself (stopped before result.json was written): the logged loss
            loss = next(
                (r["loss"] for r in run.read_metrics() if r.get("kind") == "train" and r["step"] == milestone), None
            )
        result["milestones"].append(
            {
                "step": milestone,
                "loss": loss,
                "train_seconds": summary["train_seconds"],
                **{k: record[k] for k in ("acc", "correct", "total", "ci95", "n_eval", "eval_seed")},
            }
        )
        # the weights changed: every length is read again; the control just was
        result["lengths"] = {str(CONTROL_LENGTH): dict(record, spec=study.eval_spec())}
        _write(path, result)
        lo, hi = record["ci95"]
        loss = "" if loss is None else f", loss {loss:.3f}"
        runtime.say(
            f"mqar-distance {result['label']} step {milestone}: control {100 * record['acc']:.2f}% "
            f"[{100 * lo:.2f}, {100 * hi:.2f}]{loss}"
        )
    if not trained_here:
        state = run.load_checkpoint(model, optimizer=None, restore_rng=False)
        if int(state["step"]) != study.steps:
            raise RuntimeError(
                f"{run_dir}: the checkpoint is at step {state['step']}, result.json says training "
                f"finished at {study.steps}; delete {path} to train again"
            )
    model.to(_device_of(runtime.device))
    result.setdefault("params", sum(p.numel() for p in model.parameters()))
    _read_lengths(study, runtime, model, result, path)
    return result


def _device_of(device) -> torch.device:
    from drmlab.devices import resolve_device

    return resolve_device(str(device) if isinstance(device, torch.device) else device)


def evaluate_ckpt(study: DistanceStudy, runtime: Runtime, out: Path, ckpt: str | Path) -> dict:
    """Read every length with the weights of the run directory ``ckpt`` (no training); its result,
    kept in ``OUT/evals/<name>/result.json`` and reused while the checkpoint is the same."""
    from drmlab.runs import RunDir

    run = RunDir(ckpt)
    pointer = run.read_pointer()
    model, config, state = run.load_model(_device_of(runtime.device))
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab != VOCAB_SIZE:
        raise ValueError(
            f"--ckpt {ckpt}: the model's vocabulary has {vocab} ids; the distance protocol's tokens "
            f"need exactly {VOCAB_SIZE}"
        )
    name = Path(ckpt).resolve().name
    path = out / "evals" / name / "result.json"
    spec = jsonable({"ckpt": str(Path(ckpt).resolve()), "checkpoint": pointer})
    result = json.loads(path.read_text()) if path.is_file() else None
    if result is None or result.get("spec") != spec:
        result = {
            "label": f"{name} (ckpt)",
            "kind": "ckpt",
            "model": config.get("model"),
            "seed": config.get("train", {}).get("seed"),
            "step": int(state["step"]),
            "spec": spec,
            "milestones": [],
            "lengths": {},
            "params": sum(p.numel() for p in model.parameters()),
        }
    _read_lengths(study, runtime, model, result, path)
    return result


def summarize(study: DistanceStudy, results: list[dict]) -> dict:
    """The study's numbers: their provenance (:func:`drmlab.experiments.results.provenance`), the protocol,
    then per trained run or evaluated checkpoint its milestones, per-length records and gate verdicts."""
    from drmlab.experiments.mqar import controls as recall_controls
    from drmlab.experiments.results import provenance

    def bare(record: dict) -> dict:
        out = {key: v for key, v in record.items() if key != "spec"}
        if "controls" in out:
            out["controls"] = {c: bare(rec) for c, rec in out["controls"].items()}
        return out

    entries = []
    for r in results:
        lengths = {k: bare(rec) for k, rec in r["lengths"].items()}
        entries.append(
            {
                key: r.get(key)
                for key in (
                    "label",
                    "kind",
                    "model",
                    "registry_model",
                    "seed",
                    "step",
                    "params",
                    "milestones",
                    "context",
                )
            }
            | {
                "lengths": lengths,
                "gates": gate_verdicts(lengths),
                "controls": recall_controls.control_verdicts(lengths, study.controls),
            }
        )
    protocol = jsonable(dataclasses.asdict(study)) | {
        "vocab_size": VOCAB_SIZE,
        "marker": MARKER,
        "keys": [FIRST_KEY, FIRST_KEY + N_KEYS - 1],
        "values": [FIRST_VALUE, FIRST_VALUE + N_VALUES - 1],
        "filler": [FIRST_FILLER, VOCAB_SIZE - 1],
        "pairs": PAIRS,
        "control_length": CONTROL_LENGTH,
        "chance": CHANCE,
        "context_guess": CONTEXT_GUESS,
        "elimination_guess": ELIMINATION_GUESS,
        "no_binding_levels": recall_controls.binding_levels(),
        "gate_threshold": GATE_THRESHOLD,
        "state_growth_limit": STATE_GROWTH_LIMIT,
    }
    return {"provenance": provenance(protocol), "protocol": protocol, "entries": entries}


def run_planned(study: DistanceStudy, runtime: Runtime, out: str | Path) -> dict:
    """Train (or reuse) every (model, seed), evaluate every checkpoint, then summarize and write
    results.json, results.md and results.png into ``out``; the summary."""
    runtime.apply_threads()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = [train_one(study, runtime, out, name, seed) for name in study.models for seed in study.seeds]
    results += [evaluate_ckpt(study, runtime, out, ckpt) for ckpt in study.ckpts]
    summary = summarize(study, results)
    distance_report.write_report(summary, out, log=runtime.log)
    return summary


def run_study(spec: DistanceSpec, runtime: Runtime, out: str | Path) -> dict:
    """Plan ``spec`` (:func:`plan_study`) and run the study (:func:`run_planned`); the summary."""
    return run_planned(plan_study(spec), runtime, out)
