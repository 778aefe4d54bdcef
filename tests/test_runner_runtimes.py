"""The runtimes of the frameworks that run a Python runner per pod, runtimes/jax-distributed.yaml
and runtimes/xgboost-distributed.yaml, with their examples/trainjob-*.yaml: accepted by the upstream
Trainer CRDs (schema, CEL, JobSet and Job admission, checked offline by tests/k8s_checks.py: no API
server here), shaped like upstream's runtime of the same name (manifests/base/runtimes/ in v2.3.0:
ClusterTrainingRuntime <framework>-distributed, framework label <framework>, mlPolicy {numNodes: 1,
<framework>: {}}, one `node` job with the trainer ancestor label and a `node` container), and
failing the way the launcher's exit-code table says.

Every test runs for each framework (its id names it: ``[jax]``, ``[xgboost]``); what only one
framework's runtime has is tested for that one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import k8s_checks
import pytest
import yaml

from launcher import __version__, cli
from launcher.core import failure_policy
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, TRANSIENT, classify, is_retryable
from launcher.core.settings import LauncherSettings

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZATION = ROOT / "runtimes" / "kustomization.yml"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_CRD = k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"

needs_crd = pytest.mark.skipif(not k8s_checks.CLUSTER_RUNTIME_CRD.exists(),
                               reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})")


def load(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@dataclass(frozen=True)
class Runtime:
    """One framework's runtime manifest, its example TrainJob, and the failures a user of it meets
    (what happened, the exit code the pod ends with, what JobSet then does)."""

    framework: str
    program_args: tuple[str, ...]  # a TrainJob's args for this framework's training script
    failures: tuple[tuple[str, int, str], ...]

    @property
    def path(self) -> Path:
        return ROOT / "runtimes" / f"{self.framework}-distributed.yaml"

    @property
    def example(self) -> Path:
        return ROOT / "examples" / f"trainjob-{self.framework}.yaml"

    @property
    def image(self) -> str:
        return f"ghcr.io/trainer-launcher/trainer-launcher-{self.framework}"

    @cached_property
    def doc(self) -> dict:
        return load(self.path)

    @property
    def spec(self) -> dict:
        return self.doc["spec"]["template"]["spec"]

    @property
    def node(self) -> dict:
        (node,) = self.spec["replicatedJobs"]
        return node

    @property
    def job(self) -> dict:
        return self.node["template"]["spec"]

    @property
    def pod(self) -> dict:
        return self.job["template"]["spec"]

    @property
    def container(self) -> dict:
        (container,) = self.pod["containers"]
        return container

    def verdict(self, exit_code: int) -> str:
        """Kubernetes' podFailurePolicy (first matching rule wins; none: Count, which with
        backoffLimit 0 fails the Job as BackoffLimitExceeded), then the JobSet rule for that Job
        failure reason (JobSet would restart on a reason no rule names: every reason has one)."""
        reason = "BackoffLimitExceeded"
        for rule in self.job["podFailurePolicy"]["rules"]:
            codes = rule.get("onExitCodes")
            if codes and exit_code != 0 and codes["containerName"] == self.container["name"]:
                inside = exit_code in codes["values"]
                if inside == (codes["operator"] == "In"):
                    if rule["action"] == "FailJob":
                        reason = "PodFailurePolicy"
                    break
        rules = self.spec["failurePolicy"]["rules"]
        actions = [rule["action"] for rule in rules if reason in rule["onJobFailureReasons"]]
        assert actions, f"no JobSet failurePolicy rule for the Job failure reason {reason}"
        return actions[0]


JAX = Runtime("jax", ("--steps", "5"), (
    ("a process exited 3 (every pod exits 3, naming it)", 3, "FailJobSet"),
    ("two pods share a JAX_PROCESS_ID (multi-slice)", 2, "FailJobSet"),
    ("the coordinator never came up", TRANSIENT, "RestartJobSet"),
    ("a peer vanished; JAX aborted this process", TRANSIENT, "RestartJobSet"),
    ("a process was OOM-killed", 137, "RestartJobSet"),
    ("JAX aborted without a word from the launcher", 134, "FailJobSet"),
))
XGBOOST = Runtime("xgboost", ("--rounds", "5"), (
    ("a worker exited 3", 3, "FailJobSet"),
    ("a malformed DMLC_* variable", 2, "FailJobSet"),
    ("the tracker never came up", TRANSIENT, "RestartJobSet"),
    ("the workers never all joined the tracker (a pod still pending)", TRANSIENT, "RestartJobSet"),
    ("a worker lost its peer on another pod (PeerLost)", TRANSIENT, "RestartJobSet"),
    ("a worker was OOM-killed", 137, "RestartJobSet"),
))
RUNTIMES = (JAX, XGBOOST)
each_runtime = pytest.mark.parametrize("runtime", RUNTIMES, ids=[r.framework for r in RUNTIMES])


# --- what the API server would say ---------------------------------------------------------------

@needs_crd
@each_runtime
def test_the_runtime_passes_the_crd_schema_its_cel_rules_and_jobset_admission(runtime: Runtime):
    assert k8s_checks.validate_runtime(runtime.doc) == []


@needs_crd
@pytest.mark.parametrize("version", ["1.31", "1.37"])
@each_runtime
def test_the_node_job_is_a_batch_v1_job_the_api_server_accepts(runtime: Runtime, version):
    jobs = k8s_checks.embedded_jobs(runtime.doc)
    assert jobs and [e for job in jobs for e in k8s_checks.core_errors(job, version)] == []


@needs_crd
@each_runtime
def test_the_checks_would_catch_a_torch_policy_added_beside_the_frameworks(runtime: Runtime):
    doc = load(runtime.path)
    doc["spec"]["mlPolicy"]["torch"] = {}
    assert any("Only one of the policy can be configured" in e for e in k8s_checks.validate_runtime(doc))


@needs_crd
@each_runtime
def test_the_example_trainjob_is_accepted_and_uses_this_runtime(runtime: Runtime):
    doc = load(runtime.example)
    schema = k8s_checks.openapi_schema(TRAINJOB_CRD)
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    assert (errors or k8s_checks.cel_errors(defaulted, schema)) == []
    assert doc["spec"]["runtimeRef"]["name"] == runtime.doc["metadata"]["name"]


def test_the_xgboost_example_asks_for_several_gpus_per_node_and_ships_its_program():
    doc = load(XGBOOST.example)
    # GPUs per node: the example is the case upstream's one-process pods cannot run.
    assert doc["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] > 1
    assert Path(ROOT / "examples" / Path(doc["spec"]["trainer"]["args"][1]).name).is_file()


# --- upstream's shape, our launcher -----------------------------------------------------------------

@each_runtime
def test_it_keeps_upstreams_name_label_policy_and_single_node_job(runtime: Runtime):
    doc, node = runtime.doc, runtime.node
    assert doc["kind"] == "ClusterTrainingRuntime" and doc["metadata"]["name"] == f"{runtime.framework}-distributed"
    # the SDK looks the runtime up by its framework label
    assert doc["metadata"]["labels"]["trainer.kubeflow.org/framework"] == runtime.framework
    assert doc["spec"]["mlPolicy"] == {"numNodes": 1, runtime.framework: {}}
    assert node["name"] == "node" and node.get("replicas", 1) == 1
    assert node["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert runtime.container["name"] == "node"  # where Trainer injects JAX_* or DMLC_* and the 29500 port


@each_runtime
def test_the_node_runs_the_frameworks_image_under_the_launcher_with_the_trainjob_args_appended(runtime: Runtime):
    container = runtime.container
    image, _, tag = container["image"].rpartition(":")
    assert (image, tag) == (runtime.image, __version__)
    assert "args" not in container  # left for the TrainJob
    program = ["python", "train.py", *runtime.program_args]
    head, rest = cli._split([*container["command"][1:], *program])
    assert container["command"][0] == "trainer-launcher"
    assert cli._parser(cli.frameworks()).parse_args(head).command == runtime.framework
    assert rest == program


def test_the_xgboost_container_declares_the_stop_board_port_next_to_the_trackers():
    from launcher.xgboost.board import PORT_OFFSET

    tracker_port = 29500  # what Trainer injects as DMLC_TRACKER_PORT and adds as a container port
    assert [p["containerPort"] for p in XGBOOST.container["ports"]] == [tracker_port + PORT_OFFSET]


@each_runtime
def test_kustomize_lists_the_runtime_and_can_retarget_its_image(runtime: Runtime):
    kustomization = load(KUSTOMIZATION)
    assert runtime.path.name in kustomization["resources"]
    assert {"name": runtime.image, "newTag": __version__} in kustomization["images"]


@each_runtime
def test_every_pod_gets_a_memory_backed_dev_shm(runtime: Runtime):
    volumes = {v["name"]: v for v in runtime.pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in runtime.container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


@each_runtime
def test_the_pods_grace_period_is_the_launchers_and_its_margin(runtime: Runtime):
    grace = LauncherSettings.model_fields["grace_period"].default
    assert runtime.pod["terminationGracePeriodSeconds"] == failure_policy.termination_grace_period_seconds(grace)


# --- the failure policy is the exit-code table's -------------------------------------------------

@each_runtime
def test_the_failure_policy_is_derived_from_the_exit_code_table(runtime: Runtime):
    expected = failure_policy.job_policy("node")
    assert runtime.spec["failurePolicy"] == failure_policy.jobset_failure_policy()
    assert runtime.job["backoffLimit"] == expected["backoffLimit"]
    assert runtime.job["podFailurePolicy"] == expected["podFailurePolicy"]
    assert runtime.pod["restartPolicy"] == expected["template"]["spec"]["restartPolicy"]


@each_runtime
def test_trainer_launcher_policy_prints_the_policy_this_runtime_carries(runtime: Runtime):
    result = subprocess.run([sys.executable, "-m", "launcher", "policy"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=60)
    printed = json.loads(result.stdout)
    assert printed["job"]["podFailurePolicy"] == runtime.job["podFailurePolicy"]
    assert printed["jobSet"]["failurePolicy"] == runtime.spec["failurePolicy"]


# Every code a container can exit with, and the signal deaths a runner's program meets most.
CODES = [*range(1, 256), *(128 + s for s in (signal.SIGABRT, signal.SIGSEGV, signal.SIGKILL))]


@pytest.mark.parametrize("code", CODES)
@each_runtime
def test_kubernetes_restarts_the_job_exactly_for_the_codes_the_launcher_calls_retryable(runtime: Runtime, code):
    expected = "RestartJobSet" if is_retryable(code, DEFAULT_RETRYABLE_EXIT_CODES) else "FailJobSet"
    assert runtime.verdict(code) == expected


@pytest.mark.parametrize("runtime, what, code, action", [
    pytest.param(runtime, what, code, action, id=f"{runtime.framework}-{what}-{code}-{action}")
    for runtime in RUNTIMES for what, code, action in runtime.failures
])
def test_what_kubernetes_does_with_a_trainjob_when(runtime: Runtime, what, code, action):
    assert runtime.verdict(code) == action
    assert is_retryable(classify(code).exit_code, DEFAULT_RETRYABLE_EXIT_CODES) == (action == "RestartJobSet")
