"""The compatibility matrix's interpreters: one virtual environment per framework version, built
once per machine into a cache directory keyed by the version, and shared by every later run.

    python -m tests.matrix_envs            build whatever is missing (CI runs this before pytest)
    python -m tests.matrix_envs --list     each environment, whether it is built, and its size

The launcher itself is not installed into them: the tests put the checkout on PYTHONPATH, as
an image that copies the package in would. Each environment gets only what a user's image would
have beside our own two dependencies (pydantic-settings, psutil): the framework at one version.

Disk: a CUDA build of torch is about 6.5 GB installed, most of it `nvidia-*` libraries. Files
that are byte-identical across environments (the same `nvidia-*` wheel pulled by two torch
versions) are hard-linked into one copy after each build (uv links its cache's files in too), so
the cache holds each distinct file once. ``--list`` prints what it takes.

An environment is complete only once its marker file exists (written last, atomically); a
half-built one (a killed build) is removed and built again. A lock file serialises builders.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("TRAINER_LAUNCHER_MATRIX_CACHE", Path.home() / ".cache" / "trainer-launcher-matrix"))
MARKER = ".trainer-launcher-matrix-complete"
# What every environment holds besides the framework: the launcher's own dependencies.
BASE = ["pydantic-settings>=2.7", "psutil>=5.9"]


@dataclass(frozen=True)
class Env:
    """One interpreter of the matrix: a framework at one version, with what it needs."""

    framework: str
    version: str
    packages: tuple[str, ...]
    # torch above this machine's pip cap (/etc/xdg/pip/constraints.txt) comes from PyPI itself.
    uncapped: bool = False
    # mpi4py 3.1 has no wheel: built from source against an MPI's headers (see _build_mpi4py).
    mpi4py_source: bool = False
    extra_env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # Another environment of the matrix whose packages this one sees (a .pth file): a library
    # over a framework (accelerate over torch) costs its own wheels only.
    base: str | None = None

    @property
    def name(self) -> str:
        return f"{self.framework}-{self.version}"

    @property
    def path(self) -> Path:
        return CACHE / self.name

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def built(self) -> bool:
        return (self.path / MARKER).is_file()


# torch 2.4.x was built against numpy 1.x; later ones take numpy 2.
ENVS: dict[str, Env] = {env.name: env for env in [
    Env("torch", "2.4.1", ("torch==2.4.1", "numpy<2")),
    Env("torch", "2.8.0", ("torch==2.8.0", "numpy")),
    Env("torch", "2.15.0", ("torch==2.15.0", "numpy"), uncapped=True),
    Env("jax", "0.5.3", ("jax[cpu]==0.5.3",)),
    Env("jax", "0.7.2", ("jax[cpu]==0.7.2",)),
    Env("xgboost", "2.1.4", ("xgboost-cpu==2.1.4",)),
    Env("mpi4py", "3.1.6", ("mpi4py==3.1.6",), mpi4py_source=True),
    # The oldest accelerate supported, over the oldest torch (their releases are a month apart).
    Env("accelerate", "1.0.1", ("accelerate==1.0.1",), base="torch-2.4.1"),
    # Below the supported range, for the version gate's test (tests/test_matrix_accelerate.py).
    Env("accelerate-below-range", "0.34.2", ("accelerate==0.34.2",), base="torch-2.4.1"),
]}


def interpreters(framework: str, ensure_built: bool = True) -> list[tuple[str, str]]:
    """Every interpreter of the matrix for ``framework``, oldest first, as ``(id, python)``: the
    cached environments, and the test environment itself (it holds the pinned, newest release:
    torch 2.13 from this machine's wheel, jax, xgboost and mpi4py from pyproject's test extra).
    The id is ``framework-version``, the test ids the compatibility table is read from."""
    from importlib import metadata

    found = [(env.name, (ensure(env.name) if ensure_built else env).python)
             for env in ENVS.values() if env.framework == framework]
    distribution = {"xgboost": "xgboost-cpu"}.get(framework, framework)
    try:
        found.append((f"{framework}-{metadata.version(distribution).split('+')[0]}", sys.executable))
    except metadata.PackageNotFoundError:
        pass
    return sorted(found, key=lambda item: _release(item[0].rsplit("-", 1)[1]))


def python_fixture(framework: str):
    """A pytest fixture, ``python``, over every interpreter of ``framework`` (module-scoped, ids
    ``framework-version``): it builds a missing environment once, then gives its interpreter."""
    import pytest

    found = interpreters(framework, ensure_built=False)

    @pytest.fixture(scope="module", params=found, ids=[name for name, _ in found])
    def python(request) -> str:
        name, interpreter = request.param
        if interpreter != sys.executable:
            ensure(name)
        return interpreter

    return python


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _pip(env: Env, *args: str) -> None:
    if _with_uv(env, args):
        return
    run_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
               "PIP_NO_CACHE_DIR": "1"}
    if env.uncapped:
        run_env["PIP_CONFIG_FILE"] = os.devnull
    subprocess.run([env.python, "-m", "pip", "install", "-q", *args], env=run_env, check=True)


def _with_uv(env: Env, requirements: tuple[str, ...]) -> bool:
    """Install with the uv that tests/install.py put beside this interpreter, given pip's own
    configuration, as there: it downloads and unpacks a CUDA torch's ~20 wheels in parallel where pip
    takes them one after another, and hard-links from its cache. An uncapped environment leaves
    out pip's constraints (the cap). False where uv is missing or fails: pip then installs. An
    environment over a base installs with pip: uv does not count the packages the base's .pth file
    adds as installed, and put a torch of its own under accelerate 1.0.1 (2.14.1+cu130, not 2.4.1)."""
    if env.base:
        return False
    try:
        from tests.install import uv_install  # python -m tests.matrix_envs
    except ImportError:
        from install import uv_install  # imported by the tests (tests/ on sys.path)
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        return False
    if not uv_install(uv, env.python, requirements, constraints=not env.uncapped):
        print(f"tests.matrix_envs: uv failed for {env.name}; installing with pip", file=sys.stderr)
        return False
    return True


def _build_mpi4py(env: Env) -> None:
    """mpi4py 3.1 compiles against one MPI: Open MPI 5's wheel (the matrix runs it there). Its
    build needs setuptools<70 and the MPI's mpicc on PATH; pip's isolation would hide both."""
    prefix = Path(os.environ.get("TRAINER_LAUNCHER_OPENMPI5", "/opt/mpi/openmpi5"))
    _pip(env, "setuptools<70", "wheel", "Cython<3")
    mpicc = next((str(p) for p in [prefix / "bin" / "mpicc"] if p.exists()), None)
    build_env = {**os.environ, "PATH": f"{prefix / 'bin'}:{os.environ['PATH']}", "PIP_NO_CACHE_DIR": "1",
                 "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore"}
    if mpicc:
        build_env["MPICC"] = mpicc
    subprocess.run([env.python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-binary", "mpi4py",
                    *env.packages], env=build_env, check=True)


def ensure(name: str) -> Env:
    """The environment, built if it is not yet (minutes for torch; nothing once cached)."""
    env = ENVS[name]
    if env.built():
        return env
    if env.base:
        ensure(env.base)  # before the lock, which it takes itself
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if env.built():
            return env
        shutil.rmtree(env.path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env.path)], check=True)
        if env.base:
            (_site_packages(env.path) / "trainer-launcher-matrix-base.pth").write_text(
                f"{_site_packages(ENVS[env.base].path)}\n")
        _pip(env, *BASE, *([] if env.mpi4py_source else env.packages))
        if env.mpi4py_source:
            _build_mpi4py(env)
        _share_identical_files()
        _let_others_run(env.path)
        marker = env.path / f"{MARKER}.tmp"
        marker.write_text(" ".join(env.packages) + "\n")
        marker.rename(env.path / MARKER)
    return env


def _site_packages(path: Path) -> Path:
    return next(path.glob("lib/python3*/site-packages"))


def _let_others_run(path: Path) -> None:
    """The MPI tests run ranks as an unprivileged user over sshd: let others traverse (not list)
    every directory down to the environment, as .ci/install-mpi does for the test venv."""
    for directory in [path, *path.parents]:
        if directory == Path("/"):
            break
        try:
            directory.chmod(directory.stat().st_mode | 0o001)
        except OSError:
            return


def _share_identical_files() -> None:
    """Hard-link byte-identical files across the cache (the nvidia-* wheels torch versions share)."""
    if shutil.which("hardlink"):
        subprocess.run(["hardlink", "-q", str(CACHE)], check=False, stdout=subprocess.DEVNULL)


def size_bytes() -> int:
    """What the cache takes on disk, each hard-linked file once."""
    seen: set[int] = set()
    total = 0
    for root, _, files in os.walk(CACHE):
        for name in files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                total += stat.st_blocks * 512
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.matrix_envs")
    parser.add_argument("--list", action="store_true", help="say what is built and the cache's size")
    parser.add_argument("names", nargs="*", help=f"environments to build (default: all): {', '.join(ENVS)}")
    args = parser.parse_args(argv)
    if args.list:
        for env in ENVS.values():
            print(f"{env.name:16} {'built' if env.built() else 'missing':8} {env.path}")
        print(f"cache: {CACHE}, {size_bytes() / 2**30:.1f} GiB on disk")
        return 0
    for name in args.names or list(ENVS):
        if name not in ENVS:
            parser.error(f"unknown environment {name!r}: expected one of {', '.join(ENVS)}")
        ensure(name)
        print(f"{name}: ready in {ENVS[name].path}", flush=True)
    print(f"cache: {CACHE}, {size_bytes() / 2**30:.1f} GiB on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
