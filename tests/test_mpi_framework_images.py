"""The MLX and DeepSpeed images: Dockerfile.mpi built with the EXTRA_PACKAGES (and, for DeepSpeed
on CPU, APT_PACKAGES) build arguments, run as a worker pod and a launcher pod (runLauncherAsNode)
on podman, wired the way Trainer wires them (tests/test_images.py's MpiPods). Nothing in the
launcher's environment names libmpi: the launcher finds the image's own for MLX.
"""

from __future__ import annotations

import json
import re

import containers
import pytest
from conftest import REPO
from test_images import MpiPods

MLX = "mlx[cpu]==0.32.4"
_built: dict[str, str] = {}


@pytest.fixture
def mlx_image(engine) -> str:
    if "mlx" not in _built:
        tag = "localhost/trainer-launcher-mlx:test"
        engine.build("Dockerfile.mpi", tag, {"BASE_IMAGE": containers.BASE, "MPI": "openmpi",
                                             "EXTRA_PACKAGES": MLX, "IMPORTS": "mpi4py mlx.core"})
        _built["mlx"] = tag
    return _built["mlx"]


@pytest.fixture
def mlx_pods(engine, net, mlx_image, tmp_path):
    pods = MpiPods(engine, net, "openmpi", mlx_image, tmp_path)
    yield pods
    pods.stop()


def test_the_mlx_image_carries_mlx_beside_the_launcher(engine, mlx_image):
    result = engine.run(mlx_image, "-c", "import mlx.core as mx; print(mx.__version__, mx.default_device())",
                        options=["--entrypoint", "python"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == MLX.split("==")[1]


def test_the_runtimes_command_runs_mlx_across_both_pods(mlx_pods):
    mlx_pods.start_worker()
    result = mlx_pods.launch("trainer-launcher", "mpi", "--", "python", "/programs/mlx_world.py")
    assert result.returncode == 0, f"{result.stderr[-3000:]}\nworker:\n{mlx_pods.stop()}"
    worlds = {r["rank"]: r for r in map(json.loads, re.findall(r"^MLX (\{.*\})$", result.stdout + result.stderr, re.M))}
    # Without the image's libmpi both ranks would be a world of one, each summing alone.
    assert {rank: (r["size"], r["sum"], r["host"]) for rank, r in worlds.items()} == {
        0: (2, 3, MpiPods.LAUNCHER), 1: (2, 3, MpiPods.WORKER)}, result.stdout[-2000:]


class SlowPods(MpiPods):
    """MpiPods whose launcher may take longer: each DeepSpeed rank compiles its CPU op first."""

    def launch(self, entrypoint: str, *args: str, env: tuple[str, ...] = ()):
        return self.engine.podman(
            "run", "--rm", *self.common, "--ip", self.launcher_ip, "--hostname", self.LAUNCHER,
            "-v", f"{self.hostfile}:/etc/mpi/hostfile:ro", *env, "--entrypoint", entrypoint, self.image, *args,
            check=False, timeout=1200)


DEEPSPEED_ARGS = {"MPI": "openmpi", "EXTRA_PACKAGES": "torch==2.13.0 deepspeed==0.19.8",
                  # The test base's python is Debian's: its headers come with python3-dev.
                  "APT_PACKAGES": "g++ python3-dev", "IMPORTS": "mpi4py torch deepspeed"}


def extensions_cache(engine) -> str:
    """DeepSpeed's CPU op, compiled by the first rank that needs it, shared by both pods (the other
    rank waits on torch's lock in it) and kept for the next run of the same image's packages, as a
    volume would keep it: compiling it in each pod at once took most of this test's 4 minutes.
    Keyed by the base image and the packages."""
    base = engine.podman("image", "inspect", "--format", "{{.Id}}", containers.BASE).stdout.strip()
    return containers.torch_extensions_cache([base, DEEPSPEED_ARGS])


@pytest.fixture
def deepspeed_pods(engine, net, tmp_path):
    wheels = containers.torch_wheel_dir()
    if wheels is None:
        pytest.skip("no local torch CPU wheel (pip find-links): any other torch is a multi-GB CUDA build")
    if "deepspeed" not in _built:
        tag = "localhost/trainer-launcher-deepspeed:test"
        engine.build("Dockerfile.mpi", tag, {
            **DEEPSPEED_ARGS, "BASE_IMAGE": containers.BASE,
            "EXTRA_PACKAGES": f"--find-links={wheels} {DEEPSPEED_ARGS['EXTRA_PACKAGES']}",
        }, volumes=[f"{wheels}:{wheels}:ro"])
        _built["deepspeed"] = tag
    pods = SlowPods(engine, net, "openmpi", _built["deepspeed"], tmp_path)
    pods.common += ["-v", f"{REPO / 'examples'}:/examples:ro", "-v", f"{extensions_cache(engine)}:/torch-extensions"]
    yield pods
    pods.stop()


@pytest.mark.timeout(1800)  # torch and deepspeed into the image, then the first rank compiles DeepSpeed's CPU op
def test_the_deepspeed_image_trains_across_both_pods(deepspeed_pods):
    deepspeed_pods.start_worker()
    # Set on the launcher's pod as spec.trainer.env would be: the launcher exports it to both ranks.
    result = deepspeed_pods.launch("trainer-launcher", "mpi", "--", "python", "/examples/deepspeed_demo.py",
                                   "--steps", "10", env=("-e", "TORCH_EXTENSIONS_DIR=/torch-extensions"))
    assert result.returncode == 0, f"{result.stderr[-3000:]}\nworker:\n{deepspeed_pods.stop()}"
    ranks = {r["rank"]: r for r in map(json.loads, re.findall(r"summary (\{.*\})", result.stdout + result.stderr))}
    assert {rank: (r["world"], r["host"], r["steps"]) for rank, r in ranks.items()} == {
        0: (2, MpiPods.LAUNCHER, 10), 1: (2, MpiPods.WORKER, 10)}, result.stdout[-2000:]
    assert ranks[0]["weights"] == ranks[1]["weights"]
