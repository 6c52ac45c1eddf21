"""The package graph: imports flow one way, counting imports inside functions.

``LAYERS`` below is the one statement of the layering; docs/architecture.md section 1 prints it (checked
here) and the README links there. A module may import its own package, any package of a lower layer,
and a package of its own layer only while the graph of those same-layer imports has no loop. Inside a
package the files import one another one way too: no circle of files (:func:`_circles`).
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


def _import_statements(text: str, module: str, is_package: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, the drmlab module named, the names taken from it) of every import in the source ``text`` of
    ``module``, anywhere (function bodies included), relative ones made absolute; ``import a.b`` takes no name."""
    here = module.split(".")
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "drmlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "drmlab":
                found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def _imports(text: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every drmlab module that the source ``text`` of ``module`` imports, anywhere (function bodies included)."""
    found = []
    for line, target, names in _import_statements(text, module, is_package):
        if target == "drmlab" and names:  # ``from drmlab import x``: x is a subpackage or a root name
            found += [(line, f"drmlab.{name}") for name in names]
        else:
            found.append((line, target))
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


# -- no circle of files: inside each package (its subfolders included) the files import one another one way


def _file_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module -> {each module of its own package that it imports: the line}, from ``sources`` (module ->
    (its source, whether it is a package's ``__init__``)). ``from X import a`` imports the module ``X.a``
    where there is one (``from . import batches``: the module batches), else ``X`` (a package: its
    ``__init__``); a parent package's ``__init__`` that runs on the way to a module is not counted, and
    an import of another package is the layering's business."""
    graph: dict[str, dict[str, int]] = {}
    for module, (text, is_package) in sources.items():
        graph[module] = arrows = {}
        for line, target, names in _import_statements(text, module, is_package):
            for imported in [f"{target}.{n}" if f"{target}.{n}" in sources else target for n in names] or [target]:
                if imported in sources and imported != module and _package(imported) == _package(module):
                    arrows.setdefault(imported, line)
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every circle of ``graph``: the modules (two or more, sorted) that all reach one another."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {module: reach(module) for module in graph}
    circles = {tuple(sorted(n for n in reached[m] if m in reached[n])) for m in graph if m in reached[m]}
    return sorted(list(c) for c in circles if len(c) > 1)


def test_no_circle_of_files_inside_a_package():
    paths = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    graph = _file_graph({m: (p.read_text(), p.name == "__init__.py") for m, p in paths.items()})
    found = []
    for circle in _circles(graph):
        found.append("circle: " + ", ".join(paths[m].relative_to(SRC.parent).as_posix() for m in circle))
        found += [
            f"  {paths[m].relative_to(SRC.parent).as_posix()}:{line} imports {n}"
            for m in circle
            for n, line in graph[m].items()
            if n in circle
        ]
    assert not found, "files that import each other (cut the circle: imports flow one way):\n" + "\n".join(found)


def test_the_circle_rule_sees_a_planted_circle():
    """A lazy absolute import, ``from . import b`` (the module b) and ``from ..a`` close a circle of three
    files; a name of a package's face (``from . import TABLE``) ties a file to that ``__init__``; one-way
    imports, a parent ``__init__`` run on the way and a loop through another package are no circle."""
    planted = {
        "drmlab.ops": ("from .a import f\nfrom .d import g\n", True),
        "drmlab.ops.a": ("from . import b\n", False),
        "drmlab.ops.b": ("def g():\n    from drmlab.ops.sub import c\n", False),
        "drmlab.ops.sub": ("from .c import h\n", True),
        "drmlab.ops.sub.c": ("from ..a import f\n", False),
        "drmlab.ops.d": ("from .a import f\nfrom .sub.c import h\nimport drmlab.models.x\n", False),
        "drmlab.ops.w": ("from .k import K\nTABLE = {}\n", True),
        "drmlab.ops.w.k": ("from . import TABLE\n", False),
        "drmlab.models": ("", True),
        "drmlab.models.x": ("from drmlab.ops import d\n", False),
    }
    graph = _file_graph(planted)
    assert graph["drmlab.ops.a"] == {"drmlab.ops.b": 1} and graph["drmlab.ops.w.k"] == {"drmlab.ops.w": 1}
    assert _circles(graph) == [["drmlab.ops.a", "drmlab.ops.b", "drmlab.ops.sub.c"], ["drmlab.ops.w", "drmlab.ops.w.k"]]
    planted["drmlab.ops.b"] = ("def g():\n    pass\n", False)
    planted["drmlab.ops.w.k"] = ("TABLE = {}\n", False)
    assert _circles(_file_graph(planted)) == []


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
