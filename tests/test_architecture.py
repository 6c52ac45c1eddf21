"""The package graph: imports flow one way, counting imports inside functions.

``LAYERS`` below is the one statement of the layering; docs/architecture.md section 1 prints it (checked
here) and the README links there. A module may import its own package, any package of a lower layer,
and a package of its own layer only while the graph of those same-layer imports has no loop.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import drmlab

SRC = Path(drmlab.__file__).resolve().parent

LAYERS = {
    "naming": 0,
    "presets": 0,
    "devices": 0,
    "ops": 1,
    "resolvent": 2,
    "models": 3,
    "data": 3,
    "runs": 4,
    "training": 5,
    "evaluation": 5,
    "generation": 5,
    "geometry": 5,
    "integrations": 6,
    "hf": 6,
    "experiments": 7,
    "cli": 8,
    "__main__": 9,  # python -m drmlab: the command line without its installed script
}


def _package(module: str) -> str | None:
    """``drmlab.models.drm.model`` -> ``models``; the root package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "drmlab" else None


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(text: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every drmlab module that the source ``text`` of ``module`` imports, anywhere (function bodies included)."""
    tree = ast.parse(text)
    here = module.split(".")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "drmlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "drmlab":
                if target == "drmlab":  # ``from drmlab import x``: x is a subpackage or a root name
                    found += [(node.lineno, f"drmlab.{a.name}") for a in node.names]
                else:
                    found.append((node.lineno, target))
    return found


def _edges():
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        source = _package(_module_name(path))
        if source is None:  # drmlab/__init__.py: the facade over everything
            continue
        for line, target in _imports(path.read_text(), _module_name(path), path.name == "__init__.py"):
            dest = _package(target)
            if dest is not None and dest != source and dest in LAYERS:
                edges.append((source, dest, f"{path.relative_to(SRC.parent)}:{line} imports {target}"))
    return edges


def test_every_package_has_a_layer():
    packages = {
        p.stem if p.is_file() else p.name
        for p in SRC.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").is_file())
    }
    assert packages == set(LAYERS), (
        f"packages without a layer: {packages - set(LAYERS)}; stale: {set(LAYERS) - packages}"
    )


def test_no_import_goes_up_a_layer():
    upward = [why for source, dest, why in _edges() if LAYERS[dest] > LAYERS[source]]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_no_loop_between_packages():
    graph = defaultdict(set)
    for source, dest, _ in _edges():
        graph[source].add(dest)

    def reaches(start, goal, seen=()):
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen + (nxt,))) for nxt in graph[start])

    loops = sorted(p for p in list(graph) if reaches(p, p))
    assert not loops, f"packages in an import loop: {loops}; edges: {dict(graph)}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    text = (
        "def f():\n    from drmlab.cli import main\n    import drmlab.training.trainer\n"
        "from ..runs import RunDir\nfrom . import batches\nfrom drmlab import data\n"
    )
    found = sorted(t for _, t in _imports(text, "drmlab.training.trainer"))
    assert found == ["drmlab.cli", "drmlab.data", "drmlab.runs", "drmlab.training", "drmlab.training.trainer"]


# -- one trainer: the optimizer step, the gradient and the signal handlers live in drmlab/training/ (and runs)
TRAINING_HOMES = ("drmlab/training/", "drmlab/runs")


def _training_calls(text: str) -> list[tuple[int, str]]:
    """Calls that make a training loop or take over signals: ``x.zero_grad(...)``, ``x.step()`` without
    arguments (an optimizer's or a scheduler's step), ``x.backward()`` with at most one positional
    argument (a tensor's; the scan operators' own ``backward(f, m, ...)`` functions take many),
    ``torch.autograd.backward(...)`` and ``signal.signal(...)`` (also imported under another name)."""
    tree = ast.parse(text)
    signal_modules, signal_functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            signal_modules |= {a.asname or a.name for a in node.names if a.name == "signal"}
        elif isinstance(node, ast.ImportFrom) and node.module == "signal":
            signal_functions |= {a.asname or a.name for a in node.names if a.name == "signal"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in signal_functions:
            found.append((node.lineno, "signal.signal"))
        if not isinstance(func, ast.Attribute):
            continue
        owner = ast.unparse(func.value)
        if func.attr == "zero_grad":
            found.append((node.lineno, f"{owner}.zero_grad"))
        elif func.attr == "step" and not node.args and all(k.arg == "closure" for k in node.keywords):
            found.append((node.lineno, f"{owner}.step()"))
        elif func.attr == "backward" and (owner in ("torch.autograd", "autograd") or len(node.args) <= 1):
            found.append((node.lineno, f"{owner}.backward"))
        elif func.attr == "signal" and owner in signal_modules:
            found.append((node.lineno, "signal.signal"))
    return found


def test_no_training_loop_or_signal_handler_outside_training():
    outside = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        if rel.startswith(TRAINING_HOMES):
            continue
        outside += [f"{rel}:{line} calls {what}" for line, what in _training_calls(path.read_text())]
    assert not outside, (
        "an optimizer step, a gradient or a signal handler outside drmlab/training/ (a study "
        "brings a loss, an optimizer builder, a batch source and hooks to train() instead):\n" + "\n".join(outside)
    )


def test_the_training_rule_sees_a_planted_loop_and_spares_the_operators():
    planted = (
        "import signal as sg\nfrom signal import signal as on\n"
        "def fit(model, opt, batches):\n    for x in batches:\n        loss = model(x).sum()\n"
        "        loss.backward()\n        opt.step()\n        opt.zero_grad(set_to_none=True)\n"
        "    torch.autograd.backward([loss], [g])\n    sg.signal(sg.SIGINT, print)\n    on(2, print)\n"
    )
    assert sorted(what for _, what in _training_calls(planted)) == [
        "loss.backward",
        "opt.step()",
        "opt.zero_grad",
        "signal.signal",
        "signal.signal",
        "torch.autograd.backward",
    ]
    spared = (
        "du, df, _ = impl.backward(f, m, init, dm, need_f, False)\nout = model(x, step=3)\n"
        "schedule.step(4)\ng = torch.autograd.grad(y.sum(), x)\n"
    )
    assert _training_calls(spared) == []


def render_layers(layers: dict[str, int] = LAYERS) -> str:
    """The layer table as docs/architecture.md prints it: one line per layer, top down, names sorted."""
    by_layer = defaultdict(list)
    for name, layer in layers.items():
        by_layer[layer].append(name)
    return "\n".join(f"{layer}  {' | '.join(sorted(by_layer[layer]))}" for layer in sorted(by_layer, reverse=True))


def test_the_docs_print_the_one_layering():
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    begin, end = "<!-- layers: begin", "<!-- layers: end -->"
    block = text[text.index(begin) : text.index(end)]
    printed = block.split("```text\n", 1)[1].split("```", 1)[0].strip()
    assert printed == render_layers(), f"docs/architecture.md section 1 must print:\n{render_layers()}"
    readme = (SRC.parents[1] / "README.md").read_text()
    assert "docs/architecture.md" in readme and "Imports flow one way: `ops` <-" not in readme
