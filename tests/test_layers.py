"""The launcher's shape, read from its source with ``ast``: imports point down the layers, and a
framework is known by name only in its own folder, the framework registry and the version table.

Layers, bottom up (DESIGN.md, "Layers"): a package may import its own modules and those of the
layers below it, never a layer above nor a sibling of its own layer (torch never imports mpi).
The package root (``launcher/__init__.py``) holds only ``__version__``: every layer may read it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"
FRAMEWORK_NAMES = ("torch", "mpi", "jax", "xgboost")

# Bottom up. ``frameworks.py`` (the registry) and ``progress.py`` (imported by users' programs)
# import nothing of the launcher: any layer may read them. ``runner`` is stdlib-only code loaded
# into the user's interpreter; it sits above core, below the services.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"frameworks", "progress"}),
    frozenset({"core"}),
    frozenset({"runner"}),
    frozenset({"status", "local"}),
    frozenset({"initializers", "smoke"}),
    frozenset({"export"}),  # the step after a job: over the initializers' storage, under the frameworks
    frozenset(FRAMEWORK_NAMES),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
LAYER_OF = {part: index for index, layer in enumerate(LAYERS) for part in layer}

# A framework named outside its folder is knowledge of it that a new framework would have to
# copy: these two files are where that knowledge belongs. The registry says what the rest of the
# launcher needs to know (its command module, the marks of its library in frames and output); the
# version table says which releases of its library (a distribution name: torch, jax, xgboost,
# mpi4py) users may bring, and is loaded by path into the runners, so it stays a table of its own.
ALLOWED_NAMERS = 2
# Folders that use a framework's library itself, not the launcher's package for it: the
# preflight measures the node with torch (matmul, gloo and NCCL all-reduce, copies), and its
# cross-node half is a torch program (``trainer-launcher torch -- -m launcher.smoke``). Such a
# folder may still not import the framework's package (the layer test below says so).
LIBRARY_USERS = {"torch": ("smoke",)}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """Every launcher module ``module`` imports, at any depth (inside functions too), with its
    line: ``from launcher import x`` is ``launcher.x``; ``importlib.import_module("launcher.x")``
    with a constant counts as an import of ``launcher.x``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base == "launcher":
                found += [(node.lineno, f"launcher.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == "launcher" or name.startswith("launcher.")]


def _part(module: str) -> str | None:
    """The layer part a launcher module belongs to (``launcher.status.hang`` -> ``status``); None
    for the package root and what it holds (``__version__``)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] == "__version__":
        return None
    return parts[1]


def _violations() -> list[str]:
    found = []
    for module, path in _modules():
        here = _part(module)
        if here is None:
            continue
        for line, target in _imports(module, path):
            there = _part(target)
            if there is None or there == here:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
            if here not in LAYER_OF or there not in LAYER_OF:
                found.append(f"{where} ({here if here not in LAYER_OF else there} is in no layer of LAYERS)")
            elif LAYER_OF[there] >= LAYER_OF[here]:
                found.append(f"{where} ({there} is not below {here})")
    return found


def test_core_imports_nothing_above_it():
    above = [v for v in _violations() if v.startswith("launcher/core/")]
    assert above == [], "\n".join(above)


def test_every_import_points_down_the_layers():
    problems = _violations()
    assert problems == [], "\n".join(problems)


def _mentions(name: str) -> list[str]:
    """Files under launcher/ outside ``launcher/<name>/`` whose text names ``name`` as a word, in
    any case (code, strings, comments alike): ``launcher.torch.plan``, ``JAX's`` and ``Open MPI``
    name one; ``torchrun``, ``mpi4py`` and ``JAX_PROCESS_ID`` do not (a letter, digit or ``_``
    continues the word)."""
    word = re.compile(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", re.IGNORECASE)
    exempt = (name, *LIBRARY_USERS.get(name, ()))
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        relative = path.relative_to(PACKAGE)
        if not path.is_file() or "__pycache__" in relative.parts or relative.parts[0] in exempt:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if word.search(text):
            found.append(str(path.relative_to(PACKAGE.parent)))
    return found


# ids not the bare name: pytest-mpi skips a test whose keywords hold "mpi"
@pytest.mark.parametrize("name", FRAMEWORK_NAMES, ids=[f"{name}-by-name" for name in FRAMEWORK_NAMES])
def test_a_framework_is_named_in_at_most_two_files_outside_its_folder(name):
    named = _mentions(name)
    assert len(named) <= ALLOWED_NAMERS, f"{name} is named outside launcher/{name}/ in: {', '.join(named)}"
