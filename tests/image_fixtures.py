"""Image fixtures shared by the image and SDK tests: one engine, base, network and set of images
per session (see tests/containers.py for what stands in for a cluster)."""

from __future__ import annotations

import subprocess

import containers
import pytest
from conftest import REPO

from launcher import __version__

# The labels the release workflow sets on the torch image (.github/workflows/release.yml), so they
# are tested as a release builds them; the other images keep the Dockerfiles' defaults.
OCI = "org.opencontainers.image."
RELEASE_LABELS = {OCI + "version": __version__, OCI + "source": "https://example.invalid/trainer-launcher"}


def revision() -> str:
    """The checkout's commit, as a release passes it; "unknown" outside a git checkout."""
    result = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"

MPIS = ("openmpi", "intel", "mpich")


@pytest.fixture(scope="session")
def engine() -> containers.Engine:
    reason = containers.why_not()
    if reason:
        pytest.skip(reason)
    return containers.engine()


@pytest.fixture(scope="session")
def net(engine) -> str:
    name = containers.network(engine)
    yield name
    engine.podman("network", "rm", "-f", name, check=False)


@pytest.fixture(scope="session")
def torch_image(engine) -> str:
    wheels = containers.torch_wheel_dir()
    if wheels is None:
        pytest.skip("no local torch CPU wheel (pip find-links) to stand in for the PyTorch base image's torch")
    tag = "localhost/trainer-launcher-torch:test"
    engine.build("Dockerfile.torch", tag, {
        "BASE_IMAGE": containers.BASE,
        # The real base carries torch; this one gets the local CPU wheel.
        "TORCH": f"--find-links={wheels} torch==2.13.0",
    }, volumes=[f"{wheels}:{wheels}:ro"], labels={**RELEASE_LABELS, OCI + "revision": revision()})
    return tag


@pytest.fixture(scope="session")
def trixie_image(engine) -> str:
    """Dockerfile.torch on Debian 13 (Python 3.13) whose interpreter carries PyPI's torch, as the
    PyTorch image's does: TORCH stays empty, the launcher's venv sees the base's torch. The base is
    built once and kept (containers.torch_base); this build redoes the launcher's layers only when
    the source changed."""
    tag = "localhost/trainer-launcher-torch-trixie:test"
    engine.build("Dockerfile.torch", tag, {"BASE_IMAGE": containers.torch_base(engine)})
    return tag


_mpi_images: dict[str, str] = {}


@pytest.fixture(params=MPIS)
def mpi_image(request, engine) -> tuple[str, str]:
    impl = request.param
    if impl not in _mpi_images:
        tag = f"localhost/trainer-launcher-mpi-{impl}:test"
        engine.build("Dockerfile.mpi", tag, {"BASE_IMAGE": containers.BASE, "MPI": impl})
        _mpi_images[impl] = tag
    return impl, _mpi_images[impl]
