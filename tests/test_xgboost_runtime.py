"""runtimes/xgboost-distributed.yaml and examples/trainjob-xgboost.yaml: accepted by the upstream
Trainer CRDs (schema, CEL, JobSet and Job admission, checked offline by tests/k8s_checks.py: no API
server here), shaped like upstream's runtime of the same name (manifests/base/runtimes/
xgboost_distributed.yaml in v2.3.0: ClusterTrainingRuntime xgboost-distributed, framework label
xgboost, mlPolicy {numNodes: 1, xgboost: {}}, one `node` job with the trainer ancestor label and a
`node` container), and failing the way the launcher's exit-code table says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import k8s_checks
from launcher import __version__, cli
from launcher.core import failure_policy
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, TRANSIENT, is_retryable
from launcher.core.settings import LauncherSettings

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtimes" / "xgboost-distributed.yaml"
EXAMPLE = ROOT / "examples" / "trainjob-xgboost.yaml"
KUSTOMIZATION = ROOT / "runtimes" / "kustomization.yml"
IMAGE = "ghcr.io/trainer-launcher/trainer-launcher-xgboost"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_CRD = k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"

needs_crd = pytest.mark.skipif(not k8s_checks.CLUSTER_RUNTIME_CRD.exists(),
                               reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})")


def load(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


DOC = load(RUNTIME)
SPEC = DOC["spec"]["template"]["spec"]
(NODE,) = SPEC["replicatedJobs"]
JOB = NODE["template"]["spec"]
POD = JOB["template"]["spec"]
(CONTAINER,) = POD["containers"]


@needs_crd
def test_the_runtime_passes_the_crd_schema_its_cel_rules_and_jobset_admission():
    assert k8s_checks.validate_runtime(DOC) == []


@needs_crd
@pytest.mark.parametrize("version", ["1.31", "1.37"])
def test_the_node_job_is_a_batch_v1_job_the_api_server_accepts(version):
    jobs = k8s_checks.embedded_jobs(DOC)
    assert jobs and [e for job in jobs for e in k8s_checks.core_errors(job, version)] == []


@needs_crd
def test_the_checks_would_catch_a_torch_policy_added_beside_xgboost():
    doc = load(RUNTIME)
    doc["spec"]["mlPolicy"]["torch"] = {}
    assert any("Only one of the policy can be configured" in e for e in k8s_checks.validate_runtime(doc))


@needs_crd
def test_the_example_trainjob_is_accepted_and_uses_this_runtime_with_gpus():
    doc = load(EXAMPLE)
    schema = k8s_checks.openapi_schema(TRAINJOB_CRD)
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    assert (errors or k8s_checks.cel_errors(defaulted, schema)) == []
    assert doc["spec"]["runtimeRef"]["name"] == DOC["metadata"]["name"]
    # GPUs per node: the example is the case upstream's one-process pods cannot run.
    assert doc["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] > 1
    assert Path(ROOT / "examples" / Path(doc["spec"]["trainer"]["args"][1]).name).is_file()


def test_it_keeps_upstreams_name_label_policy_and_single_node_job():
    assert DOC["kind"] == "ClusterTrainingRuntime" and DOC["metadata"]["name"] == "xgboost-distributed"
    assert DOC["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "xgboost"
    assert DOC["spec"]["mlPolicy"] == {"numNodes": 1, "xgboost": {}}
    assert NODE["name"] == "node" and NODE.get("replicas", 1) == 1
    assert NODE["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert CONTAINER["name"] == "node"  # where Trainer injects DMLC_* and the 29500 port


def test_the_node_runs_the_xgboost_image_under_the_launcher_with_the_trainjob_args_appended():
    image, _, tag = CONTAINER["image"].rpartition(":")
    assert (image, tag) == (IMAGE, __version__)
    assert "args" not in CONTAINER
    head, rest = cli._split([*CONTAINER["command"][1:], "python", "train.py", "--rounds", "5"])
    assert CONTAINER["command"][0] == "trainer-launcher"
    assert cli._parser(cli.frameworks()).parse_args(head).command == "xgboost"
    assert rest == ["python", "train.py", "--rounds", "5"]


def test_the_container_declares_the_stop_board_port_next_to_the_trackers():
    from launcher.xgboost.board import PORT_OFFSET

    tracker_port = 29500  # what Trainer injects as DMLC_TRACKER_PORT and adds as a container port
    assert [p["containerPort"] for p in CONTAINER["ports"]] == [tracker_port + PORT_OFFSET]


def test_kustomize_lists_the_runtime_and_can_retarget_its_image():
    kustomization = load(KUSTOMIZATION)
    assert RUNTIME.name in kustomization["resources"]
    assert {"name": IMAGE, "newTag": __version__} in kustomization["images"]


def test_gpu_workers_of_a_pod_get_a_memory_backed_dev_shm_for_nccl():
    volumes = {v["name"]: v for v in POD["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in CONTAINER["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_the_pods_grace_period_leaves_room_for_the_launchers_teardown():
    assert POD["terminationGracePeriodSeconds"] > LauncherSettings.model_fields["grace_period"].default


def test_the_failure_policy_is_derived_from_the_exit_code_table():
    expected = failure_policy.job_policy("node")
    assert SPEC["failurePolicy"] == failure_policy.jobset_failure_policy()
    assert JOB["backoffLimit"] == expected["backoffLimit"]
    assert JOB["podFailurePolicy"] == expected["podFailurePolicy"]
    assert POD["restartPolicy"] == expected["template"]["spec"]["restartPolicy"]


def test_trainer_launcher_policy_prints_the_policy_this_runtime_carries():
    result = subprocess.run([sys.executable, "-m", "launcher", "policy"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=60)
    printed = json.loads(result.stdout)
    assert printed["job"]["podFailurePolicy"] == JOB["podFailurePolicy"]
    assert printed["jobSet"]["failurePolicy"] == SPEC["failurePolicy"]


def kubernetes_verdict(exit_code: int) -> str:
    """podFailurePolicy (first matching rule wins; none: Count, which with backoffLimit 0 fails the
    Job as BackoffLimitExceeded), then the JobSet rule for that Job failure reason."""
    reason = "BackoffLimitExceeded"
    for rule in JOB["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and exit_code != 0 and codes["containerName"] == CONTAINER["name"]:
            if (exit_code in codes["values"]) == (codes["operator"] == "In"):
                if rule["action"] == "FailJob":
                    reason = "PodFailurePolicy"
                break
    return next(rule["action"] for rule in SPEC["failurePolicy"]["rules"] if reason in rule["onJobFailureReasons"])


@pytest.mark.parametrize("code", [*range(1, 256), *(128 + s for s in (signal.SIGABRT, signal.SIGSEGV, signal.SIGKILL))])
def test_kubernetes_restarts_the_job_exactly_for_the_codes_the_launcher_calls_retryable(code):
    expected = "RestartJobSet" if is_retryable(code, DEFAULT_RETRYABLE_EXIT_CODES) else "FailJobSet"
    assert kubernetes_verdict(code) == expected


@pytest.mark.parametrize("what, code, action", [
    ("a worker exited 3", 3, "FailJobSet"),
    ("a malformed DMLC_* variable", 2, "FailJobSet"),
    ("the tracker never came up", TRANSIENT, "RestartJobSet"),
    ("the workers never all joined the tracker (a pod still pending)", TRANSIENT, "RestartJobSet"),
    ("a worker lost its peer on another pod (PeerLost)", TRANSIENT, "RestartJobSet"),
    ("a worker was OOM-killed", 137, "RestartJobSet"),
])
def test_what_kubernetes_does_with_an_xgboost_trainjob_when(what, code, action):
    assert kubernetes_verdict(code) == action
