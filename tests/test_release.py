"""The release as a platform team consumes it: ``python -m build`` gives an sdist and a wheel that
pass ``twine check --strict``; the wheel, installed into a clean venv beside the torch a user
brings, prints the one version and runs the README's demo. The release workflow
(.github/workflows/release.yml) does the same on a tag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

from launcher import __version__
from tests.install import uv_install

pytestmark = pytest.mark.timeout(600)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    said = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{said}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist, and the wheel built from it (what `python -m build` does without options)."""
    out = tmp_path_factory.mktemp("dist")
    for module in ("build", "twine"):
        assert subprocess.run([sys.executable, "-c", f"import {module}"]).returncode == 0, (
            f"{module} is not installed: the test command installs it from requirements-dev.txt")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(_checkout(tmp_path_factory))])
    return out


def _checkout(tmp_path_factory) -> Path:
    """The tracked files, as a clean checkout has them: the build lists the tree it is given, and
    other tests build and install from this one meanwhile (pip's in-tree builds leave temporary
    files there for a moment: one listed and gone before it was copied failed the sdist once)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        return REPO  # not a git checkout: the tree as it is
    source = tmp_path_factory.mktemp("source")
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    return source


def test_the_sdist_and_the_wheel_pass_twine_check_and_carry_the_one_version(dist):
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert [w.name for w in wheels] == [f"trainer_launcher-{__version__}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"trainer_launcher-{__version__}.tar.gz"]
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)])
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"trainer_launcher-{__version__}.dist-info/METADATA").decode()
    # The hook every rank imports (status, hang stacks; torch's exit handler) ships; the tests do not.
    assert "launcher/runner/hook/sitecustomize.py" in names
    assert "launcher/torch/hook/_trainer_launcher_torch_end.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert any(n.endswith("/licenses/LICENSE") for n in names), names[-8:]
    assert f"\nVersion: {__version__}\n" in metadata, metadata[:600]
    assert "\nLicense-Expression: Apache-2.0\n" in metadata, metadata[:600]
    with tarfile.open(sdists[0]) as sdist:
        assert f"trainer_launcher-{__version__}/LICENSE" in sdist.getnames()


def test_the_wheel_in_a_clean_venv_prints_its_version_and_runs_the_demo(dist, tmp_path):
    """The README's demo with the wheel in place of the checkout: a new venv, the user's torch
    (the CPU build here) and numpy beside the wheel, then `trainer-launcher local` over
    examples/ddp_demo.py, from a directory that is not the checkout."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    wheel = str(next(dist.glob("*.whl")))
    uv = Path(sys.executable).parent / "uv"
    requirements = [wheel, "torch==2.13.0", "numpy"]
    if uv.exists():  # tests/install.py put it in the test venv, and knows pip's configuration
        assert uv_install(uv, venv / "bin" / "python", requirements), "uv failed (its output is above)"
    else:
        run([sys.executable, "-m", "venv", "--upgrade-deps", str(venv)])
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *requirements])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PET_")}
    version = run([str(venv / "bin" / "trainer-launcher"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout.strip() == f"trainer-launcher {__version__}"
    demo = run([str(venv / "bin" / "trainer-launcher"), "local", "--nnodes", "2", "--nproc-per-node", "2", "--",
                str(REPO / "examples" / "ddp_demo.py"), "--steps", "20"], env=env, cwd=tmp_path, timeout=300)
    # The launcher came from the wheel, not the checkout.
    where = run([str(venv / "bin" / "python"), "-c", "import launcher; print(launcher.__file__)"],
                env=env, cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout
    assert "world size 4" in demo.stdout + demo.stderr, demo.stdout[-2000:]
