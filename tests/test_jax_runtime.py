"""runtimes/jax-distributed.yaml and examples/trainjob-jax.yaml: accepted by the upstream Trainer
CRDs (schema, CEL, JobSet and Job admission, checked offline by tests/k8s_checks.py), shaped like
upstream's runtime of the same name, and failing the way the launcher's exit-code table says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import k8s_checks
from launcher import __version__, cli
from launcher.core import failure_policy
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, TRANSIENT, classify, is_retryable
from launcher.core.settings import LauncherSettings

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtimes" / "jax-distributed.yaml"
EXAMPLE = ROOT / "examples" / "trainjob-jax.yaml"
KUSTOMIZATION = ROOT / "runtimes" / "kustomization.yml"
IMAGE = "ghcr.io/trainer-launcher/trainer-launcher-jax"
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


# --- what the API server would say ---------------------------------------------------------------

@needs_crd
def test_the_runtime_is_accepted_by_the_upstream_crd_cel_and_the_jobset_webhook():
    assert k8s_checks.validate_runtime(DOC) == []


@needs_crd
@pytest.mark.parametrize("version", ["1.31", "1.37"])
def test_its_embedded_job_is_a_valid_batch_v1_job(version):
    jobs = k8s_checks.embedded_jobs(DOC)
    assert jobs and [e for job in jobs for e in k8s_checks.core_errors(job, version)] == []


@needs_crd
def test_the_validator_would_reject_a_second_policy_beside_jax():
    doc = load(RUNTIME)
    doc["spec"]["mlPolicy"]["torch"] = {}
    assert any("Only one of the policy can be configured" in e for e in k8s_checks.validate_runtime(doc))


@needs_crd
def test_the_example_trainjob_is_accepted_and_names_this_runtime():
    doc = load(EXAMPLE)
    schema = k8s_checks.openapi_schema(TRAINJOB_CRD)
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    assert (errors or k8s_checks.cel_errors(defaulted, schema)) == []
    assert doc["spec"]["runtimeRef"]["name"] == DOC["metadata"]["name"]


# --- upstream's shape, our launcher -----------------------------------------------------------------

def test_it_has_upstreams_name_label_policy_and_one_node_job():
    assert DOC["kind"] == "ClusterTrainingRuntime" and DOC["metadata"]["name"] == "jax-distributed"
    assert DOC["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "jax"  # the SDK looks it up by this
    assert DOC["spec"]["mlPolicy"] == {"numNodes": 1, "jax": {}}
    assert NODE["name"] == "node" and NODE.get("replicas", 1) == 1
    assert NODE["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert CONTAINER["name"] == "node"  # where Trainer injects JAX_* and the 29500 port


def test_the_node_runs_our_jax_image_under_the_launcher_taking_the_trainjob_args():
    image, _, tag = CONTAINER["image"].rpartition(":")
    assert (image, tag) == (IMAGE, __version__)
    assert "args" not in CONTAINER  # left for the TrainJob
    head, rest = cli._split([*CONTAINER["command"][1:], "python", "train.py", "--steps", "5"])
    assert CONTAINER["command"][0] == "trainer-launcher"
    assert cli._parser(cli.frameworks()).parse_args(head).command == "jax"
    assert rest == ["python", "train.py", "--steps", "5"]


def test_kustomize_lists_the_runtime_and_retargets_its_image():
    kustomization = load(KUSTOMIZATION)
    assert RUNTIME.name in kustomization["resources"]
    assert {"name": IMAGE, "newTag": __version__} in kustomization["images"]


def test_every_pod_gets_a_memory_backed_dev_shm():
    volumes = {v["name"]: v for v in POD["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in CONTAINER["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_the_launcher_tears_down_within_the_pods_grace_period():
    assert POD["terminationGracePeriodSeconds"] > LauncherSettings.model_fields["grace_period"].default


# --- the failure policy is the exit-code table's -------------------------------------------------

def test_the_failure_policy_is_the_one_derived_from_the_exit_code_table():
    expected = failure_policy.job_policy("node")
    assert SPEC["failurePolicy"] == failure_policy.jobset_failure_policy()
    assert JOB["backoffLimit"] == expected["backoffLimit"]
    assert JOB["podFailurePolicy"] == expected["podFailurePolicy"]
    assert POD["restartPolicy"] == expected["template"]["spec"]["restartPolicy"]


def test_trainer_launcher_policy_prints_what_the_runtime_carries():
    result = subprocess.run([sys.executable, "-m", "launcher", "policy"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=60)
    printed = json.loads(result.stdout)
    assert printed["job"]["podFailurePolicy"] == JOB["podFailurePolicy"]
    assert printed["jobSet"]["failurePolicy"] == SPEC["failurePolicy"]


def _verdict(exit_code: int) -> str:
    """Kubernetes' podFailurePolicy (first match wins, else Count) and then JobSet's rules."""
    reason = "BackoffLimitExceeded"
    for rule in JOB["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and exit_code != 0 and codes["containerName"] == CONTAINER["name"]:
            inside = exit_code in codes["values"]
            if inside == (codes["operator"] == "In"):
                reason = "PodFailurePolicy" if rule["action"] == "FailJob" else reason
                break
    for rule in SPEC["failurePolicy"]["rules"]:
        if reason in rule["onJobFailureReasons"]:
            return rule["action"]
    return "RestartJobSet"


@pytest.mark.parametrize("code", range(1, 256))
def test_kubernetes_retries_exactly_what_the_launcher_calls_retryable(code):
    expected = "RestartJobSet" if is_retryable(code, DEFAULT_RETRYABLE_EXIT_CODES) else "FailJobSet"
    assert _verdict(code) == expected


@pytest.mark.parametrize("what, code, action", [
    ("a process exited 3 (every pod exits 3, naming it)", 3, "FailJobSet"),
    ("two pods share a JAX_PROCESS_ID (multi-slice)", 2, "FailJobSet"),
    ("the coordinator never came up", TRANSIENT, "RestartJobSet"),
    ("a peer vanished; JAX aborted this process", TRANSIENT, "RestartJobSet"),
    ("a process was OOM-killed", 137, "RestartJobSet"),
    ("JAX aborted without a word from the launcher", 134, "FailJobSet"),
])
def test_what_happens_to_a_jax_trainjob_when(what, code, action):
    assert _verdict(code) == action
    assert is_retryable(classify(code).exit_code, DEFAULT_RETRYABLE_EXIT_CODES) == (action == "RestartJobSet")
