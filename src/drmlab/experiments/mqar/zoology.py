r"""The Zoology MQAR protocol (docs/mqar.md section 10): the task, recipe and widths of Figure 2 of
Arora et al., "Zoology: Measuring and Improving Recall in Efficient Language Models" (ICLR 2024),
as its code (HazyResearch/zoology) runs them, trained through drmlab's trainer.

**Task** (:func:`generate`). Vocabulary 8,192: token 0 fills, the keys are 1..4,095 (the lower
half), the values 4,096..8,191 (the upper half). An example of length L with kv pairs is
``k1 v1 ... k_kv v_kv`` followed by L - 2 kv slots: slot pair s (s = 0 .. (L - 2 kv)/2 - 1) is
position 2 kv + 2 s. Key j's query sits at slot pair g_j, where (g_1, .., g_kv) are drawn without
replacement with weights w_s = (s + 1)^(a - 1), a = 0.01, one after another (g_1 from w, g_2 from w
without g_1, ...). Keys are distinct, values are distinct (both without replacement). The input
at a query position is the key, the target there is its value; every other target is -100 and
every other input 0. Draws come from ``numpy.random.default_rng(seed)``: keys (rejection of rows
with a repeat), values (the same), then the slots in blocks of :data:`GAP_BLOCK` rows by the
Gumbel-top-k rule (the kv largest of log w_s + Gumbel noise, in decreasing order, which has the
law of drawing one after another). Train and test sets come from ``[data_seed, L, kv, 0]`` and
``[data_seed, L, kv, 1]``.

**Recipe** (:class:`ZoologyRecipe`): the settings (L, kv) = (64, 4), (128, 8), (256, 16), (512,
64); batch 512 / 512 / 256 / 128; 100,000 training and 3,000 test examples; at most 64 epochs of
the shuffled training set (the last batch of an epoch is the remainder); AdamW, weight decay 0.1
on every tensor, no clipping, a cosine from the rate to 0 over the 64 epochs, no warm-up; after
each epoch the test accuracy (argmax over all logits on the query positions) is measured and the
run stops once it exceeds 0.99; rates logspace(-4, -2, 4); widths 64, 128, 256, 512; 2 layers,
one attention head, no MLP where the model allows it. A cell reports the best rate's final test
accuracy, as Zoology's figure does.

**Models** (:func:`protocol_model`): ``ATTENTION`` is Zoology's baseline on GPT2's blocks (2
layers, one head, learned positions of length L, no MLP: the MLP is replaced by the identity on the
second LayerNorm's output, as Zoology's identity state mixer does, dropout 0.1 on the embeddings
and the attention probabilities). Every other registered model gets its width
(:func:`drmlab.experiments.mqar.models.width_overrides`), ``n_layer = 2`` and ``n_head = 1`` where
its config has them, LOOPED ``n_stored = 2 / n_loop``, MAMBA ``dt_rank = ceil(W / 16)``, and a
position table / window of L. A setting a model cannot hold (a learned position table shorter than
L, a LOOPED arm that loops more than twice, an invalid config) is ``n/a`` with the reason.

**Runs** (:func:`run_cell`): one (model, width, L, rate) per folder ``OUT/runs/<model>_w<W>_L<L>_lr<rate>/``;
each epoch is one :func:`drmlab.training.trainer.train` call up to the epoch's last step
(``stop_after_step``) that resumes from the previous epoch's checkpoint, then the test accuracy;
``result.json`` is written after every epoch, so a killed run continues from its last epoch. A
process holds ``OUT/locks/<run>.lock`` while it trains a run, so several processes share a study.
:func:`run_zoology_study` is the entry point with plain arguments.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from drmlab.experiments import lr_sweep
from drmlab.experiments.mqar.models import POSITION_FIELDS, width_overrides
from drmlab.experiments.mqar.task import accuracy
from drmlab.naming import suggest
from drmlab.runs import jsonable
from drmlab.training.batches import BatchSource
from drmlab.training.run_info import RunInfo

MQAR_PROTOCOLS = ("fixed", "distance", "zoology")
VOCAB_SIZE = 8192
POWER_A = 0.01
FILL = 0
IGNORE = BatchSource.IGNORE_INDEX
SETTINGS = ((64, 4), (128, 8), (256, 16), (512, 64))  # (sequence length, key-value pairs)
BATCH_SIZES = {64: 512, 128: 512, 256: 256, 512: 128}  # Zoology's rule: 512 up to 128 tokens, then halving
WIDTHS = (64, 128, 256, 512)
LR_GRID = tuple(float(x) for x in np.logspace(-4, -2, 4))
ATTENTION = "ATTENTION"
DEFAULT_MODELS = (
    ATTENTION,
    "GPT2",
    "MAMBA",
    "RESOLVENT",
    "SSM_CONTROL",
    "J_NO_DIRECTION",
    "ASM_CM",
    "LOOPED:A",
    "LOOPED:C",
)
GAP_BLOCK = 8192  # rows per block of the slot draw (bounds its memory; part of the stream's definition)
EVAL_TOKENS = 16384  # tokens per evaluation forward (the logits of 8,192 entries are the memory)
# Train settings the protocol decides itself.
PROTOCOL_TRAIN_KEYS = ("tokens", "seq_len", "seed", "lr", "batch_size", "grad_accum", "schedule")


def check_protocol(name: str) -> str:
    """``name`` if it is an MQAR protocol; otherwise ValueError listing the known ones."""
    if name not in MQAR_PROTOCOLS:
        raise ValueError(
            f"unknown MQAR protocol {name!r}{suggest(str(name), MQAR_PROTOCOLS)}; known: {', '.join(MQAR_PROTOCOLS)}"
        )
    return name


@dataclass(frozen=True)
class ZoologyRecipe:
    """Zoology's Figure-2 settings (docs/mqar.md section 10.1)."""

    vocab_size: int = VOCAB_SIZE
    power_a: float = POWER_A
    settings: tuple = SETTINGS
    batch_sizes: tuple = tuple(sorted(BATCH_SIZES.items()))
    n_train: int = 100_000
    n_test: int = 3_000
    epochs: int = 64
    weight_decay: float = 0.1
    early_stop: float = 0.99  # stop once the test accuracy after an epoch exceeds this
    lr_grid: tuple = LR_GRID
    widths: tuple = WIDTHS
    n_layer: int = 2
    n_head: int = 1
    dropout: float = 0.1  # the attention baseline's embedding and attention-probability dropout
    seed: int = 123  # Zoology's TrainConfig seed (model init, batch order)
    data_seed: int = 0  # Zoology's DataConfig seed

    def batch_size(self, seq_len: int) -> int:
        return dict(self.batch_sizes)[seq_len]

    def steps_per_epoch(self, seq_len: int) -> int:
        return math.ceil(self.n_train / self.batch_size(seq_len))


RECIPE = ZoologyRecipe()


# ---------------------------------------------------------------------------------- the task
def check_setting(seq_len, kv, vocab_size: int = VOCAB_SIZE) -> None:
    for what, value in (("seq_len", seq_len), ("kv", kv)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"Zoology MQAR {what} must be a positive integer, got {value!r}")
    if seq_len % 2:
        raise ValueError(f"Zoology MQAR seq_len must be even (keys and queries sit on even positions), got {seq_len}")
    if 4 * kv > seq_len:
        raise ValueError(
            f"Zoology MQAR needs seq_len >= 4 kv (the pairs and one query slot pair per key); "
            f"seq_len {seq_len} holds at most kv {seq_len // 4}, got {kv}"
        )
    if kv > vocab_size // 2 - 1:
        raise ValueError(
            f"kv {kv} needs that many distinct keys; the vocabulary of {vocab_size} has {vocab_size // 2 - 1}"
        )


def slot_weights(space: int, power_a: float = POWER_A) -> np.ndarray:
    """The normalised weights (s + 1)^(a - 1), s = 0 .. space - 1, of a query's slot pair."""
    w = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1.0)
    return w / w.sum()


def _distinct(rng: np.random.Generator, low: int, high: int, n: int, k: int) -> np.ndarray:
    """[n, k] integers of [low, high), distinct within each row: rows with a repeat are drawn again
    (each row is then uniform over the ordered k-tuples without repeats)."""
    out = rng.integers(low, high, size=(n, k), dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        rows = np.sort(out[todo], axis=1)
        todo = todo[(rows[:, 1:] == rows[:, :-1]).any(axis=1)]
        if todo.size:
            out[todo] = rng.integers(low, high, size=(todo.size, k), dtype=np.int64)
    return out


def _slots(rng: np.random.Generator, n: int, kv: int, space: int, power_a: float) -> np.ndarray:
    """[n, kv] slot pairs drawn without replacement by weight, in draw order (Gumbel-top-k)."""
    log_w = np.log(slot_weights(space, power_a))
    out = np.empty((n, kv), dtype=np.int64)
    for start in range(0, n, GAP_BLOCK):
        m = min(GAP_BLOCK, n - start)
        score = log_w + rng.gumbel(size=(m, space))
        top = np.argpartition(-score, kv - 1, axis=1)[:, :kv]
        order = np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable")
        out[start : start + m] = np.take_along_axis(top, order, axis=1)
    return out


def generate(
    seq_len: int,
    kv: int,
    n: int,
    seed,
    *,
    vocab_size: int = VOCAB_SIZE,
    power_a: float = POWER_A,
    dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` Zoology MQAR examples from ``default_rng(seed)``: (inputs, targets) [n, seq_len]."""
    check_setting(seq_len, kv, vocab_size)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"the number of examples must be a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    half = vocab_size // 2
    keys = _distinct(rng, 1, half, n, kv)
    values = _distinct(rng, half, vocab_size, n, kv)
    slots = _slots(rng, n, kv, (seq_len - 2 * kv) // 2, power_a)
    np_type = np.int16 if dtype == torch.int16 else np.int32 if dtype == torch.int32 else np.int64
    inputs = np.full((n, seq_len), FILL, dtype=np_type)
    targets = np.full((n, seq_len), IGNORE, dtype=np_type)
    inputs[:, 0 : 2 * kv : 2] = keys
    inputs[:, 1 : 2 * kv : 2] = values
    where = 2 * kv + 2 * slots
    np.put_along_axis(inputs, where, keys, axis=1)
    np.put_along_axis(targets, where, values, axis=1)
    return torch.from_numpy(inputs), torch.from_numpy(targets)


def data_sets(seq_len: int, kv: int, *, n_train: int, n_test: int, data_seed: int = 0, dtype=torch.int16):
    """(train inputs, train targets, test inputs, test targets) of one setting (int16 by default:
    8,192 tokens and -100 fit, at a quarter of int64's memory)."""
    x, y = generate(seq_len, kv, n_train, [data_seed, seq_len, kv, 0], dtype=dtype)
    xt, yt = generate(seq_len, kv, n_test, [data_seed, seq_len, kv, 1], dtype=dtype)
    return x, y, xt, yt


class EpochBatches(BatchSource):
    """Shuffled epochs of a fixed set: step k (1-based) is batch (k - 1) mod E of epoch (k - 1) // E,
    E = ceil(n / batch_size), in the order of ``default_rng([seed, epoch]).permutation(n)``; the last
    batch of an epoch holds the remainder (as a data loader without drop_last)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int):
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.per_epoch = math.ceil(inputs.shape[0] / batch_size)
        self._perm: tuple[tuple, np.ndarray] | None = None

    def rows(self, seed: int, step: int) -> np.ndarray:
        epoch, index = divmod(step - 1, self.per_epoch)
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), np.random.default_rng([seed, epoch]).permutation(self.inputs.shape[0]))
        return self._perm[1][index * self.batch_size : (index + 1) * self.batch_size]

    def global_batch(self, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(self.rows(seed, step))
        return self.inputs[rows].long(), self.targets[rows].long()


def query_accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Accuracy on the query positions only (argmax over all logits), a bounded number of tokens per forward."""
    batch = max(1, EVAL_TOKENS // inputs.shape[1])
    return accuracy(model, inputs.long(), targets.long(), batch_size=batch, scored_only=True)


# ---------------------------------------------------------------------------------- the models
def protocol_overrides(
    name: str, preset: str, width: int, seq_len: int, settings: dict | None = None, recipe: ZoologyRecipe = RECIPE
) -> tuple[str, dict, str | None]:
    """(registered name, overrides, None) of ``name`` at the protocol's width and length, or
    (registered name, overrides, reason) when the model cannot hold the setting (n/a)."""
    from drmlab.models.registry import config_fields, parse_model_spec

    settings = dict(settings or {})
    registry, kw = ("GPT2", {}) if name == ATTENTION else parse_model_spec(name)
    fields = config_fields(registry, preset, recipe.vocab_size, **kw)
    kw.update(width_overrides(fields, width))
    if "n_layer" in fields:
        kw["n_layer"] = recipe.n_layer
    if "n_head" in fields:
        kw["n_head"] = recipe.n_head
    if registry == "LOOPED":
        loops = fields["n_loop"]
        if recipe.n_layer % loops:
            return (
                registry,
                kw,
                (
                    f"{name} loops {loops} times; the protocol's {recipe.n_layer} layers hold "
                    f"only loop counts dividing {recipe.n_layer}"
                ),
            )
        kw["n_stored"] = recipe.n_layer // loops
    if "dt_rank" in fields:
        kw["dt_rank"] = math.ceil(width / 16)  # Mamba's "auto" rank, as Zoology's Mamba uses it
    kw.update(settings)
    for key in POSITION_FIELDS:
        if key in fields and key not in settings:
            kw[key] = max(seq_len, 1)
    try:
        fields = config_fields(registry, preset, recipe.vocab_size, **kw)
    except ValueError as exc:
        return registry, kw, str(exc).splitlines()[0]
    learned = "n_positions" in fields or fields.get("positions") == "learned"
    for key in POSITION_FIELDS:
        if learned and key in fields and fields[key] < seq_len:
            return (
                registry,
                kw,
                (f"attention past its positions: {key}={fields[key]} is shorter than the sequence length {seq_len}"),
            )
    return registry, kw, None


def zoology_attention(model: nn.Module, dropout: float) -> nn.Module:
    """Turn a built GPT2 into Zoology's attention baseline: each block's MLP becomes the identity
    (the residual then adds the second LayerNorm's output, as Zoology's identity state mixer does)
    and the embedding and attention-probability dropouts become ``dropout``."""
    transformer = model.hf.transformer
    transformer.drop.p = dropout
    for block in transformer.h:
        block.mlp = nn.Identity()
        block.attn.attn_dropout.p = dropout
    return model


def protocol_model(
    name: str,
    preset: str,
    width: int,
    seq_len: int,
    seed: int,
    settings: dict | None = None,
    recipe: ZoologyRecipe = RECIPE,
) -> tuple[nn.Module, str, dict]:
    """(model, registered name, overrides) of ``name`` in the protocol; ValueError when n/a."""
    from drmlab.models import build_model

    registry, kw, why = protocol_overrides(name, preset, width, seq_len, settings, recipe)
    if why is not None:
        raise ValueError(f"{name} at width {width}, length {seq_len}: n/a ({why})")
    model = build_model(registry, preset=preset, vocab_size=recipe.vocab_size, seed=seed, **kw)
    if name == ATTENTION:
        zoology_attention(model, recipe.dropout)
    return model, registry, kw


# ---------------------------------------------------------------------------------- the study
@dataclass
class ZoologyStudy:
    models: list[str]
    widths: list[int]
    settings: list[tuple[int, int]]
    lr_grid: list[float]
    preset: str = "tiny"
    recipe: ZoologyRecipe = RECIPE
    batch_size: int | None = None  # None: the recipe's per length
    model_overrides: dict = dataclasses.field(default_factory=dict)
    train_overrides: dict = dataclasses.field(default_factory=dict)

    def batch_for(self, seq_len: int) -> int:
        return self.batch_size or self.recipe.batch_size(seq_len)

    def per_epoch(self, seq_len: int) -> int:
        return math.ceil(self.recipe.n_train / self.batch_for(seq_len))

    def train_config(self, seq_len: int, lr: float):
        from drmlab.training.config import TrainConfig

        values = dict(
            batch_size=self.batch_for(seq_len),
            grad_accum=1,
            seq_len=seq_len,
            seed=self.recipe.seed,
            lr=lr,
            schedule="cosine",
            warmup_fraction=0.0,
            min_lr_ratio=0.0,
            weight_decay=self.recipe.weight_decay,
            decay_all_params=True,
            grad_clip=0.0,
            bf16=False,
            eval_every=0,
            eval_windows=0,
            checkpoint_every=0,
            divergence_steps=0,
        )
        values.update(self.train_overrides)
        cfg = TrainConfig(**values)
        cfg.tokens = self.recipe.epochs * self.per_epoch(seq_len) * cfg.tokens_per_step
        return cfg.validate()

    def record(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def plan_study(
    models=DEFAULT_MODELS,
    widths=WIDTHS,
    seq_lens=None,
    *,
    preset: str = "tiny",
    lr_grid=LR_GRID,
    epochs: int = RECIPE.epochs,
    n_train: int = RECIPE.n_train,
    n_test: int = RECIPE.n_test,
    batch_size: int | None = None,
    seed: int = RECIPE.seed,
    data_seed: int = RECIPE.data_seed,
    early_stop: float = RECIPE.early_stop,
    settings: dict | None = None,
) -> ZoologyStudy:
    """Check every model, width, length and setting and plan the study. ``seq_lens`` picks among the
    protocol's lengths (default all four; each brings its own kv and batch size)."""
    from drmlab.models import list_models
    from drmlab.models.registry import config_fields
    from drmlab.training.config import split_overrides

    models = [str(m).strip() for m in models]
    if not models or not all(models):
        raise ValueError("models: give at least one name, and no empty ones")
    known = set(list_models()) | {ATTENTION}
    for name in models:
        if name.partition(":")[0] not in known:
            raise ValueError(
                f"unknown model {name!r}{suggest(name, known)}; {ATTENTION} is Zoology's attention baseline"
            )
    pairs = dict(SETTINGS)
    seq_lens = list(pairs) if seq_lens is None else list(seq_lens)
    for L in seq_lens:
        if L not in pairs:
            raise ValueError(f"seq_len {L!r} is not one of the protocol's lengths {', '.join(map(str, pairs))}")
    widths = list(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
        raise ValueError(f"widths must be positive integers, got {widths!r}")
    for what, value in (("epochs", epochs), ("n_train", n_train), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
        raise ValueError(f"batch_size must be a positive integer or None (the protocol's), got {batch_size!r}")
    if not (isinstance(early_stop, (int, float)) and 0 < early_stop <= 1):
        raise ValueError(f"early_stop must be an accuracy in (0, 1], got {early_stop!r}")
    grid = parse_rates(lr_grid)
    recipe = dataclasses.replace(
        RECIPE,
        epochs=epochs,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        data_seed=data_seed,
        early_stop=float(early_stop),
    )
    study = ZoologyStudy(
        models=models,
        widths=widths,
        settings=[(L, pairs[L]) for L in sorted(seq_lens)],
        lr_grid=grid,
        preset=preset,
        recipe=recipe,
        batch_size=batch_size,
    )
    fields: set = set()
    for name in models:
        registry, kw = ("GPT2", {}) if name == ATTENTION else _spec(name)
        fields |= set(config_fields(registry, preset, VOCAB_SIZE, **kw))
    if settings:
        train_kw, model_kw = split_overrides(settings, fields)
        for key in PROTOCOL_TRAIN_KEYS:
            if key in train_kw:
                raise ValueError(
                    f"the train setting {key!r} is the protocol's own (its lengths, batch sizes, "
                    "epochs, seed and rate grid decide it)"
                )
        study.train_overrides, study.model_overrides = train_kw, model_kw
    study.train_config(study.settings[0][0], grid[0])  # validate early
    return study


def parse_rates(rates) -> list[float]:
    """``"1e-4,1e-3"`` or numbers -> the sorted distinct rates (one rate is allowed: no sweep)."""
    parts = [p.strip() for p in rates.split(",") if p.strip()] if isinstance(rates, str) else list(rates)
    try:
        values = [float(p) for p in parts if not isinstance(p, bool)]
    except (TypeError, ValueError):
        raise ValueError(f"lr grid {rates!r}: give comma-separated numbers, e.g. 1e-4,1e-3") from None
    if not values or len(values) != len(parts) or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"lr grid {rates!r}: give at least one rate, each a finite number above 0")
    if len(set(values)) != len(values):
        raise ValueError(f"lr grid {rates!r} lists a rate twice")
    return sorted(values)


def _spec(name: str) -> tuple[str, dict]:
    from drmlab.models.registry import parse_model_spec

    return parse_model_spec(name)


def run_name(name: str, width: int, seq_len: int, lr: float) -> str:
    from drmlab.models.registry import spec_path_name

    return f"{spec_path_name(name)}_w{width}_L{seq_len}_lr{lr_sweep.lr_label(lr)}"


_DATA_CACHE: dict = {}


def cached_data(study: ZoologyStudy, seq_len: int, kv: int):
    """The setting's data sets, kept for the last setting used (the study walks settings in order)."""
    r = study.recipe
    key = (seq_len, kv, r.n_train, r.n_test, r.data_seed)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data_sets(seq_len, kv, n_train=r.n_train, n_test=r.n_test, data_seed=r.data_seed)
    return _DATA_CACHE[key]


def run_cell(
    study: ZoologyStudy,
    name: str,
    width: int,
    seq_len: int,
    kv: int,
    lr: float,
    out: Path,
    *,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    collect_only: bool = False,
) -> dict:
    """Train (or continue, or reuse) one run; its result (``status``: done, diverged, n/a or locked;
    with ``collect_only`` nothing is trained and an unfinished run is ``pending``)."""
    from drmlab.runs import RunDir, RunLock, RunLockedError, write_json_atomic
    from drmlab.training.pieces import TrainPieces
    from drmlab.training.trainer import NonFiniteLossError, lm_loss_fn, train

    label = run_name(name, width, seq_len, lr)
    base = {"model": name, "width": width, "seq_len": seq_len, "kv": kv, "lr": lr}
    registry, kw, why = protocol_overrides(name, study.preset, width, seq_len, study.model_overrides, study.recipe)
    if why is not None:
        return dict(base, status="n/a", why=why)
    cfg = study.train_config(seq_len, lr)
    r = study.recipe
    spec = jsonable(
        {
            "model": name,
            "registry_model": registry,
            "preset": study.preset,
            "overrides": kw,
            "zoology_attention": name == ATTENTION,
            "dropout": r.dropout if name == ATTENTION else 0.0,
            "task": {
                "vocab_size": r.vocab_size,
                "power_a": r.power_a,
                "seq_len": seq_len,
                "kv": kv,
                "n_train": r.n_train,
                "n_test": r.n_test,
                "data_seed": r.data_seed,
            },
            "epochs": r.epochs,
            "early_stop": r.early_stop,
            "head_at_queries_only": True,
            "train": dataclasses.asdict(cfg),
        }
    )
    run_dir = out / "runs" / label
    path = run_dir / "result.json"
    saved = json.loads(path.read_text()) if path.is_file() else None
    if saved is not None and saved.get("spec") == spec and saved.get("status") in ("done", "diverged"):
        return dict(saved, reused=True)
    if collect_only:  # the report of what has finished: nothing is trained
        return dict(base, status="pending")
    try:
        lock = RunLock(out / "locks" / f"{label}.lock").acquire()
    except RunLockedError:
        return dict(base, status="locked")
    try:
        saved = json.loads(path.read_text()) if path.is_file() else None  # another process may have moved it on
        if saved is not None and saved.get("spec") == spec and saved.get("status") in ("done", "diverged"):
            return dict(saved, reused=True)
        run = RunDir(run_dir)
        resume = saved is not None and saved.get("spec") == spec and run.has_checkpoint()
        result = saved if resume else dict(base, status="training", spec=spec, epochs=[], wall_seconds=0.0)
        if not resume:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, result)
        x, y, xt, yt = cached_data(study, seq_len, kv)
        model, _, _ = protocol_model(name, study.preset, width, seq_len, r.seed, study.model_overrides, r)
        batches = EpochBatches(x, y, cfg.batch_size)
        per_epoch = batches.per_epoch
        info = RunInfo(
            name,
            study.preset,
            kw,
            registry_model=registry,
            study={"mqar_zoology": {k: v for k, v in spec.items() if k not in ("train", "overrides")}},
        )
        done = result["epochs"][-1]["epoch"] if result["epochs"] else 0
        while done < r.epochs:
            t0 = time.perf_counter()
            try:
                summary = train(
                    model,
                    batches,
                    None,
                    cfg,
                    run_dir,
                    resume=resume,
                    overwrite=not resume,
                    run_info=info,
                    device=device,
                    quiet=True,
                    stop_after_step=(done + 1) * per_epoch,
                    pieces=TrainPieces(loss_fn=lm_loss_fn(cfg.bf16, scored_only=True)),
                )
            except NonFiniteLossError as exc:
                result.update(status="diverged", why=str(exc).split(";")[0])
                write_json_atomic(path, result)
                if log is not None:
                    log(f"zoology {label}: diverged ({result['why']})")
                return result
            resume = True
            t1 = time.perf_counter()
            test = query_accuracy(model, xt, yt)
            epoch = summary["steps"] // per_epoch
            loss = summary["final_loss"]
            if (
                loss is None
            ):  # the checkpoint was already at this epoch's end (killed before result.json): the logged loss
                loss = next(
                    (
                        m["loss"]
                        for m in run.read_metrics()
                        if m.get("kind") == "train" and m["step"] == summary["steps"]
                    ),
                    None,
                )
            result["epochs"].append(
                {
                    "epoch": epoch,
                    "step": summary["steps"],
                    "loss": loss,
                    "test_acc": test["acc"],
                    "train_seconds": t1 - t0,
                    "eval_seconds": time.perf_counter() - t1,
                }
            )
            result["wall_seconds"] += time.perf_counter() - t0
            result["params"] = summary["params"]
            done = epoch
            stop = test["acc"] > r.early_stop
            if stop or done >= r.epochs:
                result.update(
                    status="done",
                    test_acc=test["acc"],
                    test_correct=test["correct"],
                    test_queries=test["total"],
                    epochs_run=done,
                    early_stopped=stop,
                    steps=summary["steps"],
                    seconds_per_step=sum(e["train_seconds"] for e in result["epochs"]) / max(1, summary["steps"]),
                )
            write_json_atomic(path, result)
            if log is not None and not quiet:
                log(f"zoology {label}: epoch {epoch} test acc {100 * test['acc']:.2f}%")
            if stop:
                break
        if log is not None:
            log(
                f"zoology {label}: test acc {100 * result['test_acc']:.2f}% after {result['epochs_run']} epochs"
                f"{' (early stop)' if result['early_stopped'] else ''}, {result['wall_seconds']:.0f} s"
            )
        return result
    finally:
        lock.release()


@torch.no_grad()
def decode_state_bytes(
    name: str, preset: str, width: int, seq_len: int, settings: dict | None = None, recipe: ZoologyRecipe = RECIPE
) -> int:
    """Bytes of one sequence's decoding state after ``seq_len`` tokens (issue 26's frontier: the key/value
    cache of attention at that length, MAMBA's conv and SSM state, ASM_CM's matrices, J's vector), from
    the model as built (the architecture decides it, not the weights): a batch-1 prefill of ``seq_len``
    tokens with ``return_state=True``."""
    from drmlab.experiments.mqar.distance import state_nbytes

    model, _, _ = protocol_model(name, preset, width, seq_len, recipe.seed, settings, recipe)
    tokens = torch.zeros(1, seq_len, dtype=torch.long)
    return state_nbytes(model.eval()(tokens, return_state=True).state)


def summarize(study: ZoologyStudy, results: list[dict]) -> dict:
    """Per (model, width, length): each rate's final test accuracy (None: diverged), the best rate
    and its accuracy (Zoology's figure value), or n/a with the reason; the runs."""
    cells = {}
    for name in study.models:
        for width in study.widths:
            for seq_len, kv in study.settings:
                rows = [r for r in results if (r["model"], r["width"], r["seq_len"]) == (name, width, seq_len)]
                key = f"{name} w{width} L{seq_len}"
                na = [r for r in rows if r["status"] == "n/a"]
                if na:
                    cells[key] = {
                        "model": name,
                        "width": width,
                        "seq_len": seq_len,
                        "kv": kv,
                        "status": "n/a",
                        "why": na[0]["why"],
                    }
                    continue
                scores = {
                    r["lr"]: (r.get("test_acc") if r["status"] == "done" else None)
                    for r in rows
                    if r["status"] in ("done", "diverged")
                }
                complete = len(scores) == len(study.lr_grid)
                state = decode_state_bytes(name, study.preset, width, seq_len, study.model_overrides, study.recipe)
                choice = lr_sweep.choose(scores, lower_is_better=False) if scores else {"lr": None}
                best = scores.get(choice["lr"]) if choice.get("lr") is not None else None
                cells[key] = {
                    "model": name,
                    "width": width,
                    "seq_len": seq_len,
                    "kv": kv,
                    "status": "done" if complete else "incomplete",
                    "scores": {lr_sweep.lr_label(lr): s for lr, s in sorted(scores.items())},
                    "acc": best,
                    "state_bytes": state,
                    **choice,
                    "wall_seconds": {
                        lr_sweep.lr_label(r["lr"]): r.get("wall_seconds")
                        for r in rows
                        if r["status"] in ("done", "diverged")
                    },
                }
    return {
        "protocol": "zoology",
        "study": study.record(),
        "cells": cells,
        "runs": [{k: v for k, v in r.items() if k != "spec"} for r in results],
        "finished": [
            {k: v for k, v in r.items() if k != "reused"} for r in results if r["status"] in ("done", "diverged")
        ],
    }


def restore_runs(results_path: str | Path, out: str | Path) -> list[str]:
    """Put the finished runs of a committed ``results.json`` (its ``finished`` records, each with the spec
    it ran under) back as ``OUT/runs/<run>/result.json`` where OUT holds none, so a study continued in
    another checkout reuses them (:func:`run_cell` reuses a finished result whose spec matches, and
    retrains one whose spec differs). The names restored."""
    from drmlab.runs import write_json_atomic

    path = Path(results_path)
    try:
        records = json.loads(path.read_text())["finished"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a Zoology results.json with finished runs") from None
    restored = []
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("spec"), dict):
            raise ValueError(f"{path}: a finished run without its spec cannot be restored")
        label = run_name(record["model"], record["width"], record["seq_len"], record["lr"])
        target = Path(out) / "runs" / label / "result.json"
        if target.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target, record)
        restored.append(label)
    return restored


def run_planned(
    study: ZoologyStudy,
    out: str | Path,
    *,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    wait_seconds: float = 30.0,
    collect_only: bool = False,
) -> dict:
    """Run (or reuse) every (model, width, length, rate) of ``study``, leaving runs held by another
    process to it and coming back to them; then write the report. The summary. ``collect_only``: train
    nothing, report what has finished (the rest of a cell's sweep shows as incomplete)."""
    from drmlab.experiments.mqar import zoology_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [
        (seq_len, kv, name, width, lr)
        for seq_len, kv in study.settings
        for name in study.models
        for width in study.widths
        for lr in study.lr_grid
    ]
    results: dict = {}
    while todo:
        left = []
        for seq_len, kv, name, width, lr in todo:
            r = run_cell(
                study, name, width, seq_len, kv, lr, out, device=device, quiet=quiet, log=log, collect_only=collect_only
            )
            if r["status"] == "locked":
                left.append((seq_len, kv, name, width, lr))
                continue
            results[(name, width, seq_len, lr)] = r
        if left and len(left) == len(todo):
            time.sleep(wait_seconds)
        todo = left
    summary = summarize(study, list(results.values()))
    zoology_report.write_report(summary, out, log=log)
    return summary


def run_zoology_study(
    models=DEFAULT_MODELS,
    widths=WIDTHS,
    seq_lens=None,
    *,
    out: str | Path,
    preset: str = "tiny",
    lr_grid=LR_GRID,
    epochs: int = RECIPE.epochs,
    n_train: int = RECIPE.n_train,
    n_test: int = RECIPE.n_test,
    batch_size: int | None = None,
    seed: int = RECIPE.seed,
    data_seed: int = RECIPE.data_seed,
    early_stop: float = RECIPE.early_stop,
    settings: dict | None = None,
    device="auto",
    quiet: bool = True,
    log: Callable[[str], None] | None = None,
    collect_only: bool = False,
) -> dict:
    """``drmlab mqar --protocol zoology``: plan (:func:`plan_study`) and run the study into ``out``;
    the summary (also ``out/zoology.json``, ``zoology.md``). ``collect_only``: report without training."""
    study = plan_study(
        models,
        widths,
        seq_lens,
        preset=preset,
        lr_grid=lr_grid,
        epochs=epochs,
        n_train=n_train,
        n_test=n_test,
        batch_size=batch_size,
        seed=seed,
        data_seed=data_seed,
        early_stop=early_stop,
        settings=settings,
    )
    return run_planned(study, out, device=device, quiet=quiet, log=log, collect_only=collect_only)
