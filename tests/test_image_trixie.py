"""Dockerfile.torch on Debian 13 (trixie): Python 3.13, with PyPI's CUDA torch in the base
interpreter the way a PyTorch image carries it (no GPU here: gloo on CPU). The other image tests
(tests/test_images.py) build on Debian 12's Python 3.11 with the local CPU wheel; this is the image
matrix's Python 3.13 point. See tests/containers.py (torch_base) for the base and its cost: the
first build downloads ~3.5 GB of wheels; later runs reuse the base.
"""

from __future__ import annotations

import json
import re

import pytest

import containers
from conftest import REPO
from image_fixtures import trixie_image  # noqa: F401 (a fixture)

# A cold build (debootstrap, PyPI's torch and its nvidia-* wheels) takes minutes; it happens in the
# first test's setup. Each buildah/podman call carries its own timeout (tests/containers.py).
pytestmark = [pytest.mark.matrix, pytest.mark.timeout(3600)]

PROGRAMS = f"{REPO / 'tests' / 'programs'}:/programs:ro"
EXAMPLES = f"{REPO / 'examples'}:/examples:ro"


def test_trixie_image_is_python_3_13_with_the_bases_torch(engine, trixie_image):
    version = engine.run(trixie_image, "python3", "--version")
    assert version.returncode == 0, version.stderr[-2000:]
    assert re.fullmatch(r"Python 3\.13\.\d+", version.stdout.strip()), version.stdout
    # The launcher's venv sees the base interpreter's torch (--system-site-packages), not a copy.
    found = engine.run(trixie_image, "python", "-c", "import sys, torch; print(sys.prefix, torch.__version__, torch.__file__)")
    assert found.returncode == 0, found.stderr[-2000:]
    prefix, version, where = found.stdout.split()
    assert prefix == "/opt/trainer-launcher/venv"
    assert version.startswith(containers.TRIXIE_TORCH)
    assert where.startswith("/usr/local/lib/python3.13/dist-packages/torch/"), where


def test_local_two_node_ddp_demo_in_the_trixie_image(engine, trixie_image):
    result = engine.run(trixie_image, "local", "--nnodes", "2", "--nproc-per-node", "2", "--", "/examples/ddp_demo.py",
                        options=["-v", EXAMPLES], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer-launcher: the job succeeded" in result.stderr, result.stderr[-3000:]
    assert re.search(r"step  60  loss \d+\.\d+  \(world size 4\)", result.stdout), result.stdout[-3000:]


def test_a_failing_rank_in_the_trixie_image_decides_the_exit_code_and_is_named(engine, trixie_image, tmp_path):
    # Global rank 3: the second rank of the second node, local-node-0-1 (`local`'s default TrainJob
    # name is "local"). The kubelet's /dev/termination-log is a file the launcher may write.
    termination = tmp_path / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    result = engine.run(trixie_image, "local", "--nnodes", "2", "--nproc-per-node", "2", "--", "/programs/ranks.py",
                        options=["-v", PROGRAMS, "-v", f"{termination}:/dev/termination-log",
                                 "-e", "BEHAVIOUR=exit:3", "-e", "FAIL_RANK=3"], timeout=600)
    assert result.returncode == 3, result.stderr[-3000:]
    message = json.loads(termination.read_text())
    assert (message["exitCode"], message["retryable"]) == (3, False), message
    assert (message["rootCause"]["rank"], message["rootCause"]["node"]) == (3, "local-node-0-1"), message
    assert "rank 3" in message["message"] and "local-node-0-1" in message["message"], message
