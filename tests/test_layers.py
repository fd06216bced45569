"""The layout follows the pipeline: imports run down the layers, never back up, and never hide inside functions.

``LAYERS`` below is the one list of the layers, lowest first; a module may import from its own layer or any lower
one. Every module's imports are read with ``ast`` (module level, ``if TYPE_CHECKING:`` blocks, class bodies, and
inside functions; ``__import__("x")`` and ``importlib.import_module("x")`` with a literal name count too) and three
rules are checked:

1. no import of a project module inside a function: an import deferred to call time hides a dependency from the
   reader (and usually a cycle). The one exception is a module that imports an optional extra at its top
   (``OPTIONAL_EXTRAS``): deferring that module is deferring the extra;
2. no cycle between modules;
3. no import from a lower layer to a higher one; and every module sits in a layer.

A package's ``__init__`` runs before any of its modules, so the ``wfc`` package sits below everything that imports a
``wfc`` module: it cannot import ``compilers`` (the compile shortcut lives in ``compilers``). Implicit parent-package
imports are not edges here (as in import-linter); the rules above keep them safe.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wfc", "compilers", "programs")

# Lowest first. A name matches exactly; "pkg.*" matches every module below pkg; an exact name wins over a pattern,
# a longer pattern over a shorter one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # declare: what a program, a task, a rollout and a verdict are (data, no engine)
    ("data", ("wfc.program", "wfc.rollout", "wfc.verdict", "wfc.retrieve", "wfc.tasks", "wfc.tasks.*")),
    # how a role's call becomes chat messages and a grammar
    ("prompts", ("wfc.adapter", "wfc.constrain")),
    # generate: base models, the trainer's policy (its weights and adapters), the engines behind one protocol
    ("engines", ("wfc.models", "wfc.attention", "wfc.memory", "wfc.adapter_files", "wfc.policy", "wfc.engines",
                 "wfc.engines.*")),
    # lower: run a program on an engine and record its rollout graph; load user programs
    ("lower", ("wfc.lower", "wfc.rolegraph", "wfc.lm", "wfc.imports")),
    # export: the artifact (program + adapters + manifest), its source record, composing its roles; the wfc facade
    ("export", ("wfc.source", "wfc.artifact", "wfc.compose", "wfc")),
    # the workflow topologies
    ("programs", ("programs", "programs.*")),
    # group / score / update: the compile's stages, then the loop over them, then the optimizer and what runs it
    ("compile stages", ("compilers.*",)),
    ("compile loop", ("compilers.loop",)),
    ("optimizer", ("compilers.mmgrpo", "compilers")),
    ("runs of the optimizer", ("compilers.experiment", "compilers.transfer")),
    # the user-facing front: the command line and the server
    ("front", ("wfc.cli", "wfc.flags", "wfc.serve", "wfc.serve_limits")),
]

# module -> the optional third-party package it imports at its top: importing the module inside a function is allowed
OPTIONAL_EXTRAS = {"wfc.engines.vllm": "vllm"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the project module imported
    line: int
    in_function: bool


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, known) -> str | None:
    """The longest prefix of ``name`` that is a project module (``wfc.lower.trace`` -> ``wfc.lower``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def imports(module: str, path: Path, known) -> list[Import]:
    """Every import of a project module in ``path``, with where it stands (module level or inside a function)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: list[Import] = []

    def add(names, line, in_function):
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                out.append(Import(module, target, line, in_function))

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                add([a.name for a in child.names], child.lineno, in_function)
            elif isinstance(child, ast.ImportFrom):
                base = ".".join(package[:len(package) - child.level + 1] + [child.module or ""]).strip(".") \
                    if child.level else child.module
                # ``from pkg import name``: the submodule pkg.name when there is one, else pkg itself
                add([f"{base}.{a.name}" for a in child.names], child.lineno, in_function)
            elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant) \
                    and isinstance(child.args[0].value, str) and ast.unparse(child.func) in (
                        "__import__", "importlib.import_module", "import_module"):
                add([child.args[0].value], child.lineno, in_function)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of the layer ``module`` belongs to (the most specific match), or None."""
    best, rank = None, (-1, -1)
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            exact = pattern == module
            if exact or ("*" in pattern and fnmatch.fnmatchcase(module, pattern)):
                if (exact, len(pattern)) > rank:
                    best, rank = index, (exact, len(pattern))
    return best


def violations(root: Path, packages=PACKAGES, layers=LAYERS, extras=OPTIONAL_EXTRAS) -> list[str]:
    """Every breach of the module doc's rules, one line each."""
    found = modules(root, packages)
    edges = [i for module, path in found.items() for i in imports(module, path, found)]
    out = [f"{m}: in no layer; add it to LAYERS in tests/test_layers.py" for m in found if layer_of(m, layers) is None]
    for i in edges:
        if i.in_function and i.target not in extras:
            out.append(f"{i.source}:{i.line} imports {i.target} inside a function: import it at the top (and move "
                       "code so no cycle needs hiding)")
        low, high = layer_of(i.target, layers), layer_of(i.source, layers)
        if low is not None and high is not None and low > high:
            out.append(f"{i.source}:{i.line} (layer {layers[high][0]!r}) imports {i.target} from the higher layer "
                       f"{layers[low][0]!r}")
    graph = nx.DiGraph((i.source, i.target) for i in edges)
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            out.append("import cycle: " + " -> ".join([a for a, _ in cycle] + [cycle[0][0]]))
    for module, extra in extras.items():
        if module in found and extra not in _top_imports(found[module]):
            out.append(f"{module} is listed in OPTIONAL_EXTRAS but does not import {extra} at its top")
    return out


def _top_imports(path: Path) -> set[str]:
    """The top-level package names a module imports at module level (``from vllm.lora import x`` -> ``vllm``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_imports_run_down_the_layers():
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_every_layer_names_modules_that_exist():
    found = modules(ROOT)
    stale = [p for _, patterns in LAYERS for p in patterns
             if not any(m == p or ("*" in p and fnmatch.fnmatchcase(m, p)) for m in found)]
    assert stale == []


# ----- the checker catches what it is for (a planted tree) ----------------------------------------------------------
PLANTED_LAYERS = [("low", ("pkg.low", "pkg.extra")), ("high", ("pkg.high", "pkg"))]


def _plant(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in {"pkg/__init__.py": "", "pkg/extra.py": "import vllm\n", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return violations(tmp_path, ("pkg",), PLANTED_LAYERS, {"pkg.extra": "vllm"})


def test_a_clean_tree_passes(tmp_path):
    assert _plant(tmp_path, {"pkg/low.py": "X = 1\n", "pkg/high.py": "from pkg.low import X\n\n\ndef f():\n"
                                                                      "    from pkg import extra\n"}) == []


@pytest.mark.parametrize("files, expected", [
    ({"pkg/low.py": "from pkg.high import Y\n", "pkg/high.py": "Y = 1\n"}, "from the higher layer 'high'"),
    ({"pkg/low.py": "def f():\n    from pkg import high\n", "pkg/high.py": ""}, "inside a function"),
    ({"pkg/low.py": "f = lambda: __import__('pkg.high')\n", "pkg/high.py": ""}, "inside a function"),
    ({"pkg/low.py": "", "pkg/high.py": "import pkg.other\n", "pkg/other.py": "import pkg.high\n"}, "in no layer"),
    ({"pkg/low.py": "", "pkg/high.py": "from . import other\n", "pkg/other.py": "from pkg import high\n"},
     "import cycle"),
])
def test_a_planted_violation_is_reported(tmp_path, files, expected):
    found = _plant(tmp_path, files)
    assert any(expected in line for line in found), found
