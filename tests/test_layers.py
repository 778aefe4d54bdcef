"""The launcher's shape, read from its source with ``ast``: imports point down the layers, and a
framework is known by name only in its own folder, the framework registry and the version table.

Layers, bottom up (DESIGN.md, "Layers"): a package may import its own modules and those of the
layers below it, never a layer above nor a sibling of its own layer (torch never imports mpi).
The package root (``launcher/__init__.py``) holds only ``__version__``: every layer may read it.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
import tomllib
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
    frozenset({"status", "local", "k8s"}),  # k8s: the pod's own requests to the API server (in-place restart)
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


# --- loads by path: the code that runs in the user's interpreter ---------------------------------

# What the launcher starts in the user's interpreter by path, or puts first on its PYTHONPATH: the
# runners (the thin one, the JAX and XGBoost processes, a rank under Accelerate on CPU) and the
# ranks' hooks. What these load by path, at any depth, runs there too.
IN_THE_USERS_INTERPRETER = (
    "runner/program.py", "runner/hook/*.py", "torch/hook/*.py",
    "jax/run.py", "xgboost/run.py", "torch/accelerate_run.py", "torch/standby.py",
)
# The Python those files must run on at the oldest (ruff.toml's per-file-target-version): the
# runners need 3.10's library, and the hooks, which run in every interpreter a rank starts, 3.8.
USERS_PYTHON = "py310"


def _path_parts(node: ast.AST, constants: dict[str, ast.AST]) -> list[str] | None:
    """The path an expression builds, as parts relative to the file's folder: ``"x.py"``,
    ``os.path.join(os.pardir, "core", "crash.py")``, a module constant holding one, and
    ``os.path.join(os.path.dirname(os.path.abspath(__file__)), ...)``; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return _path_parts(constants[node.id], constants)
    if isinstance(node, ast.Attribute) and node.attr == "pardir":
        return [".."]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dirname":
        return []  # the folder of __file__: the parts are relative to it already
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
        parts = [_path_parts(arg, constants) for arg in node.args]
        return None if any(part is None for part in parts) else [p for part in parts for p in part]
    return None


def _loads_by_path(path: Path) -> list[tuple[int, Path]]:
    """The launcher files ``path`` loads by path, with the line: ``load_sibling(__file__, PATH,
    ...)``, ``spec_from_file_location(NAME, PATH)``, ``program.core("crash")`` (core/crash.py),
    ``program.records()`` (runner/report.py), and ``from _trainer_launcher_x import ...`` (a
    private module of the launcher's, found by its file name)."""
    tree = ast.parse(path.read_text(), str(path))
    constants = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("_trainer_launcher_"):
            found += [(node.lineno, hit) for hit in PACKAGE.rglob(f"{node.module}.py")]
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        argument = {"load_sibling": 1, "spec_from_file_location": 1}.get(name)
        if argument is not None and len(node.args) > argument:
            parts = _path_parts(node.args[argument], constants)
            if parts is not None:
                found.append((node.lineno, (path.parent / Path(*parts)).resolve()))
        elif name == "core" and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, PACKAGE / "core" / f"{node.args[0].value}.py"))
        elif name == "records" and not node.args:
            found.append((node.lineno, PACKAGE / "runner" / "report.py"))
    return found


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _in_the_users_interpreter() -> dict[Path, str]:
    """Every file that runs in the user's interpreter -> why (an entry, or what loads it)."""
    found = {path: "started there" for pattern in IN_THE_USERS_INTERPRETER for path in PACKAGE.glob(pattern)
             if path.name != "__init__.py"}
    todo = list(found)
    while todo:
        path = todo.pop()
        for line, loaded in _loads_by_path(path):
            if loaded not in found:
                found[loaded] = f"loaded by path at {path.relative_to(PACKAGE.parent)}:{line}"
                todo.append(loaded)
    return found


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """The modules ``path`` imports as it loads by path: at module level, outside ``if
    TYPE_CHECKING`` and ``if __package__`` (the branch taken where it is imported as a package)."""
    tree = ast.parse(path.read_text(), str(path))

    def walk(body: list[ast.stmt]):
        for node in body:
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "__package__", "TYPE_CHECKING or __package__"):
                yield from walk(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    yield from walk(block)
                for handler in getattr(node, "handlers", []):
                    yield from walk(handler.body)
            elif isinstance(node, ast.Import):
                yield from ((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                yield node.lineno, node.module or ""

    return list(walk(tree.body))


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
        by_path = [(line, _module_of(loaded)) for line, loaded in _loads_by_path(path)]
        for line, target in [*_imports(module, path), *by_path]:
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


def test_loads_by_path_are_followed():
    """The test of the layers sees a load by path as an import (a check of the checker)."""
    loads = {path.relative_to(PACKAGE).as_posix() for _, path in _loads_by_path(PACKAGE / "jax" / "run.py")}
    assert {"runner/_trainer_launcher_load.py", "core/crash.py", "core/versions.py", "jax/compat.py",
            "runner/report.py"} <= loads, loads
    assert "runner/program.py" in {p.relative_to(PACKAGE).as_posix()
                                   for _, p in _loads_by_path(PACKAGE / "runner" / "_trainer_launcher_load.py")}


def test_the_code_in_the_users_interpreter_imports_nothing_but_the_standard_library_as_it_loads():
    """The user's interpreter may not have the launcher, nor pydantic, importable: what runs there
    loads the launcher's files by path, and a framework's library only where it is used."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    found = []
    for path, why in sorted(_in_the_users_interpreter().items()):
        for line, name in _runtime_imports(path):
            if name.partition(".")[0] not in allowed and not name.startswith("_trainer_launcher_"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} ({why})")
    assert found == [], "\n".join(found)


def test_the_code_in_the_users_interpreter_is_linted_for_the_oldest_python_it_runs_on():
    """ruff checks each such file against its Python floor: its per-file-target-version entry is
    the users' oldest Python or older, so syntax a newer Python alone has is flagged there."""
    config = tomllib.loads((PACKAGE.parent / "ruff.toml").read_text())["per-file-target-version"]
    unchecked = []
    for path, why in sorted(_in_the_users_interpreter().items()):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        floors = [int(version[3:]) for pattern, version in config.items() if fnmatch.fnmatch(relative, pattern)]
        if not floors or max(floors) > int(USERS_PYTHON[3:]):
            unchecked.append(f"{relative} ({why}): {floors or 'no entry'}")
    assert unchecked == [], "ruff.toml's per-file-target-version misses:\n" + "\n".join(unchecked)
