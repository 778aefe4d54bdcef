"""`trainer-launcher mpi` with real mpirun for Open MPI 5 and 4, MPICH and Intel MPI, over real
sshd started by the worker role as an unprivileged user from a read-only key mount.

`local --mpi` builds the cluster: one private network namespace, and per pod its own hostname and
/etc/hosts (UTS and mount namespaces). .ci/install-mpi installs the four MPIs, each in its own
prefix; an implementation that is not installed is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, Job, clean_env, launcher, with_private_names

PROGRAM = str(REPO / "tests" / "programs" / "mpi_ranks.py")
IMPLEMENTATIONS = {
    "openmpi5": ("openmpi", "/opt/mpi/openmpi5/bin/mpirun", "/opt/mpi/openmpi5/lib/libmpi.so.40", "Open MPI v5"),
    "openmpi4": ("openmpi", "/usr/bin/mpirun", "/usr/lib/x86_64-linux-gnu/libmpi.so.40", "Open MPI v4"),
    "mpich": ("mpich", "/opt/mpi/mpich/bin/mpiexec", "/opt/mpi/mpich/lib/libmpi.so.12", "MPICH"),
    "intel": ("intel", "/opt/mpi/intel/bin/mpirun", "/opt/mpi/intel/lib/libmpi.so.12", "Intel(R) MPI"),
}


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _missing(key: str) -> str | None:
    _, mpirun, libmpi, _ = IMPLEMENTATIONS[key]
    if not os.path.exists(mpirun) or not os.path.exists(libmpi):
        return f"{key} is not installed ({mpirun}); run .ci/install-mpi as root"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed; run .ci/install-mpi"
    return None


@pytest.fixture(params=list(IMPLEMENTATIONS))
def mpi(request):
    reason = _missing(request.param)
    if reason:
        pytest.skip(reason)
    name, mpirun, libmpi, library = IMPLEMENTATIONS[request.param]
    env = clean_env(MPI4PY_LIBMPI=libmpi, PATH=f"{os.path.dirname(mpirun)}:{os.environ['PATH']}")
    if request.param == "openmpi4":  # Debian's: keep our python first (its bin is /usr/bin)
        env["PATH"] = os.environ["PATH"]
    return {"name": name, "mpirun": mpirun, "library": library, "env": env}


@pytest.fixture
def shared_dir():
    """Writable by the unprivileged ranks (pytest's tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="trainer-launcher-mpi-test-")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


needs_cluster = pytest.mark.skipif(not IS_ROOT or not _user_exists("mpiuser") or not shutil.which("sshd"),
                                   reason="needs root, sshd and the user mpiuser (.ci/install-mpi)")


def local_mpi(mpi, tmp_path, shared_dir, nnodes=2, nproc=2, program=("python3", PROGRAM), **env) -> Job:
    argv = launcher("local", "--mpi", mpi["name"], "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
                    "--mpirun", mpi["mpirun"], "--grace-period", "3", "--", *program)
    return Job(argv, {**mpi["env"], "REPORT_DIR": str(shared_dir), **env}, tmp_path)


def reports(directory: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json") if p.stem.isdigit()}


@needs_cluster
def test_two_nodes_over_real_sshd_run_every_rank_on_the_workers_with_the_launchers_env(mpi, tmp_path, shared_dir):
    job = local_mpi(mpi, tmp_path, shared_dir, JOB_ONLY="set-only-on-the-launcher")
    assert job.wait(180) == 0, job.stderr
    ranks = reports(shared_dir)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r["hostname"] for r in ranks.values()} == {"local-node-0-0", "local-node-0-1"}
    assert {r["job_only"] for r in ranks.values()} == {"set-only-on-the-launcher"}
    assert {r["allreduce"] for r in ranks.values()} == {1 + 2 + 3 + 4}
    assert all(r["library"].startswith(mpi["library"]) for r in ranks.values())


@needs_cluster
@pytest.mark.parametrize("program", [(PROGRAM,), ("python3", PROGRAM)], ids=["script", "other-python"])
def test_a_rank_that_exits_3_ends_the_whole_job_with_3_naming_rank_and_host(mpi, tmp_path, shared_dir, program):
    job = local_mpi(mpi, tmp_path, shared_dir, nproc=1, program=program, BEHAVIOUR="exit:3", FAIL_RANK="1")
    assert job.wait(120) == 3, job.stderr  # the other rank sleeps 60 s: only an abort ends it sooner
    message = job.termination()
    assert message["exitCode"] == 3 and message["retryable"] is False
    if program == (PROGRAM,):
        # The launcher's python runs the script through launcher.mpi.rank, which tells the
        # launcher which rank failed before it aborts: named every time.
        assert message["rootCause"]["rank"] == 1 and message["failedRanks"] == [1]
        assert message["rootCause"]["node"].startswith("local-node-0-1")
        assert "rank 1 on local-node-0-1" in job.stderr
    # The workers, stopped as the job ended, do not claim what only the launcher pod knows.
    assert "the job succeeded" not in job.stderr, job.stderr
    for worker in ("local-node-0-0", "local-node-0-1"):
        assert f"[{worker}] trainer-launcher: mpi worker: " in job.stderr
    # Another python runs it as `python -m mpi4py`: the rank comes from mpirun's "rank 1
    # aborted" line when its output forwarding delivers it before the abort, not every time.


@needs_cluster
def test_a_rank_that_raises_is_named_with_its_exception(mpi, tmp_path, shared_dir):
    job = local_mpi(mpi, tmp_path, shared_dir, nproc=2, program=(PROGRAM,), BEHAVIOUR="raise:loss is nan at step 7",
                    FAIL_RANK="2")
    assert job.wait(120) == 1, job.stderr
    message = job.termination()
    assert message["reason"] == "Failed" and message["retryable"] is False
    assert message["rootCause"]["rank"] == 2 and message["rootCause"]["localRank"] == 0
    assert message["rootCause"]["node"].startswith("local-node-0-1")
    assert message["error"] == "RuntimeError: loss is nan at step 7"
    assert "Traceback" in job.stderr  # the rank's own traceback still reaches the log


# --- restarts in place (LAUNCHER_MAX_RESTARTS): mpirun again on the launcher pod, the workers' sshd stays --

RESUME = str(REPO / "tests" / "programs" / "mpi_resume.py")


def steps_done(directory: Path) -> dict[int, list[tuple[int, int]]]:
    """Each rank's steps as (generation, step), in the order it did them (mpi_resume.py)."""
    return {int(p.name.split(".")[0]): [(int(g), int(s)) for g, s in map(str.split, p.read_text().splitlines())]
            for p in directory.glob("*.steps")}


def resumable(mpi, tmp_path, shared_dir, restarts: int, fail: str, nnodes: int = 2) -> Job:
    """mpi_resume.py on ``nnodes`` workers x 2 ranks, checkpointing to the shared directory."""
    return local_mpi(mpi, tmp_path, shared_dir, nnodes=nnodes, program=(RESUME,), LAUNCHER_MAX_RESTARTS=str(restarts),
                     CKPT=str(shared_dir / "ckpt"), FAIL=fail)


@needs_cluster
def test_a_killed_rank_starts_mpirun_again_in_place_and_the_job_resumes_from_its_checkpoint(mpi, tmp_path, shared_dir):
    # Rank 1 (the first worker pod's second) is SIGKILLed, as the OOM killer does. Across pods, the
    # MPIs' own words for it race their teardown (MPICH's mpiexec exited 255 on its other proxy's
    # error, Open MPI 5 named a peer's abort on the lost socket, 14): its watcher's report names it.
    job = resumable(mpi, tmp_path, shared_dir, 2, "signal:SIGKILL@2")
    assert job.wait(240) == 0, job.stderr
    # Every rank, on both workers' pods, did steps 0-1, then (told LAUNCHER_RESTART_COUNT=1
    # through mpirun's exported environment) steps 2-7 from the checkpoint: none lost, none repeated.
    assert steps_done(shared_dir) == {rank: [(0, 0), (0, 1)] + [(1, s) for s in range(2, 8)] for rank in range(4)}
    assert "done: 8 steps, weight 8" in job.stdout, job.stdout
    restarts = [line for line in job.stderr.splitlines() if "restart 1 of 2: the job failed retryably" in line]
    assert len(restarts) == 1 and restarts[0].startswith("[local-launcher-0-0] "), job.stderr
    assert "(Killed, exit 137, rank 1 on local-node-0-0)" in restarts[0], restarts
    assert "restart 2 of 2" not in job.stderr
    # The worker was not restarted: its sshd served both starts, and stopped once, at the end.
    said = [line for line in job.stderr.splitlines() if line.startswith("[local-node-0-0] ")]
    assert not [line for line in said if "restart" in line], job.stderr
    assert [line for line in said if "the MPI job's outcome is the launcher pod's" in line] == [said[-1]], job.stderr


@needs_cluster
def test_a_rank_a_segfault_ends_across_pods_is_139_crashed_and_never_restarted(mpi, tmp_path, shared_dir):
    job = resumable(mpi, tmp_path, shared_dir, 2, "signal:SIGSEGV@2")
    assert job.wait(180) == 139, job.stderr
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("Crashed", False), message
    assert message["rootCause"]["node"].split(".")[0] == "local-node-0-0", message
    assert "restarts" not in message and "restart 1 of 2" not in job.stderr


@needs_cluster
@pytest.mark.parametrize("mpi", ["openmpi5"], indirect=True)
def test_a_permanent_failure_is_never_restarted(mpi, tmp_path, shared_dir):
    job = resumable(mpi, tmp_path, shared_dir, 2, "exit:3@2")
    assert job.wait(180) == 3, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["retryable"], message["rootCause"]["rank"]) == (3, False, 1), message
    assert "restarts" not in message and "restart 1 of 2" not in job.stderr
    assert {generation for steps in steps_done(shared_dir).values() for generation, _ in steps} == {0}


@needs_cluster
def test_when_the_restarts_run_out_the_last_failure_ends_the_job_with_the_earlier_ones_in_its_history(
        mpi, tmp_path, shared_dir):
    # Rank 1 fails the first start, rank 2 the second (mpi_resume.py), each exiting 138 (retryable).
    job = resumable(mpi, tmp_path, shared_dir, 1, "exit:138@2@0,1")
    assert job.wait(240) == 138, job.stderr
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("RetryableExit", True), message
    # Each start's ranks report to a listener of that start: the job's root cause is the last
    # start's failing rank, never the report the first start's rank 1 sent.
    assert message["rootCause"]["rank"] == 2 and message["failedRanks"] == [2], message
    history = message["restarts"]
    assert [(each["generation"], each["reason"], each["exitCode"]) for each in history] == [(0, "RetryableExit", 138)]
    assert history[0]["rootCause"]["rank"] == 1, history
    assert job.stderr.count("restart 1 of 1: the job failed retryably") == 1 and "restart 2 of" not in job.stderr
    assert steps_done(shared_dir) == {rank: [(0, 0), (0, 1)] for rank in range(4)}  # the second start resumed at 2


@needs_cluster
def test_a_hang_after_a_restart_is_still_caught(mpi, tmp_path, shared_dir):
    """Rank 1 is killed in the first start; in the second, rank 2 (on the other worker pod) stops for
    good: the hang watch, timed afresh from the restart, ends the job as Hang with the stuck rank's
    stack, sent over from its worker pod. (The status counting the restart is the lifecycle's, the
    same for every framework, and checked in the torch, JAX and XGBoost tests: `local --mpi` runs its
    pods in a network namespace of their own, out of the status server's reach.)"""
    job = local_mpi(mpi, tmp_path, shared_dir, program=(RESUME,), LAUNCHER_MAX_RESTARTS="1",
                    CKPT=str(shared_dir / "ckpt"), FAIL="signal:SIGKILL@2", HANG="4@1", STEPS="100000", PAUSE="0.05",
                    PROGRESS="1", LAUNCHER_HANG_TIMEOUT="15")
    assert job.wait(300) == 138, job.stderr[-5000:]
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("Hang", True), message
    assert [(r["generation"], r["exitCode"]) for r in message["restarts"]] == [(0, 137)], message
    assert "rank 2 on local-node-0-1 in restart_fault.py" in message["message"], message
    assert "stuck_forever" in job.stderr, job.stderr[-5000:]


CONTROLLER = str(REPO / "tests" / "mpi_job_controller.py")


def lose_worker(mpi, tmp_path, shared_dir, replace: bool, **env: str) -> tuple[Job, Path]:
    """mpi_resume.py on two worker pods x 2 ranks with 2 restarts; once a rank of each pod has
    stepped, every process of worker pod 1 (ranks 2 and 3) is SIGKILLed, its node gone, and
    (``replace``) tests/mpi_job_controller.py starts its replacement from nothing, as the Job
    controller does. `local --mpi` does not replace pods: the controller starts `local`'s pods
    itself (launcher.mpi.local.Cluster). Returns the controller and the folder of the pods' logs."""
    pods = tmp_path / "pods"
    pods.mkdir()
    when = f"{shared_dir / '0.steps'},{shared_dir / '3.steps'}"
    argv = [sys.executable, CONTROLLER, str(pods), mpi["name"], "1", when, "yes" if replace else "no", "--", RESUME]
    env = {"LAUNCHER_MAX_RESTARTS": "2", "STEPS": "100", "PAUSE": "0.05", "CKPT": str(shared_dir / "ckpt"), **env}
    return Job(argv, {**mpi["env"], "REPORT_DIR": str(shared_dir), **env}, tmp_path), pods


@needs_cluster
def test_a_lost_worker_pod_replaced_rejoins_and_every_rank_finishes_from_the_checkpoint(mpi, tmp_path, shared_dir):
    # Before: Open MPI 5's mpirun exited 0 and the job "succeeded" after one step of 100; Open MPI
    # 4 (205) and MPICH (255) failed it for good; Intel MPI's 137 named the launcher pod.
    controller, pods = lose_worker(mpi, tmp_path, shared_dir, replace=True)
    assert controller.wait(300) == 0, controller.stderr
    said = (pods / "local-launcher-0-0.0.log").read_text(errors="replace")
    restarts = [line for line in said.splitlines() if "restart 1 of 2: the job failed retryably" in line]
    assert len(restarts) == 1 and "(PeerLost, exit 138, local-node-0-1)" in restarts[0], said
    assert "lost the worker pod local-node-0-1" in restarts[0] and "restart 2 of 2" not in said, said
    assert "done: 100 steps, weight 100" in said, said  # no step lost, none done twice
    assert (pods / "local-node-0-1.1.log").exists()  # the replacement served the second start
    message = json.loads((pods / "termination.json").read_text())
    assert message["exitCode"] == 0
    assert [(r["generation"], r["reason"], r["exitCode"], r["rootCause"]["node"]) for r in message["restarts"]] == [
        (0, "PeerLost", 138, "local-node-0-1")], message
    for rank, done in steps_done(shared_dir).items():  # every rank, the replacement's too, resumed
        later = [step for generation, step in done if generation == 1]
        assert later == list(range(later[0], 100)) and later[0] > 0, (rank, done)


@needs_cluster
@pytest.mark.parametrize("rejoin", ["5", "0"])
def test_a_lost_worker_pod_never_replaced_ends_the_job_peer_lost(mpi, tmp_path, shared_dir, rejoin):
    """With a rejoin timeout, mpirun's next start waits that long for the replacement's sshd; with
    0 it is not waited for. Either way 138 PeerLost, naming the pod, and the JobSet's turn."""
    controller, pods = lose_worker(mpi, tmp_path, shared_dir, replace=False, LAUNCHER_REJOIN_TIMEOUT=rejoin)
    assert controller.wait(300) == 138, controller.stderr
    said = (pods / "local-launcher-0-0.0.log").read_text(errors="replace")
    message = json.loads((pods / "termination.json").read_text())
    assert (message["reason"], message["retryable"], message["rootCause"]["node"]) == (
        "PeerLost", True, "local-node-0-1"), message
    if rejoin == "0":
        assert "restart " not in said and "lost the worker pod local-node-0-1" in message["message"], said
    else:
        assert "did not come back to rejoin the job within 5s (LAUNCHER_REJOIN_TIMEOUT)" in message["message"], message
        assert [(r["generation"], r["reason"]) for r in message["restarts"]] == [(0, "PeerLost")], message


def launcher_role(tmp_path: Path, hostfile_text: str) -> tuple[Path, Path]:
    """A hostfile and a key mount for the launcher role alone (no worker is ever reached)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hostfile_text)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_rsa").write_text("never used: no ssh in this test\n")
    (keys / "id_rsa.pub").write_text("ecdsa-sha2-nistp521 AAAAbmV2ZXIgdXNlZA== pinned, never presented\n")
    (keys / "authorized_keys").write_text("never used\n")
    return hostfile, keys


@pytest.mark.skipif(not IS_ROOT, reason="needs root for a private resolver (unshare)")
def test_a_host_that_never_resolves_is_retryable_138_naming_it(mpi, tmp_path):
    hostfile, keys = launcher_role(tmp_path, "tj-node-0-0.never-up.invalid slots=1\n")
    argv = launcher("mpi", "--mpirun", mpi["mpirun"], "--implementation", mpi["name"], "--hostfile", str(hostfile),
                    "--ssh-auth-mount-path", str(keys), "--ssh-dir", str(tmp_path / "ssh"),
                    "--rendezvous-timeout", "2", "--", "python3", PROGRAM)
    job = Job(with_private_names(tmp_path, argv)[0], mpi["env"], tmp_path)
    assert job.wait(60) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout" and message["retryable"] is True
    assert "tj-node-0-0.never-up.invalid" in message["message"]


# An mpirun that never ends the job once its rank is gone, ignoring SIGTERM: Open MPI 5's prterun
# after a second start's MPI_Abort did so once in CI (1 run in about 4,000 tests), and the launcher
# waited for ever. It runs the launcher's rank command as rank 1 (a stand-in: the hang could not be
# made to happen on purpose).
STUCK_MPIRUN = """#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 5.0.6"; exit 0; }
while [ "$#" -gt 0 ] && [ "$2" != -m ]; do shift; done  # to: PYTHON -m launcher.mpi.rank PROGRAM
OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=1 "$@"
trap '' TERM
while :; do sleep 1; done
"""


@pytest.mark.parametrize("code, reason", [(3, "Failed"), (138, "RetryableExit")])
def test_an_mpirun_that_outlives_a_ranks_failure_report_is_stopped_and_the_report_is_the_verdict(tmp_path, code,
                                                                                                reason):
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(STUCK_MPIRUN)
    mpirun.chmod(0o755)
    program = tmp_path / "fails.py"  # no MPI of its own: the stand-in starts no MPI world
    program.write_text("import os, sys\nsys.exit(int(os.environ['CODE']))\n")
    hostfile, keys = launcher_role(tmp_path, "localhost slots=1\n")
    argv = launcher("mpi", "--mpirun", str(mpirun), "--implementation", "openmpi", "--hostfile", str(hostfile),
                    "--ssh-auth-mount-path", str(keys), "--ssh-dir", str(tmp_path / "ssh"), "--grace-period", "3",
                    "--", str(program))
    job = Job(argv, {**clean_env(), "HOME": str(tmp_path), "CODE": str(code)}, tmp_path)
    assert job.wait(120) == code, job.stderr
    message = job.termination()
    assert (message["reason"], message["rootCause"]["rank"], message["failedRanks"]) == (reason, 1, [1]), message
    assert "mpirun has not ended the job 10s after rank 1" in job.stderr, job.stderr


def test_pytest_mpi_tests_run_inside_the_ranks(mpi, tmp_path):
    env = {**mpi["env"], "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "HOME": str(tmp_path)}
    extra = ["--oversubscribe"] if mpi["name"] == "openmpi" else []
    result = subprocess.run([mpi["mpirun"], *extra, "-n", "2", sys.executable, "-m", "pytest", "--with-mpi", "-q",
                             "-p", "no:cacheprovider", str(REPO / "tests" / "in_ranks" / "test_in_ranks.py")],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("passed") >= 2  # one summary per rank


def test_as_root_on_one_host_the_launcher_runs_without_ssh_and_exports_the_env(mpi, tmp_path, shared_dir):
    hostfile, keys = launcher_role(tmp_path, "localhost slots=2\n")
    flags = ["--oversubscribe"] if mpi["name"] == "openmpi" else []
    argv = launcher("mpi", "--mpirun", mpi["mpirun"], "--hostfile", str(hostfile), "--ssh-auth-mount-path", str(keys),
                    "--ssh-dir", str(tmp_path / "ssh"), "--", *flags, "python3", PROGRAM)
    job = Job(argv, {**mpi["env"], "REPORT_DIR": str(shared_dir), "JOB_ONLY": "from-the-launcher",
                     "HOME": str(tmp_path)}, tmp_path)
    assert job.wait(120) == 0, job.stderr
    ranks = reports(shared_dir)
    assert sorted(ranks) == [0, 1]
    assert {r["job_only"] for r in ranks.values()} == {"from-the-launcher"}
    assert f"mpi: {mpi['name']}" in job.stderr  # detected from `mpirun --version`


@contextlib.contextmanager
def worker_role(tmp_path: Path, user: str, **env: str):
    """``mpi --worker`` as ``user`` on a free port of 127.0.0.1, keys from a read-only mount as Trainer
    mounts the Secret: (the worker's Job, its state directory, ssh to it as a command)."""
    from conftest import free_port

    account = pwd.getpwnam(user)
    mount = Path(tempfile.mkdtemp(prefix="trainer-launcher-secret-"))
    state = Path(tempfile.mkdtemp(prefix="trainer-launcher-worker-"))
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(mount / "id_rsa")],
                       check=True)
        shutil.copy(mount / "id_rsa.pub", mount / "authorized_keys")
        for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):  # as Trainer mounts the Secret
            os.chown(mount / name, 0, account.pw_gid)
            os.chmod(mount / name, 0o640 if name == "id_rsa" else 0o644)
        os.chmod(mount, 0o555)
        os.chown(state, account.pw_uid, account.pw_gid)
        port = free_port()
        drop = [] if user == "root" else ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                                          "--init-groups", "--"]
        argv = drop + launcher("mpi", "--worker", "--ssh-port", str(port), "--ssh-listen-address", "127.0.0.1",
                               "--ssh-auth-mount-path", str(mount), "--ssh-dir", str(state / "ssh"))
        worker = Job(argv, clean_env(HOME=account.pw_dir, LAUNCHER_TERMINATION_LOG=str(state / "termination.json"),
                                     **env), tmp_path, "worker")
        client = ["ssh", "-p", str(port), "-i", str(state / "ssh" / "id_key"), "-o", "StrictHostKeyChecking=no",
                  "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectionAttempts=20",
                  f"{user}@127.0.0.1"]
        yield worker, state, drop + client
    finally:
        if worker.process.poll() is None:
            worker.signal(9)
        shutil.rmtree(mount, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def serving(worker: Job) -> bool:
    from conftest import wait_for

    wait_for(lambda: "sshd on port" in worker.stderr or worker.process.poll() is not None,
             what="the worker to start sshd")
    return worker.process.poll() is None


@pytest.mark.skipif(not IS_ROOT or not shutil.which("sshd"), reason="needs root and sshd")
@pytest.mark.parametrize("user", ["root", "mpiuser"])
def test_the_worker_role_serves_ssh_with_keys_from_a_read_only_mount(tmp_path, user):
    if user != "root" and not _user_exists(user):
        pytest.skip(f"no user {user} (.ci/install-mpi creates it)")
    with worker_role(tmp_path, user) as (worker, state, ssh):
        assert serving(worker), worker.stderr
        result = subprocess.run([*ssh, "echo", "hello-from-sshd"], capture_output=True, text=True, timeout=60)
        worker.signal(15)  # as the JobSet stops the workers once the job has ended, well or not
        # The worker cannot know how the job ended: it says so, and exits 0 (its pod is not a
        # failure of the worker Job; the launcher's Job decides the JobSet), never "succeeded".
        assert worker.wait(30) == 0, worker.stderr
        assert result.stdout.strip() == "hello-from-sshd", result.stderr + worker.stderr
        assert "the job succeeded" not in worker.stderr
        assert "the MPI job's outcome is the launcher pod's" in worker.stderr.splitlines()[-1], worker.stderr
        message = json.loads((state / "termination.json").read_text())
        assert (message["exitCode"], message["reason"]) == (0, "Stopped")
        assert oct((state / "ssh" / "id_key").stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(not IS_ROOT or not shutil.which("sshd"), reason="needs root and sshd")
def test_with_restarts_left_a_workers_sshd_killed_on_its_own_serves_again_in_place(tmp_path):
    import psutil
    from conftest import wait_for

    with worker_role(tmp_path, "root", LAUNCHER_MAX_RESTARTS="1") as (worker, _, ssh):
        assert serving(worker), worker.stderr  # the knob, set for every pod of the job, is no error here
        # "sshd on port" is the plan's line: sshd itself starts a moment later (CI once looked between).
        wait_for(lambda: psutil.Process(worker.pid).children() or worker.process.poll() is not None,
                 what="sshd to start")
        (sshd,) = psutil.Process(worker.pid).children()
        sshd.kill()  # 137, retryable: sshd starts again, on the same port with the same keys
        wait_for(lambda: "restart 1 of 1" in worker.stderr or worker.process.poll() is not None,
                 what="the worker to start sshd again")
        result = subprocess.run([*ssh, "echo", "hello-again"], capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == "hello-again", result.stderr + worker.stderr
        worker.signal(15)
        assert worker.wait(30) == 0, worker.stderr


@pytest.mark.skipif(not IS_ROOT, reason="needs root for a private resolver (unshare)")
def test_sigterm_while_waiting_for_workers_stops_at_once_with_143(mpi, tmp_path):
    from conftest import wait_for

    hostfile, keys = launcher_role(tmp_path, "tj-node-0-0.not-yet.invalid slots=1\n")
    argv = launcher("mpi", "--mpirun", mpi["mpirun"], "--implementation", mpi["name"], "--hostfile", str(hostfile),
                    "--ssh-auth-mount-path", str(keys), "--ssh-dir", str(tmp_path / "ssh"), "--", "python3", PROGRAM)
    job = Job(with_private_names(tmp_path, argv)[0], mpi["env"], tmp_path)
    wait_for(lambda: "waiting for 1 of 1 hosts" in job.stderr, what="the launcher to wait for its worker")
    job.signal(15)
    assert job.wait(30) == 143
    assert job.termination()["reason"] == "Terminated"


# A worker that serves ssh with a host key of its own, not the Secret's: the sshd first on its PATH
# swaps the HostKey of the config the worker role wrote for a key it makes itself (ECDSA P-521 like
# the Secret's, so only the key differs), on the pod named in OWN_HOST_KEY_POD only.
_SSHD_WITH_ITS_OWN_HOST_KEY = """#!/bin/sh
for config; do :; done
case "$(hostname)" in
  "$OWN_HOST_KEY_POD") ;;
  *) exec /usr/sbin/sshd "$@" ;;
esac
state=$(dirname "$config")
ssh-keygen -q -t ecdsa -b 521 -N '' -C its-own -f "$state/own_host_key" </dev/null || exit 1
sed "s|^HostKey .*|HostKey $state/own_host_key|" "$config" > "$state/own_sshd_config"
exec /usr/sbin/sshd -D -e -f "$state/own_sshd_config"
"""


def sshd_with_its_own_host_key(shared_dir: Path, pod: str) -> tuple[dict[str, str], str]:
    """The env and the PATH directory that make worker ``pod`` present a host key other than the
    mounted Secret's."""
    bin_dir = shared_dir / "own-host-key-bin"
    bin_dir.mkdir()
    (bin_dir / "sshd").write_text(_SSHD_WITH_ITS_OWN_HOST_KEY)
    (bin_dir / "sshd").chmod(0o755)
    return {"OWN_HOST_KEY_POD": pod}, str(bin_dir)


@needs_cluster
def test_a_worker_whose_host_key_is_not_the_secrets_is_refused_with_one_permanent_line(mpi, tmp_path, shared_dir):
    env, bin_dir = sshd_with_its_own_host_key(shared_dir, "local-node-0-1")
    env["PATH"] = f"{bin_dir}:{mpi['env']['PATH']}"
    job = local_mpi(mpi, tmp_path, shared_dir, nproc=1, **env)
    assert job.wait(180) == 2, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["reason"], message["retryable"]) == (2, "HostKeyMismatch", False), message
    assert "local-node-0-1" in message["message"] and "does not match" in message["message"], message
    assert message["rootCause"]["node"].startswith("local-node-0-1"), message
    said = [line for line in job.stderr.splitlines() if "does not match the mounted Secret" in line]
    assert said and all("local-node-0-1" in line for line in said), job.stderr
    assert reports(shared_dir) == {}, "a rank ran although a worker's host key is not the Secret's"


@needs_cluster
def test_with_host_key_checking_off_a_worker_with_its_own_host_key_is_reached_saying_so_once(mpi, tmp_path,
                                                                                              shared_dir):
    env, bin_dir = sshd_with_its_own_host_key(shared_dir, "local-node-0-1")
    env.update(PATH=f"{bin_dir}:{mpi['env']['PATH']}", LAUNCHER_SSH_HOST_KEY_CHECKING="off")
    job = local_mpi(mpi, tmp_path, shared_dir, nproc=1, **env)
    assert job.wait(180) == 0, job.stderr
    assert sorted(reports(shared_dir)) == [0, 1]
    warned = [line for line in job.stderr.splitlines() if "ssh accepts any host key" in line]
    assert len(warned) == 1 and "LAUNCHER_SSH_HOST_KEY_CHECKING=off" in warned[0], job.stderr


def secret_mount(directory: Path, with_public_key: bool) -> Path:
    mount = directory / "mount"
    mount.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C", "the-secret",
                    "-f", str(mount / "id_rsa")], check=True)
    if not with_public_key:
        shutil.copy(mount / "id_rsa.pub", mount / "authorized_keys")
        (mount / "id_rsa.pub").unlink()
    return mount


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")
@pytest.mark.parametrize("with_public_key", [True, False], ids=["id_rsa.pub", "derived-from-id_rsa"])
def test_the_pinned_key_is_the_secrets_public_key_read_or_derived(tmp_path, with_public_key):
    from launcher.mpi import ssh

    mount = secret_mount(tmp_path, with_public_key)
    public = (mount / ("id_rsa.pub" if with_public_key else "authorized_keys")).read_text().split()[:2]
    ssh.install_keys(str(mount), str(tmp_path / "private"))
    assert ssh.mounted_public_key(str(mount), str(tmp_path / "private")).split()[:2] == public


def test_a_public_key_that_is_not_one_is_a_config_error_naming_the_mount(tmp_path):
    from launcher.core.outcome import ConfigError
    from launcher.mpi import ssh

    (tmp_path / "id_rsa.pub").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(ConfigError) as raised:
        ssh.mounted_public_key(str(tmp_path), str(tmp_path / "private"))
    assert str(tmp_path) in str(raised.value) and "id_rsa.pub" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_private_key_ssh_keygen_cannot_read_is_a_config_error_naming_the_mount(tmp_path):
    from launcher.core.outcome import ConfigError
    from launcher.mpi import ssh

    if not shutil.which("ssh-keygen"):
        pytest.skip("needs ssh-keygen")
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "private" / "id_key").write_text("not a key\n")
    (tmp_path / "private" / "id_key").chmod(0o600)
    with pytest.raises(ConfigError) as raised:
        ssh.mounted_public_key(str(tmp_path), str(tmp_path / "private"))
    assert str(tmp_path) in str(raised.value) and "ssh-keygen -y" in str(raised.value)
    assert "\n" not in str(raised.value)
