"""``torch.compile`` for training (``drmlab train --compile``, ``TrainConfig.compile``): compile a
model as one graph, and when it cannot be, say in one line which operation broke the graph and
where (``docs/architecture.md`` section 2, "Compiled models").

The model is compiled with ``fullgraph=True``: a graph break is an error instead of a silent
fall-back to Python between partial graphs, so what trains is what was compiled.  The scans run
inside the custom operators ``drmlab::linear_scan`` and ``drmlab::selective_scan``
(:mod:`drmlab.ops.linear_scan.op`, :mod:`drmlab.ops.selective_scan.op`), one opaque node each;
every registered model compiles this way (``tests/training/test_compile.py``).  Dynamo's errors
(:class:`torch._dynamo.exc.TorchDynamoException`: a graph break, a data-dependent branch, a
backend that failed) become :class:`CompileError`, whose message is one line: the kind of break,
the function or operation it names, and the innermost line of drmlab (or user) code that called
it.
"""

from __future__ import annotations

import contextlib
import re

import torch

__all__ = ["CompileError", "compile_model", "compile_errors", "graph_break_reason", "DEFAULT_BACKEND"]

DEFAULT_BACKEND = "inductor"
# A process that trains several models (a study, a benchmark) compiles the same ``forward`` once per model
# configuration; Dynamo's default limit of 8 per code object would make the ninth a hard failure under
# ``fullgraph=True``. Raised to at least this when a model is compiled.
RECOMPILE_LIMIT = 64
# The training step number reaches the models' forward (the DRM naturalization warm-up). Dynamo would compile
# once for step 1 (the int as a constant) and again at step 2 (the int made dynamic): a second compile of the
# same length (39 s of J tiny's cold 177 s, benchmarks/bench_compile_run.py). Marked dynamic from the first
# call (as the model's own argument, and inside DDP's keyword arguments), one graph serves every step.
STEP_SOURCES = ("L['step']", "L['kwargs']['step']")


class CompileError(RuntimeError):
    """A model could not be compiled as one graph; the message names the operation and the line."""


def compile_model(model: torch.nn.Module, backend: str = DEFAULT_BACKEND) -> torch.nn.Module:
    """``torch.compile(model, fullgraph=True, backend=backend)``.  Compilation happens at the first
    call; wrap that call in :func:`compile_errors` for a one-line error. Raises Dynamo's recompile limit
    to :data:`RECOMPILE_LIMIT` (a study compiles one forward per model) and marks the step argument
    dynamic (:data:`STEP_SOURCES`)."""
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    sources = [s for s in (torch.compiler.config.dynamic_sources or "").split(",") if s]
    torch.compiler.config.dynamic_sources = ",".join(sources + [s for s in STEP_SOURCES if s not in sources])
    return torch.compile(model, fullgraph=True, backend=backend)


_SENTENCE_END = re.compile(r"(?<=[^.]\.)\s+(?=[A-Z])")
_FUNCTION_REPR = re.compile(r"<(?:function|built-in function|method|built-in method) ([\w.]+)[^>]*>")


def _short_path(filename: str) -> str:
    """``.../src/drmlab/models/drm/model.py`` -> ``drmlab/models/drm/model.py``."""
    marker = "/drmlab/"
    at = filename.rfind(marker)
    return filename[at + 1 :] if at >= 0 else filename


def graph_break_reason(exc: BaseException) -> str:
    """One line from a Dynamo error: its kind (``gb_type``, or its first line) with the first
    sentence of its explanation (which names the function or operation; memory addresses
    dropped), and the innermost user frame, ``file:line in function: source``."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kind = (getattr(exc, "gb_type", "") or (lines[0] if lines else type(exc).__name__)).strip()
    detail = ""
    for line in lines:
        if line.startswith("Explanation:"):
            detail = line[len("Explanation:") :].strip()
            break
    if not detail and len(lines) > 1 and not lines[1].startswith(("from user code", "Set TORCHDYNAMO")):
        detail = lines[1]
    detail = _SENTENCE_END.split(_FUNCTION_REPR.sub(r"\1", detail).replace(" (reason: None)", ""))[0]
    if not detail:
        reason = kind
    elif detail.split()[0].lower() == kind.split()[0].lower():  # "Skip calling ..." twice: the specific one
        reason = detail
    else:
        reason = f"{kind}: {detail}"
    stack = getattr(exc, "real_stack", None) or []
    if stack:
        frame = stack[-1]
        where = f"{_short_path(frame.filename)}:{frame.lineno} in {frame.name}"
        source = (frame.line or "").strip()
        reason += f" at {where}" + (f": {source}" if source else "")
    return " ".join(reason.split())


@contextlib.contextmanager
def compile_errors(what: str):
    """Turn a Dynamo error raised inside the block into :class:`CompileError`:
    ``"{what} cannot be compiled as one graph: {graph_break_reason}"``."""
    try:
        yield
    except torch._dynamo.exc.TorchDynamoException as exc:
        raise CompileError(
            f"{what} cannot be compiled as one graph (torch.compile, fullgraph=True): {graph_break_reason(exc)}"
        ) from exc
