r"""``drmlab mqar``: the multi-query associative-recall probe (notes/looped-study.md §8).

**Task** (:class:`MQARTask`, :func:`generate`). ``vocab_kv`` = 64 keys are the tokens 2..65, the
values 66..129, token 0 pads, 1 is unused: vocabulary 2·vocab_kv + 2 = 130. A set of ``n``
sequences uses its own ``numpy.random.default_rng(seed)``; per sequence it draws, in order, ``kv``
distinct keys (``choice`` without replacement), ``kv`` values (``integers``, with replacement) and a
permutation of ``kv``. The sequence is ``k1 v1 k2 v2 ... k_kv v_kv`` followed by the keys again in
the permuted order (the first ``queries`` of them, default all ``kv``), one token each, then pads
up to ``seq_len`` (default 2·kv + queries + 4 = 3·kv + 4: 16 for kv = 4, 52 for kv = 16). The target
at a query position is that key's value (``logits[:, t]`` is scored against ``targets[:, t]``, the
model reads the key and names its value); every other target is -100 (ignored). Train set
``n_train`` = 4,096 sequences with seed = the run seed, test set ``n_test`` = 1,024 with seed +
999; ``n_train = 0`` draws a fresh batch for every step instead (no sequence is seen twice, so
the model cannot memorise its way to a low loss; no train accuracy is then reported). Accuracy (:func:`accuracy`) = argmax over *all* logits equals the value, pooled over the
query positions of the test set only; chance = 1 / vocab_kv, printed beside every accuracy.

**Training** goes through :func:`drmlab.training.trainer.train` with a :class:`~drmlab.training.batches.BatchSource`: the
micro-batch of step k is ``batch_size`` rows drawn with replacement from the train set by
``default_rng([seed, k, micro])`` (a pure function of the coordinates, like the LM batches), or
with ``n_train = 0`` generated from that same generator.
Defaults are the study's: AdamW lr 1e-3 constant, wd 0.01 on every tensor, batch 256, 1,500
steps, clip 1.0, fp32, seeds 0 and 1. There is no LM evaluation; the test accuracy is computed
here after training. Each run's trainer files (config.json, metrics.jsonl, checkpoint,
summary.json) and its ``result.json`` sit in ``OUT/runs/<model>_kv<kv>_s<seed>/``; a run whose
``result.json`` records the same settings is reused, not retrained.

**Models.** ``--models`` takes registered names (``drmlab.models.list_models()``) and the anchor
arms ``L1_ds8 L1_ds64 L4_ds8 L4_ds64 L4u_ds8 L4u_ds64`` (:data:`ANCHOR_ARMS`): the study's MQAR
model on the registered ``LOOPED`` body -- SSM mixer with the conv (kernel 4), d_model 128, no
position embedding, final LN; L1 = 4 stored x 1 (eps 1), L4 = 1 x 4 (eps 1/N = 1/4), L4u = 1 x 4
(eps 1); d_state 8 or 64. With ``--arm-model study`` (default) an arm also has the notes' untied
head (``Linear(d, V)``, no bias) and torch's default initialisation (Linear kaiming-uniform,
Embedding N(0, 1), LayerNorm (1, 0), SSM ``a`` = ``D`` = 0, conv default; no GPT re-draw), which
reproduces the study's parameter counts exactly (705,316 / 762,884 / 201,481 / 215,873);
``--arm-model registry`` keeps LOOPED as registered (tied head, GPT-2 init).

**Width** (``--width W``), by the fields of the model's config:

    DRM families (A..J, J_*, SSM_CONTROL)  d_token = d_state = W
    GPT2                                   n_embd = W
    LOOPED (and the anchor arms), MAMBA,
    RESOLVENT, RESOLVENT_ROPE, ...         d_model = W

``--set key=value`` overrides a TrainConfig field or a model-config field of every model
(applied after the width). A model whose learned position table (``max_seq_len`` /
``n_positions``) is shorter than the sequence gets it raised to the sequence length.

**Outputs**: ``mqar.md`` (model x kv, test accuracy mean +- population std over seeds, with chance
and, for the anchor arms, the study's value), ``mqar.json`` (everything, per-seed values included)
and ``mqar.png`` (accuracy against kv).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from drmlab.models.registry import config_fields
from drmlab.training.batches import BatchSource, FixedSetBatches

PAD = 0
IGNORE = -100
FIRST_KEY = 2

# The anchor arms: the study's MQAR model (notes §8) on the registered LOOPED body.
ARM_SETTINGS: dict[str, dict] = {
    "L1": dict(n_stored=4, n_loop=1, eps=1.0),
    "L4": dict(n_stored=1, n_loop=4, eps="1/N"),
    "L4u": dict(n_stored=1, n_loop=4, eps=1.0),
}
ARM_D_STATES = (8, 64)
ARM_BASE = dict(arm=None, mixer="ssm", schedule="layer", ssm_conv=4, ssm_variant="s6", positions="none",
                d_model=128, mlp_ratio=4)
ANCHOR_ARMS: dict[str, dict] = {
    f"{arm}_ds{d}": dict(ARM_BASE, **settings, d_state=d) for arm, settings in ARM_SETTINGS.items() for d in ARM_D_STATES
}
# The study's test accuracies (%, mean of seeds 0 and 1; notes §8) and parameter counts.
ANCHOR_ACC: dict[tuple[str, int], float] = {
    ("L1_ds8", 4): 21.4, ("L4_ds8", 4): 18.6, ("L4u_ds8", 4): 16.2,
    ("L1_ds8", 16): 2.2, ("L4_ds8", 16): 3.8, ("L4u_ds8", 16): 1.7,
    ("L1_ds64", 4): 23.8, ("L4_ds64", 4): 59.8, ("L4u_ds64", 4): 38.8,
    ("L1_ds64", 16): 3.9, ("L4_ds64", 16): 2.1, ("L4u_ds64", 16): 1.6,
}
ANCHOR_PARAMS = {"L1_ds8": 705_316, "L1_ds64": 762_884, "L4_ds8": 201_481, "L4_ds64": 215_873}
ARM_MODELS = ("study", "registry")
DEFAULT_MODELS = "L1_ds64,L4_ds64,L4u_ds64"

# Config fields set by --width, first match wins (see the module docstring).
WIDTH_FIELDS = (("d_token", "d_state"), ("n_embd",), ("d_model",))
POSITION_FIELDS = ("max_seq_len", "n_positions")


# ---------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class MQARTask:
    """One MQAR setting; ``queries`` None = kv, ``seq_len`` None = 2·kv + queries + 4."""

    kv: int = 4
    vocab_kv: int = 64
    queries: int | None = None
    seq_len: int | None = None
    n_train: int = 4096
    n_test: int = 1024
    test_seed_offset: int = 999

    @property
    def n_queries(self) -> int:
        return self.kv if self.queries is None else self.queries

    @property
    def length(self) -> int:
        return 2 * self.kv + self.n_queries + 4 if self.seq_len is None else self.seq_len

    @property
    def vocab_size(self) -> int:
        return 2 * self.vocab_kv + 2

    @property
    def first_value(self) -> int:
        return FIRST_KEY + self.vocab_kv

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the values."""
        return 1.0 / self.vocab_kv

    @property
    def context_guess(self) -> float:
        """Expected accuracy of answering with a uniformly drawn one of the kv values in the
        context (no key-value binding): (1 + (kv - 1) / vocab_kv) / kv, values being drawn with
        replacement."""
        return (1 + (self.kv - 1) / self.vocab_kv) / self.kv

    @property
    def elimination_guess(self) -> float:
        """Expected accuracy of the same guess restricted to the values not yet queried (every key
        is queried at most once, so the j-th query has kv - j candidates left): still no binding."""
        left = [self.kv - j for j in range(self.n_queries)]
        return sum((1 + (r - 1) / self.vocab_kv) / r for r in left) / len(left)

    def validate(self) -> "MQARTask":
        for name in ("kv", "vocab_kv", "n_queries", "length", "n_test"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MQAR {name} must be a positive integer, got {value!r}")
        if not isinstance(self.n_train, int) or isinstance(self.n_train, bool) or self.n_train < 0:
            raise ValueError(f"MQAR n_train must be a non-negative integer (0 = a fresh batch every step), "
                             f"got {self.n_train!r}")
        if self.kv > self.vocab_kv:
            raise ValueError(f"kv ({self.kv}) needs that many distinct keys; vocab_kv is {self.vocab_kv}")
        if self.n_queries > self.kv:
            raise ValueError(f"queries ({self.n_queries}) cannot exceed kv ({self.kv})")
        if self.length < 2 * self.kv + self.n_queries:
            raise ValueError(f"seq_len {self.length} is shorter than the {2 * self.kv} pair tokens + "
                             f"{self.n_queries} queries")
        return self


def generate(task: MQARTask, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of ``task`` from ``default_rng(seed)``: (inputs, targets) int64 [n, length]."""
    task.validate()
    kv, q, vkv = task.kv, task.n_queries, task.vocab_kv
    rng = np.random.default_rng(seed)
    inputs = np.full((n, task.length), PAD, dtype=np.int64)
    targets = np.full((n, task.length), IGNORE, dtype=np.int64)
    key_pool = np.arange(FIRST_KEY, FIRST_KEY + vkv)
    for i in range(n):
        keys = rng.choice(key_pool, size=kv, replace=False)
        values = rng.integers(task.first_value, task.first_value + vkv, size=kv)
        order = rng.permutation(kv)[:q]
        inputs[i, 0 : 2 * kv : 2] = keys
        inputs[i, 1 : 2 * kv : 2] = values
        inputs[i, 2 * kv : 2 * kv + q] = keys[order]
        targets[i, 2 * kv : 2 * kv + q] = values[order]
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def train_set(task: MQARTask, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return generate(task, task.n_train, seed)


def test_set(task: MQARTask, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return generate(task, task.n_test, seed + task.test_seed_offset)


class FreshMQARBatches(BatchSource):
    """The training batches for ``n_train = 0``: ``batch_size`` new sequences of ``task`` from
    ``default_rng([seed, step, micro])`` (never the test set's generator, an integer seed)."""

    def __init__(self, task: MQARTask, batch_size: int):
        self.task, self.batch_size = task, batch_size

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return generate(self.task, self.batch_size, [seed, step, micro])


@torch.no_grad()
def accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 1024) -> dict:
    """Argmax over all logits against the targets, pooled over the scored (query) positions only,
    and per query (``by_query[j]``: the j-th scored position of the sequences, in order)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    col_correct = torch.zeros(inputs.shape[1], dtype=torch.long)
    col_total = torch.zeros(inputs.shape[1], dtype=torch.long)
    try:
        with torch.no_grad():
            for i in range(0, inputs.shape[0], batch_size):
                x, y = inputs[i : i + batch_size].to(device), targets[i : i + batch_size].to(device)
                pred = model(x, step=None).logits.argmax(dim=-1)
                scored = y != IGNORE
                col_correct += ((pred == y) & scored).sum(0).cpu()
                col_total += scored.sum(0).cpu()
    finally:
        model.train(was_training)
    correct, total = int(col_correct.sum()), int(col_total.sum())
    cols = col_total > 0
    by_query = (col_correct[cols].double() / col_total[cols].double()).tolist()
    return {"acc": correct / total if total else float("nan"), "correct": correct, "total": total,
            "by_query": by_query}


# ---------------------------------------------------------------------------------- models
class StudyMQARModel(nn.Module):
    """The study's MQAR model around a registered LOOPED body: untied bias-free head and torch's
    default initialisation (see the module docstring). ``forward`` = body, final LN, head."""

    def __init__(self, body: nn.Module, seed: int):
        super().__init__()
        c = body.config
        self.body = body
        self.config, self.model_name, self.preset = c, body.model_name, body.preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in body.modules():
                if isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
                    module.reset_parameters()  # SSM a, D stay 0; the conv is already at torch's default
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, step: int | None = None):
        from drmlab.models.output import ModelOutput

        x = self.body.residual_stream(tokens)[-1]
        return ModelOutput(logits=self.lm_head(self.body.ln_f(x)), aux={})


def width_overrides(fields, width: int | None) -> dict:
    """The config fields ``--width`` sets for a model whose config has ``fields``."""
    if width is None:
        return {}
    for group in WIDTH_FIELDS:
        if all(f in fields for f in group):
            return {f: width for f in group}
    raise ValueError(f"--width: the model's config has none of {', '.join(f for g in WIDTH_FIELDS for f in g)}")


def _registry_entry(name: str) -> tuple[str, dict]:
    """(registered name, settings) of an anchor arm, ``NAME`` or ``NAME:ARM``."""
    from drmlab.models.registry import parse_model_spec

    if name in ANCHOR_ARMS:
        return "LOOPED", dict(ANCHOR_ARMS[name])
    return parse_model_spec(name)


def resolve_model(name: str, preset: str, task: MQARTask, width: int | None, overrides: dict) -> tuple[str, dict]:
    """(registered name, overrides) for ``name``: anchor-arm settings or the width, then ``overrides``,
    then a position table at least as long as the sequence."""
    registry, kw = _registry_entry(name)
    fields = config_fields(registry, preset, task.vocab_size, **kw)
    kw.update(width_overrides(fields, width))
    kw.update(overrides)
    fields = config_fields(registry, preset, task.vocab_size, **kw)
    for key in POSITION_FIELDS:
        if key in fields and key not in overrides and isinstance(fields[key], int) and fields[key] < task.length:
            kw[key] = task.length
    return registry, kw


def build(name: str, preset: str, task: MQARTask, seed: int, width: int | None = None, overrides: dict | None = None,
          arm_model: str = "study") -> tuple[nn.Module, str, dict]:
    """(model, registered name, overrides) of one MQAR run."""
    from drmlab.models import build_model

    registry, kw = resolve_model(name, preset, task, width, dict(overrides or {}))
    model = build_model(registry, preset=preset, vocab_size=task.vocab_size, seed=seed, **kw)
    if name in ANCHOR_ARMS and arm_model == "study":
        model = StudyMQARModel(model, seed)
    return model, registry, kw


# ---------------------------------------------------------------------------------- runs
@dataclass
class MQARStudy:
    models: list[str]
    kvs: list[int]
    seeds: list[int]
    preset: str = "tiny"
    width: int | None = None
    steps: int = 1500
    batch_size: int = 256
    vocab_kv: int = 64
    queries: int | None = None
    seq_len: int | None = None
    n_train: int = 4096
    n_test: int = 1024
    arm_model: str = "study"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)

    def task(self, kv: int) -> MQARTask:
        return MQARTask(kv=kv, vocab_kv=self.vocab_kv, queries=self.queries, seq_len=self.seq_len,
                        n_train=self.n_train, n_test=self.n_test).validate()

    def train_config(self, task: MQARTask, seed: int):
        from drmlab.training.config import TrainConfig

        values = dict(batch_size=self.batch_size, grad_accum=1, seq_len=task.length, seed=seed, lr=1e-3,
                      schedule="constant", weight_decay=0.01, decay_all_params=True, grad_clip=1.0, bf16=False,
                      eval_every=0, eval_windows=0, checkpoint_every=0)
        values.update(self.train_overrides)
        cfg = TrainConfig(**values)
        cfg.tokens = self.steps * cfg.tokens_per_step
        return cfg.validate()


def run_one(study: MQARStudy, name: str, kv: int, seed: int, out: Path, *, device="auto", quiet=True) -> dict:
    """Train and score one (model, kv, seed) cell; reuse ``result.json`` when its settings match."""
    from drmlab.training.trainer import train

    task = study.task(kv)
    cfg = study.train_config(task, seed)
    from drmlab.models.registry import spec_path_name

    run_dir = out / "runs" / f"{spec_path_name(name)}_kv{kv}_s{seed}"
    spec = _jsonable({"model": name, "preset": study.preset, "width": study.width, "arm_model": study.arm_model,
                      "overrides": study.model_overrides, "task": dataclasses.asdict(task),
                      "train": dataclasses.asdict(cfg)})
    result_path = run_dir / "result.json"
    if result_path.is_file():
        saved = json.loads(result_path.read_text())
        if saved.get("spec") == spec:
            if "test_by_query" not in saved:  # written before per-query accuracy: score the saved weights
                from drmlab.runs import RunDir

                model = build(name, study.preset, task, seed, study.width, study.model_overrides, study.arm_model)[0]
                RunDir(run_dir).load_checkpoint(model)
                test = accuracy(model, *test_set(task, seed))
                if test["correct"] != saved["test_correct"]:
                    raise RuntimeError(f"{run_dir}: the saved weights score {test['correct']} test queries, "
                                       f"result.json says {saved['test_correct']}")
                saved["test_by_query"] = test["by_query"]
                result_path.write_text(json.dumps(saved, indent=2) + "\n")
            return dict(saved, reused=True)
    model, registry, kw = build(name, study.preset, task, seed, study.width, study.model_overrides, study.arm_model)
    fresh = task.n_train == 0
    x_train, y_train = (None, None) if fresh else train_set(task, seed)
    x_test, y_test = test_set(task, seed)
    batches = FreshMQARBatches(task, cfg.batch_size) if fresh else FixedSetBatches(x_train, y_train, cfg.batch_size)
    t0 = time.perf_counter()
    summary = train(model, batches, None, cfg, run_dir,
                    run_info={"model": name, "preset": study.preset, "overrides": kw,
                              "registry_model": registry, "mqar": dataclasses.asdict(task), "arm_model": study.arm_model},
                    device=device, quiet=quiet)
    wall = time.perf_counter() - t0
    test = accuracy(model, x_test, y_test)
    train_acc = {"acc": None} if fresh else accuracy(model, x_train, y_train)
    result = {
        "model": name, "registry_model": registry, "overrides": _jsonable(kw), "kv": kv, "seed": seed,
        "params": summary["params"], "steps": summary["steps"], "final_loss": summary["final_loss"],
        "test_acc": test["acc"], "test_correct": test["correct"], "test_queries": test["total"],
        "test_by_query": test["by_query"],
        "train_acc": train_acc["acc"], "chance": task.chance, "seq_len": task.length,
        "train_seconds": summary["train_seconds"], "seconds_per_step": summary["train_seconds"] / max(summary["steps"], 1),
        "wall_seconds": wall, "spec": spec,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def anchor_comparable(study: MQARStudy) -> bool:
    """Whether the anchor arms of ``study`` are the study's model on the study's task (steps and
    batch may differ; the table states them)."""
    default = MQARTask()
    return (study.vocab_kv == default.vocab_kv and study.queries is None and study.seq_len is None
            and study.n_train == default.n_train and study.n_test == default.n_test
            and study.width in (None, ARM_BASE["d_model"]) and study.arm_model == "study" and not study.model_overrides)


def summarize(study: MQARStudy, results: list[dict]) -> dict:
    comparable = anchor_comparable(study)
    models: dict[str, dict] = {}
    for name in study.models:
        cells = {}
        for kv in study.kvs:
            rows = [r for r in results if r["model"] == name and r["kv"] == kv]
            if not rows:
                continue
            accs = [r["test_acc"] for r in rows]
            mean, std = mean_std(accs)
            by_query = [r["test_by_query"] for r in rows if r.get("test_by_query")]
            first_mean, first_std = mean_std([q[0] for q in by_query]) if by_query else (None, None)
            cells[str(kv)] = {"acc_mean": mean, "acc_std": std, "n_seeds": len(rows), "accs": accs,
                              "first_query_mean": first_mean, "first_query_std": first_std,
                              "by_query_mean": [sum(col) / len(col) for col in zip(*by_query)] if by_query else None,
                              "seeds": [r["seed"] for r in rows], "train_acc_mean": (None if any(r["train_acc"] is None for r in rows)
                                                 else mean_std([r["train_acc"] for r in rows])[0]),
                              "chance": rows[0]["chance"], "anchor_acc": ANCHOR_ACC.get((name, kv)) if comparable else None,
                              "seconds_per_step": mean_std([r["seconds_per_step"] for r in rows])[0],
                              "params": rows[0]["params"]}
        models[name] = {"cells": cells}
    levels = {str(kv): {"chance": study.task(kv).chance, "context_guess": study.task(kv).context_guess,
                        "elimination_guess": study.task(kv).elimination_guess} for kv in study.kvs}
    return {"study": _jsonable(dataclasses.asdict(study)), "chance": 1.0 / study.vocab_kv, "levels": levels,
            "models": models, "runs": [{k: v for k, v in r.items() if k != "spec"} for r in results]}


def _percent(value) -> str:
    return "--" if value is None else f"{100 * value:.1f}%"


def markdown(summary: dict) -> str:
    s = summary["study"]
    kvs = s["kvs"]
    chance = summary["chance"]
    lines = [
        "# MQAR probe", "",
        f"vocab_kv {s['vocab_kv']} (vocabulary {2 * s['vocab_kv'] + 2}); train "
        f"{'fresh every step' if s['n_train'] == 0 else format(s['n_train'], ',')} / test {s['n_test']:,} "
        f"sequences; {s['steps']:,} steps at batch {s['batch_size']}; preset {s['preset']}"
        + (f", width {s['width']}" if s["width"] else "") + f"; arm model {s['arm_model']}; seeds "
        + ", ".join(map(str, s["seeds"])) + ".",
        f"Test accuracy on the query (value) positions only, mean +- population std over seeds; "
        f"chance = 1/{s['vocab_kv']} = {100 * chance:.2f}%. [study: ...] = the reference study's value (notes §8).",
        "Two levels need no key-value binding at all: answering with a random one of the kv values in "
        "the context (*context guess*), and doing so among the values not yet queried (*elimination*; "
        "every key is queried once). The first query of a sequence cannot use elimination, so its "
        "accuracy above the context guess is recall.", "",
        "| model | params | " + " | ".join(f"kv={kv} | kv={kv} first query" for kv in kvs) + " |",
        "|---|---:|" + "---:|---:|" * len(kvs),
    ]
    for name, m in summary["models"].items():
        cells, params = [], ""
        for kv in kvs:
            c = m["cells"].get(str(kv))
            if c is None:
                cells += ["--", "--"]
                continue
            params = params or f"{c['params']:,}"
            text = f"{100 * c['acc_mean']:.1f}% +- {100 * c['acc_std']:.1f} ({c['n_seeds']})"
            if c["anchor_acc"] is not None:
                text += f" [study: {c['anchor_acc']:.1f}%]"
            cells.append(text)
            first = c.get("first_query_mean")
            cells.append("--" if first is None else f"{100 * first:.1f}% +- {100 * c['first_query_std']:.1f}")
        lines.append(f"| {name} | {params} | " + " | ".join(cells) + " |")
    levels = summary.get("levels", {})
    for key, label in (("chance", "chance"), ("context_guess", "context guess (no binding)"),
                       ("elimination_guess", "elimination (no binding)")):
        row = []
        for kv in kvs:
            lv = levels.get(str(kv))
            if lv is None:
                row += ["", ""]
                continue
            first = lv["context_guess"] if key == "elimination_guess" else lv[key]
            row += [f"{100 * lv[key]:.2f}%", f"{100 * first:.2f}%"]
        lines.append(f"| {label} | | " + " | ".join(row) + " |")
    lines += ["", "Per seed (test acc / train acc, seconds per step; test accuracy of the 1st, 2nd, ... query):", ""]
    for r in summary["runs"]:
        per_query = ", ".join(f"{100 * a:.0f}" for a in r.get("test_by_query") or [])
        lines.append(f"* {r['model']} kv={r['kv']} seed {r['seed']}: {100 * r['test_acc']:.1f}% / "
                     f"{_percent(r['train_acc'])}, {r['seconds_per_step']:.3f} s/step, final loss {r['final_loss']:.3f}"
                     + (f"; test by query {per_query}%" if per_query else ""))
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["models"].items():
        kvs = sorted(int(k) for k in m["cells"])
        if not kvs:
            continue
        cells = [m["cells"][str(k)] for k in kvs]
        line = ax.errorbar(kvs, [100 * c["acc_mean"] for c in cells], yerr=[100 * c["acc_std"] for c in cells],
                           marker="o", capsize=3, label=name)
        anchors = [(k, c["anchor_acc"]) for k, c in zip(kvs, cells) if c["anchor_acc"] is not None]
        if anchors:
            ax.scatter([a[0] for a in anchors], [a[1] for a in anchors], marker="x", color=line[0].get_color(),
                       label=f"{name} (study)")
    ax.axhline(100 * summary["chance"], color="gray", linestyle="--", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("key-value pairs (kv)")
    ax.set_ylabel("test accuracy on queries (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_study(study: MQARStudy, out: str | Path, *, device="auto", quiet=True, log=print) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in study.models:
        for kv in study.kvs:
            for seed in study.seeds:
                r = run_one(study, name, kv, seed, out, device=device, quiet=quiet)
                results.append(r)
                log(f"mqar {name} kv={kv} seed={seed}: test acc {100 * r['test_acc']:.1f}% (chance "
                    f"{100 * r['chance']:.1f}%), train acc {_percent(r['train_acc'])}, "
                    f"{r['seconds_per_step']:.3f} s/step" + (" (reused)" if r.get("reused") else ""))
    summary = summarize(study, results)
    (out / "mqar.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "mqar.md").write_text(markdown(summary))
    try:
        plot(summary, out / "mqar.png")
    except ImportError as exc:  # pragma: no cover
        log(f"mqar: plot not written ({exc})")
    return summary


# ---------------------------------------------------------------------------------- CLI
def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{what} is empty")
    return values


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mqar", help="multi-query associative recall probe (model x kv accuracy table)",
        description="Train models on synthetic multi-query associative recall through the trainer and tabulate "
                    "the test accuracy on the query positions (mean +- std over seeds) beside chance and the "
                    "reference study's values (notes/looped-study.md §8).",
        epilog="anchor arms: " + " ".join(ANCHOR_ARMS) + "\nexamples:\n"
               "  drmlab mqar                                   # L1/L4/L4u at d_state 64, kv 4 and 16, seeds 0,1\n"
               "  drmlab mqar --models L4_ds64 --kv 4 --steps 300\n"
               "  drmlab mqar --models GPT2,MAMBA,J --width 128 --kv 4,8,16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"comma-separated registered models (NAME or NAME:ARM, e.g. LOOPED:B) and/or "
                             f"anchor arms (default {DEFAULT_MODELS})")
    parser.add_argument("--kv", default="4,16", help="comma-separated numbers of key-value pairs (default 4,16)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated run seeds (default 0,1)")
    parser.add_argument("--preset", default="tiny", help="model preset for the non-width dimensions (default tiny)")
    parser.add_argument("--width", type=int, default=None, help="model width (see `--help` of the module: d_model / "
                        "n_embd / d_token = d_state); default: the preset's (128 for the anchor arms)")
    parser.add_argument("--arm-model", choices=ARM_MODELS, default="study",
                        help="anchor arms: 'study' = untied head + torch default init (notes §8, default); "
                             "'registry' = LOOPED as registered (tied head, GPT-2 init)")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps per run (default 1500)")
    parser.add_argument("--batch-size", type=int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--vocab-kv", type=int, default=64, help="number of keys = number of values (default 64)")
    parser.add_argument("--queries", type=int, default=None, help="queries per sequence (default kv)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default 2*kv + queries + 4)")
    parser.add_argument("--n-train", type=int, default=4096,
                        help="training sequences (default 4096); 0 = a fresh batch every step")
    parser.add_argument("--n-test", type=int, default=1024, help="test sequences (default 1024)")
    parser.add_argument("--set", dest="assignments", action="append", metavar="KEY=VALUE",
                        help="a TrainConfig or model-config setting for every run (repeatable), e.g. lr=3e-4, d_state=16")
    parser.add_argument("--out", default="runs/mqar", help="output folder (default runs/mqar)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)
    return parser


def build_study(args: argparse.Namespace) -> MQARStudy:
    from drmlab.models import list_models
    from drmlab.training.config import parse_assignments, split_overrides

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise ValueError("--models is empty")
    known = set(list_models()) | set(ANCHOR_ARMS)
    fields: set = set()  # every model's config keys, for --set
    for name in models:
        if name.partition(":")[0] not in known:
            from drmlab.models.registry import suggest

            raise ValueError(f"unknown model {name!r}{suggest(name, known)}; anchor arms: {', '.join(ANCHOR_ARMS)}")
        registry, kw = _registry_entry(name)
        fields |= set(config_fields(registry, args.preset, 2 * args.vocab_kv + 2, **kw))  # a bad arm fails now
    kvs, seeds = _int_list(args.kv, "--kv"), _int_list(args.seeds, "--seeds")
    if args.arm_model not in ARM_MODELS:
        raise ValueError(f"--arm-model must be one of {ARM_MODELS}")
    study = MQARStudy(models=models, kvs=kvs, seeds=seeds, preset=args.preset, width=args.width, steps=args.steps,
                      batch_size=args.batch_size, vocab_kv=args.vocab_kv, queries=args.queries, seq_len=args.seq_len,
                      n_train=args.n_train, n_test=args.n_test, arm_model=args.arm_model)
    if args.steps <= 0:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    assignments = parse_assignments(args.assignments)
    if assignments:
        train_kw, model_kw = split_overrides(assignments, fields)
        for key in ("tokens", "seq_len", "seed"):
            if key in train_kw:
                raise ValueError(f"--set {key}: set by the probe (use --steps, --seq-len, --seeds)")
        study.train_overrides, study.model_overrides = train_kw, model_kw
    for kv in kvs:
        study.train_config(study.task(kv), seeds[0])  # validate early
    return study


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    study = build_study(args)
    summary = run_study(study, args.out, device=args.device, quiet=args.quiet,
                        log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(markdown(summary), end="")
    print(f"wrote {Path(args.out) / 'mqar.md'}, mqar.json, mqar.png")
    return 0
