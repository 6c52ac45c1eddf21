"""The lm-evaluation-harness model ``drmlab``: harness requests scored and answered by drmlab models.

Importing this module registers :class:`DrmlabLM` in the harness's model registry as ``drmlab``
(``lm_eval.api.registry.register_model``); ``pretrained=DIR`` is a drmlab run directory or a Hugging
Face export of one (:func:`drmlab.integrations.loading.load_checkpoint_or_export`).

**Scoring** follows ``drmlab eval``'s rescoring (:mod:`drmlab.evaluation.rescoring`): eval mode,
float32 logits with autocast off, each span's negative log-likelihood a ``cross_entropy`` sum added
up in float64; each request is scored alone (batch 1, no padding). How far back a prediction sees
depends on the family:

* **no position limit** (the DRM variants, MAMBA, RESOLVENT and its controls, LLAMA (rotary), LOOPED
  with ``positions="none"``): the whole text is one carried state -- one parallel
  forward over the first ``max_parallel`` tokens (default 2,048), which also returns the decode
  state (:func:`drmlab.generation.prefill`), then exact ``model.step`` calls carrying that state
  over the rest. Nothing is truncated or windowed: every token is predicted from all tokens before
  it (stepping equals the parallel forward, ``tests/models/test_step_equivalence.py``);
* **a learned position table** (GPT2, LOOPED with learned positions: ``has_position_limit``) of L
  rows: ``loglikelihood`` keeps the last L tokens of context + continuation (the harness's own
  Hugging Face model does the same); ``loglikelihood_rolling`` cuts the text into non-overlapping
  windows of L inputs, each from a fresh state -- exactly ``drmlab eval``'s windows.

``loglikelihood_rolling`` scores every token of the text after a ``prefix`` (model argument,
default ``"\\n\\n"``: the separator every document follows in drmlab's training streams; drmlab's
tokenizers have no beginning-of-text token). An empty ``loglikelihood`` context is the prefix too.
``generate_until`` prefills the context and decodes with ``model.step`` and
:func:`drmlab.generation.sample_next` (greedy unless ``do_sample``) until a stop string, the
end-of-text token (GPT-2) or ``max_gen_toks``: the same tokens as ``drmlab generate``.

**Running it.** The installed harness (0.4.x) finds ``--model`` names only in its own registry
(``lm_eval.models.MODEL_MAPPING`` and classes registered on import); it reads no entry points, so
its ``lm_eval`` command cannot see ``drmlab`` by itself. ``python -m drmlab.integrations.lm_eval_adapter
ARGS`` registers the model and then runs the harness's own command line with ``ARGS`` (every harness
flag works), and ``drmlab lm-eval --ckpt DIR --tasks ...`` wraps :func:`evaluate`.
docs/integrations.md shows both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from drmlab.generation import prefill, sample_next
from drmlab.models.decode_state import position_limit

DEFAULT_PREFIX = "\n\n"  # drmlab's corpus separator (drmlab.data.corpus.SEPARATOR): what every document follows
DEFAULT_MAX_PARALLEL = 2048


context_limit = position_limit  # how many tokens one forward may take (its learned position table), or None


class StreamScore:
    """A running sum of -log p over scored targets (float64) and whether every one was the argmax."""

    def __init__(self):
        self.nats = 0.0
        self.greedy = True
        self.count = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Score ``logits`` [n, vocab] against ``targets`` [n] (the rescoring's arithmetic)."""
        if targets.numel() == 0:
            return
        logits = logits if logits.dtype == torch.float64 else logits.float()
        nll = F.cross_entropy(logits, targets, reduction="sum")
        self.nats += float(nll.double())
        self.greedy = self.greedy and bool((logits.argmax(-1) == targets).all())
        self.count += int(targets.numel())


@torch.no_grad()
def score_tokens(
    model, ids: list[int], first_target: int, *, window: int | None = None, max_parallel: int = DEFAULT_MAX_PARALLEL
) -> StreamScore:
    """-log p(ids[j] | ids[:j]) summed over j >= ``first_target`` (>= 1).

    ``window=None``: one carried state over all of ``ids`` (a parallel forward over the first
    ``max_parallel`` inputs, then ``model.step``); ``window=L``: non-overlapping windows of L inputs
    starting at 0, L, 2L, ..., each from a fresh state (``drmlab eval``'s windows)."""
    if not 1 <= first_target <= len(ids):
        raise ValueError(f"first_target {first_target} outside [1, {len(ids)}]")
    device = next(iter(model.parameters())).device
    stream = torch.tensor(ids, dtype=torch.long, device=device)
    inputs, targets = stream[:-1], stream[1:]
    score = StreamScore()
    model.eval()
    with torch.autocast(device_type=device.type, enabled=False):
        if window is not None:
            for start in range(0, inputs.numel(), window):
                logits = model(inputs[None, start : start + window]).logits[0]
                keep = slice(max(0, first_target - 1 - start), None)
                score.add(logits[keep], targets[start : start + window][keep])
            return score
        head = min(inputs.numel(), max_parallel)
        out = model(inputs[None, :head], return_state=head < inputs.numel())
        keep = slice(first_target - 1, None)
        score.add(out.logits[0][keep], targets[:head][keep])
        state = out.state
        for t in range(head, inputs.numel()):
            logits_t, state = model.step(inputs[t : t + 1], state)
            if t + 1 >= first_target:
                score.add(logits_t, targets[t : t + 1])
    return score


@torch.no_grad()
def prefill_long(model, ids: list[int], max_parallel: int = DEFAULT_MAX_PARALLEL):
    """(logits after the last of ``ids`` [1, vocab], the decode state): :func:`drmlab.generation.prefill`
    over the first ``max_parallel`` tokens, ``model.step`` over the rest."""
    device = next(iter(model.parameters())).device
    tokens = torch.tensor([ids], dtype=torch.long, device=device)
    logits, state = prefill(model, tokens[:, :max_parallel])
    for t in range(min(max_parallel, tokens.shape[1]), tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
    return logits, state


class DrmlabLM(LM):
    """A drmlab model for the harness (module docstring). Model arguments: ``pretrained`` (a run
    directory or an export; or pass ``model=`` an ``nn.Module`` with ``tokenizer=``), ``device``
    (default cpu), ``prefix`` (default ``"\\n\\n"``), ``max_parallel`` (default 2,048), ``seed``
    (of sampling, default 1234), ``max_gen_toks`` (default 256). ``batch_size`` is accepted and
    unused: requests are scored one at a time."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        model=None,
        tokenizer=None,
        device: str | None = "cpu",
        prefix: str = DEFAULT_PREFIX,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        seed: int = 1234,
        max_gen_toks: int = 256,
        batch_size=1,
        max_batch_size=None,
        dtype: str = "float32",
        **unknown,
    ):
        super().__init__()
        if unknown:
            raise ValueError(
                f"model 'drmlab' takes no argument(s) {', '.join(sorted(unknown))}; it takes pretrained, "
                "device, prefix, max_parallel, seed, max_gen_toks, dtype"
            )
        if (pretrained is None) == (model is None):
            raise ValueError(
                "model 'drmlab' needs pretrained=DIR (a drmlab run directory or export), or model= and tokenizer="
            )
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # the harness's command line asks for cuda:0 when --device is not given; like its own
            # Hugging Face model, run on the CPU then (drmlab lm-eval checks --device itself)
            import logging

            logging.getLogger(__name__).warning("device %s requested but CUDA is not available: using the CPU", device)
            device = "cpu"
        if model is None:
            from drmlab.integrations.loading import load_checkpoint_or_export

            loaded = load_checkpoint_or_export(pretrained, device)
            model, tokenizer, self.info = (
                loaded.model,
                loaded.tokenizer,
                {"model": loaded.name, "preset": loaded.preset, "source": loaded.kind, "path": str(loaded.path)},
            )
        else:
            if tokenizer is None:
                raise ValueError("model= needs tokenizer= (a drmlab tokenizer)")
            self.info = {"model": getattr(model, "model_name", None) or getattr(model, "name", type(model).__name__)}
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        self.model = (model.double() if dtype == "float64" else model).eval()
        self.tokenizer = tokenizer
        self.prefix_ids = tokenizer.encode(str(prefix))
        if not self.prefix_ids:
            raise ValueError("prefix must encode to at least one token (it is what the first token is predicted from)")
        if int(max_parallel) < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel = int(max_parallel)
        self.seed = int(seed)
        self.max_gen_toks = int(max_gen_toks)
        self.limit = context_limit(self.model)
        self._device = next(iter(self.model.parameters())).device

    def get_model_info(self) -> dict:
        return {**self.info, "context_limit": self.limit, "prefix": self.tokenizer.decode(self.prefix_ids)}

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name

    # -- requests

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of the context and of the continuation as they are tokenised together (trailing
        spaces of the context belong to the continuation, as in the harness's Hugging Face model)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        return context_ids, whole[len(context_ids) :]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for request in _progress(requests, "loglikelihood", disable_tqdm):
            context, continuation = request.args[0], request.args[1]
            if context:
                context_ids, continuation_ids = self._encode_pair(context, continuation)
            else:
                context_ids, continuation_ids = list(self.prefix_ids), self.tokenizer.encode(continuation)
            if not continuation_ids:
                raise ValueError(f"the continuation {continuation!r} encodes to no tokens")
            ids = context_ids + continuation_ids
            if self.limit is not None:
                if len(continuation_ids) > self.limit:
                    raise ValueError(
                        f"a continuation of {len(continuation_ids)} tokens exceeds the model's {self.limit} positions"
                    )
                ids = ids[-(self.limit + 1) :]
            score = score_tokens(self.model, ids, len(ids) - len(continuation_ids), max_parallel=self.max_parallel)
            result = (-score.nats, score.greedy)
            self.cache_hook.add_partial("loglikelihood", (context, continuation), result)
            results.append(result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for request in _progress(requests, "loglikelihood_rolling", disable_tqdm):
            text = request.args[0]
            ids = list(self.prefix_ids) + self.tokenizer.encode(text)
            if len(ids) == len(self.prefix_ids):
                results.append(0.0)
                continue
            score = score_tokens(
                self.model, ids, len(self.prefix_ids), window=self.limit, max_parallel=self.max_parallel
            )
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), -score.nats)
            results.append(-score.nats)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        results = []
        for request in _progress(requests, "generate_until", disable_tqdm):
            context, kwargs = request.args[0], dict(request.args[1] or {})
            results.append(self.continue_text(context, kwargs))
            self.cache_hook.add_partial("generate_until", request.args, results[-1])
        return results

    @torch.no_grad()
    def continue_text(self, context: str, gen_kwargs: dict) -> str:
        """The continuation of ``context`` under the harness's generation arguments (``until``,
        ``max_gen_toks``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``), stop string cut off."""
        until = gen_kwargs.pop("until", None)
        until = [until] if isinstance(until, str) else list(until or [])
        max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = bool(gen_kwargs.pop("do_sample", False))
        temperature = float(gen_kwargs.pop("temperature", 1.0 if do_sample else 0.0))
        temperature = temperature if do_sample else 0.0
        top_k, top_p = gen_kwargs.pop("top_k", None), gen_kwargs.pop("top_p", None)
        seed = int(gen_kwargs.pop("seed", self.seed))
        ids = self.tokenizer.encode(context) or list(self.prefix_ids)
        if self.limit is not None:  # keep room for the continuation in the position table
            max_new = min(max_new, self.limit - 1)
            ids = ids[-(self.limit - max_new) :]
        generator = torch.Generator().manual_seed(seed)
        logits, state = prefill_long(self.model, ids, self.max_parallel)
        eot = getattr(self.tokenizer, "eot_id", None)
        new: list[int] = []
        text = ""
        for _ in range(max_new):
            token = sample_next(
                logits,
                generator,
                temperature,
                None if top_k is None else int(top_k),
                None if top_p is None else float(top_p),
            )
            if eot is not None and int(token[0]) == eot:
                break
            new.append(int(token[0]))
            text = self.tokenizer.decode(new)
            if any(stop and stop in text for stop in until):
                break
            logits, state = self.model.step(token, state)
        cuts = [text.index(stop) for stop in until if stop and stop in text]
        return text[: min(cuts)] if cuts else text


def register() -> None:
    """Register :class:`DrmlabLM` as the harness model ``drmlab`` (runs on import; a second import
    keeps the first registration)."""
    from lm_eval.api.registry import model_registry

    if "drmlab" not in model_registry:
        register_model("drmlab")(DrmlabLM)


def _progress(requests, what: str, disable: bool):
    if disable or len(requests) < 2:
        return requests
    from tqdm.auto import tqdm

    return tqdm(requests, desc=f"drmlab {what}", leave=False)


# ---------------------------------------------------------------- running tasks


class TaskUnavailableError(OSError):
    """A task cannot be built here (unknown, or its data needs the network while offline); one line."""


def _offline() -> bool:
    import os

    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def task_manager(tasks: list[str], include_path: list[str] | None = None):
    """A harness ``TaskManager`` that knows ``tasks``: the include paths alone when they define every
    task (no scan of the harness's thousands of built-in tasks), else with the built-in ones too.
    An unknown task raises :class:`TaskUnavailableError` with the nearest name."""
    from lm_eval.tasks import TaskManager

    from drmlab.naming import suggest

    paths = [str(Path(p)) for p in (include_path or [])]
    for p in paths:
        if not Path(p).exists():
            raise FileNotFoundError(f"--include-path {p} does not exist")
    manager = TaskManager(include_path=paths, include_defaults=False) if paths else None
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=paths or None)
    missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        raise TaskUnavailableError(
            f"unknown task {missing[0]!r}{suggest(missing[0], manager.all_tasks)}; "
            "`lm-eval ls tasks` lists the harness's tasks, --include-path adds your own YAML"
        )
    return manager


def load_tasks(tasks: list[str], manager) -> list:
    """The harness's task (or group) objects for ``tasks``, their data loaded; a task whose data needs
    the network while it is unreachable (or HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set) raises
    :class:`TaskUnavailableError` naming it, in one line."""
    loaded = []
    for task in tasks:
        try:
            built = manager.load([task])
        except Exception as exc:  # datasets / huggingface_hub raise many kinds for a missing network
            text = f"{type(exc).__name__}: {exc}".splitlines()[0]
            network = any(
                w in text.lower()
                for w in (
                    "offline",
                    "connection",
                    "network",
                    "couldn't reach",
                    "resolve",
                    "timed out",
                    "internet",
                    "hub",
                )
            )
            if network or _offline():
                where = "switched off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE)" if _offline() else "unreachable"
                raise TaskUnavailableError(
                    f"task {task!r} needs its data from the network, which is {where} ({text[:160]}); run it once "
                    "online to fill the Hugging Face cache, or give a local task with --include-path"
                ) from None
            raise
        loaded.extend(built["groups"].values() if built["groups"] else built["tasks"].values())
    return loaded


def evaluate(
    ckpt,
    tasks: list[str],
    *,
    include_path: list[str] | None = None,
    num_fewshot: int | None = None,
    limit: float | None = None,
    device: str = "cpu",
    model_args: dict | None = None,
    seed: int = 1234,
    log_samples: bool = False,
) -> dict:
    """Run the harness tasks ``tasks`` on ``ckpt`` (a drmlab run directory or export, or a
    :class:`DrmlabLM`); returns the harness's results dict (``results["results"][task][metric]``).

    This is the harness's ``simple_evaluate`` without its environment report (which lists every
    installed package through subprocesses, seconds per call): the same few-shot rule (``num_fewshot``
    replaces a task's own unless the task fixes 0), the same seeds (Python, numpy, torch, few-shot)."""
    import random

    import numpy as np
    from lm_eval import evaluator

    lm = ckpt if isinstance(ckpt, DrmlabLM) else DrmlabLM(str(ckpt), device=device, seed=seed, **(model_args or {}))
    manager = task_manager(tasks, include_path)
    loaded = manager.load(load_tasks(tasks, manager))
    for task in loaded["tasks"].values():
        own = task.get_config("num_fewshot")
        if num_fewshot is not None and own != 0:
            task.set_config(key="num_fewshot", value=int(num_fewshot))
        elif own is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    results = evaluator.evaluate(lm=lm, task_dict=loaded, limit=limit, log_samples=log_samples)
    results["config"] = {
        "model": "drmlab",
        **lm.get_model_info(),
        "num_fewshot": num_fewshot,
        "limit": limit,
        "seed": seed,
    }
    return results


def main(argv: list[str] | None = None) -> None:
    """The harness's own command line with the ``drmlab`` model registered:
    ``python -m drmlab.integrations.lm_eval_adapter --model drmlab --model_args pretrained=DIR --tasks ...``."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":  # python -m: run the imported module's main, which registers its own class
    from drmlab.integrations import lm_eval_adapter

    lm_eval_adapter.main()
else:
    register()
