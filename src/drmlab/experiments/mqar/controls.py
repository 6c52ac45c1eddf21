r"""Recall controls of the distance MQAR protocol (docs/mqar.md section 8.1): reads of the same
evaluation rows with one thing changed, each of which a model that truly binds keys to values must
fail (or, for ``queries_shuffled``, pass), while a leak or a shortcut would not.

* ``memory_read_off`` -- the fast-weight memory's correction is not added (z' = z), at every position;
* ``memory_write_off`` -- its write gate is 0 at every position: nothing enters the fast or slow matrix.
  Both switch :class:`~drmlab.models.drm.fast_weight.FastWeightMemory` at evaluation only
  (:func:`memory_switched`); a model without the memory is refused (the study reports it "n/a").
* ``pairs_unwritten`` -- the write gate is 0 at the 2P positions of the written pairs only: they are
  prefilled under ``memory_write_off`` and the rest is stepped with the memory as usual
  (:func:`read_pairs_unwritten`), so the memory is empty when the filler starts. Unlike the two above
  it leaves the memory's every other use in place; it costs a token-by-token read.
* ``keys_shuffled`` -- in each row the P written keys are permuted by a derangement sigma drawn from
  ``default_rng([eval_seed, 0, r, 3])``: written slot j holds key k_sigma(j) before the unchanged value
  v_j. Values, their positions, the filler and the whole query block (keys, order, targets) are
  unchanged; only which key precedes each written value differs. A queried key is now bound to another
  slot's value, equal to its target only where two independent values coincide (1/64 on average;
  :func:`control_tokens` returns these "bound" values, so a binder's hits on them are counted too).
* ``queries_shuffled`` -- the P query triples (marker, key, value) are permuted by a derangement tau
  from ``default_rng([eval_seed, 0, r, 4])``: the same questions with their correct answers, every
  one asked at another slot. A recaller keeps its accuracy.

No-binding levels (section 3 with P pairs of 64 values; at the default 8 pairs): 35.00% over all
queries (a random value among those not yet queried) and 13.87% on the first query (a random value of
the context, nothing to eliminate); :func:`binding_levels` gives them at any pair count. P is the
task's pair count, an argument ``pairs`` of every function here (default 8, docs/mqar.md 8.2).
A control that must fall "falls" at a length when the Wilson 95% lower bound of its all-query and of
its first-query accuracy are both at or below these levels (:func:`control_verdicts`). The two shuffles
need at least 2 pairs (a derangement of one slot does not exist).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn as nn

from drmlab.experiments.mqar.distance_task import CHANCE, PAIRS, check_pairs, context_guess, elimination_guess
from drmlab.naming import suggest

MEMORY_CONTROLS = ("memory_read_off", "memory_write_off", "pairs_unwritten")
CONTROLS = (*MEMORY_CONTROLS, "keys_shuffled", "queries_shuffled")
KEEPS_ACCURACY = ("queries_shuffled",)  # must keep the plain read's accuracy; every other control must fall
STREAM = {"keys_shuffled": 3, "queries_shuffled": 4}  # the last word of the row's seed list
NO_MEMORY = "no fast-weight memory"
SHUFFLES_NEED = 2  # pairs: a derangement of fewer slots does not exist


def parse_controls(names) -> list[str]:
    """The controls named (a comma-separated string or a list), checked: known and each once."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = [str(n) for n in names or ()]
    for name in names:
        if name not in CONTROLS:
            raise ValueError(f"unknown control {name!r}{suggest(name, CONTROLS)}; known: {', '.join(CONTROLS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"controls: a control is named twice ({', '.join(names)})")
    return names


def memory_modules(model: nn.Module) -> list[nn.Module]:
    from drmlab.models.drm.fast_weight import FastWeightMemory

    return [m for m in model.modules() if isinstance(m, FastWeightMemory)]


def applies(control: str, model: nn.Module) -> str | None:
    """None when ``control`` can be read on ``model``; else why not (a memory control without a memory)."""
    if control in MEMORY_CONTROLS and not memory_modules(model):
        return NO_MEMORY
    return None


def _require_memory(model: nn.Module, control: str) -> list[nn.Module]:
    modules = memory_modules(model)
    if not modules:
        name = getattr(model, "model_name", type(model).__name__)
        raise ValueError(f"control {control}: {name} has {NO_MEMORY} to switch off")
    if model.training:
        raise ValueError(f"control {control}: an evaluation control; put the model in eval mode")
    return modules


@contextlib.contextmanager
def memory_switched(model: nn.Module, control: str | None):
    """Within the block, the memory control ``control`` is on in every fast-weight memory of ``model``
    (in eval mode); restored on leaving, also after an error. Any other control (or None) switches nothing."""
    if control not in ("memory_read_off", "memory_write_off"):
        if control == "pairs_unwritten":
            _require_memory(model, control)
        yield
        return
    modules = _require_memory(model, control)
    attribute = "read_off" if control == "memory_read_off" else "write_off"
    try:
        for m in modules:
            setattr(m, attribute, True)
        yield
    finally:
        for m in modules:
            setattr(m, attribute, False)


@torch.no_grad()
def read_pairs_unwritten(
    model: nn.Module, inputs: torch.Tensor, positions, pairs: int = PAIRS
) -> tuple[torch.Tensor, object]:
    """(logits [B, len(positions), vocab] at the input ``positions``, the decoding state after the last
    input) with nothing written into the memory at the 2 x ``pairs`` positions of the pairs: those
    prefilled under ``memory_write_off``, every later input stepped with ``model.step`` as usual."""
    written = 2 * check_pairs(pairs)
    wanted = {int(p) for p in positions}
    if min(wanted) < written:
        raise ValueError(f"pairs_unwritten scores positions after the {written} written tokens only")
    with memory_switched(model, "memory_write_off"):
        state = model(inputs[:, :written].long(), return_state=True).state
    kept = {}
    for t in range(written, inputs.shape[1]):
        logits, state = model.step(inputs[:, t].long(), state)
        if t in wanted:
            kept[t] = logits
    return torch.stack([kept[int(p)] for p in positions], dim=1), state


def derangement(rng: np.random.Generator, n: int = PAIRS) -> np.ndarray:
    """A uniform random permutation of range(n) without a fixed point (rejection: e^-1 accepted per draw);
    n >= 2."""
    if n < SHUFFLES_NEED:
        raise ValueError(f"a derangement of {n} slot(s) does not exist: the shuffle controls need >= 2 pairs")
    while True:
        order = rng.permutation(n)
        if not np.any(order == np.arange(n)):
            return order


def control_tokens(
    control: str, tokens: torch.Tensor, eval_seed: int, rows, pairs: int = PAIRS
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the examples ``tokens`` [n, L] of evaluation ``rows`` (of ``pairs`` pairs) as ``control`` reads
    them, and for ``keys_shuffled`` the value each queried key is bound to in the written pairs [n,
    pairs], else None). The memory controls read the tokens unchanged."""
    if control in MEMORY_CONTROLS:
        return tokens, None
    if control not in STREAM:
        raise ValueError(f"unknown control {control!r}; known: {', '.join(CONTROLS)}")
    out = tokens.clone()
    length = tokens.shape[1]
    query_start = length - 3 * pairs
    bound = torch.empty(tokens.shape[0], pairs, dtype=tokens.dtype) if control == "keys_shuffled" else None
    for i, r in enumerate(rows):
        order = torch.from_numpy(derangement(np.random.default_rng([eval_seed, 0, r, STREAM[control]]), pairs))
        if control == "keys_shuffled":
            keys, values = tokens[i, 0 : 2 * pairs : 2], tokens[i, 1 : 2 * pairs : 2]
            out[i, 0 : 2 * pairs : 2] = keys[order]  # slot j: key k_sigma(j), value v_j
            value_of = dict(zip(keys[order].tolist(), values.tolist()))
            bound[i] = torch.tensor([value_of[k] for k in tokens[i, query_start + 1 :: 3].tolist()])
        else:  # queries_shuffled: slot j asks the question of slot tau(j)
            triples = tokens[i, query_start:].view(pairs, 3)
            out[i, query_start:] = triples[order].reshape(-1)
    return out, bound


def binding_levels(pairs: int = PAIRS) -> dict:
    """The levels a model reaches without binding a key to its value (section 3, ``pairs`` pairs of 64 values)."""
    return {"chance": CHANCE, "all_queries": elimination_guess(pairs), "first_query": context_guess(pairs)}


def _overlap(a, b) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def length_verdict(control: str, plain: dict, record: dict, pairs: int = PAIRS) -> str | None:
    """Why ``record`` (a read control) does not behave as a recaller's would at its length, or None.
    A falling control: the Wilson lower bounds of its all- and first-query accuracies above the
    no-binding levels; ``queries_shuffled``: its interval disjoint from the plain read's."""
    if control in KEEPS_ACCURACY:
        if plain.get("status") == "read" and not _overlap(record["ci95"], plain["ci95"]):
            return f"{100 * record['acc']:.2f}% against the plain {100 * plain['acc']:.2f}% (intervals disjoint)"
        return None
    levels = binding_levels(pairs)
    above = []
    if record["ci95"][0] > levels["all_queries"]:
        above.append(f"all queries {100 * record['ci95'][0]:.2f}% > {100 * levels['all_queries']:.2f}%")
    if record["first_ci95"][0] > levels["first_query"]:
        above.append(f"first query {100 * record['first_ci95'][0]:.2f}% > {100 * levels['first_query']:.2f}%")
    return "lower bound " + ", ".join(above) if above else None


def recalls(plain: dict, pairs: int = PAIRS) -> bool:
    """Whether a plain read is above the no-binding levels (a Wilson lower bound above either): only
    there can a control's fall rule anything out."""
    levels = binding_levels(pairs)
    return plain["ci95"][0] > levels["all_queries"] or plain["first_ci95"][0] > levels["first_query"]


def control_verdicts(lengths: dict, controls, pairs: int = PAIRS) -> dict:
    """Per control: ``verdict`` ("falls" / "keeps" at every length read, "does not fall" / "does not keep"
    with ``reasons`` per length, "n/a (why)", or "not read"; a fall where no plain read was above the
    no-binding levels is "falls (uninformative: ...)"), from the per-length records (``{length:
    record}``, each with its ``controls``)."""
    out = {}
    for control in controls:
        reasons, read, why, informative = {}, 0, None, 0
        for length, plain in sorted(lengths.items(), key=lambda kv: int(kv[0])):
            record = (plain.get("controls") or {}).get(control)
            if record is None:
                continue
            if record.get("status") == "n/a" and record.get("why") == NO_MEMORY:
                why = NO_MEMORY
            if record.get("status") != "read":
                continue
            read += 1
            informative += recalls(plain, pairs)
            reason = length_verdict(control, plain, record, pairs)
            if reason:
                reasons[str(length)] = reason
        keeps = control in KEEPS_ACCURACY
        if why is not None:
            verdict = f"n/a ({why})"
        elif not read:
            verdict = "not read"
        elif reasons:
            verdict = "does not keep" if keeps else "does not fall"
        elif keeps:
            verdict = "keeps"
        else:
            verdict = "falls" if informative else "falls (uninformative: no plain read above the no-binding levels)"
        out[control] = {"verdict": verdict, "lengths_read": read, "lengths_recalled": informative, "reasons": reasons}
    return out
