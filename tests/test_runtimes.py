"""The ClusterTrainingRuntimes under runtimes/: accepted by the upstream Trainer CRD (schema,
CEL rules, JobSet and Job admission rules), true to the in-pod contract, and failing the way
the launcher's exit-code table says they should."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

import k8s_checks
from launcher import __version__, cli
from launcher.core import failure_policy
from launcher.core.knobs import KNOBS
from launcher.core.outcome import (
    DEFAULT_RETRYABLE_EXIT_CODES,
    ConfigError,
    Outcome,
    Reasons,
    WaitTimeout,
    classify,
    is_retryable,
    terminated,
)
from launcher.core.settings import LauncherSettings
from launcher.mpi.settings import MpiSettings

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ROOT / "runtimes"
KUSTOMIZATION = RUNTIMES / "kustomization.yml"
REGISTRY = "ghcr.io/trainer-launcher/"
TORCH_IMAGE = REGISTRY + "trainer-launcher-torch"
MPI_IMAGES = {"openmpi": REGISTRY + "trainer-launcher-mpi-openmpi",
              "intel": REGISTRY + "trainer-launcher-mpi-intel",
              "mpich": REGISTRY + "trainer-launcher-mpi-mpich"}
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK = "trainer.kubeflow.org/framework"
MPI_FLAVOR = "trainer-launcher/mpi-implementation"
INITIALIZERS = ("dataset-initializer", "model-initializer")
# Where validation runs: the first release with podFailurePolicy GA, and the newest shipped.
KUBERNETES_VERSIONS = ("1.31", "1.37")
# A runtime that needs a later first release: container restart rules came in 1.34.
FIRST_KUBERNETES = {"torch-distributed-inplace.yaml": "1.34"}
IN_PLACE_RBAC = RUNTIMES / "in-place-restart" / "rbac.yaml"
IN_PLACE_ADMISSION = RUNTIMES / "in-place-restart" / "admission-policy.yaml"


def _load(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


# Each runtime, and the framework label the Kubeflow SDK finds it by (upstream's names).
FRAMEWORK_OF = {
    "torch-distributed.yaml": "torch", "torch-distributed-with-initializers.yaml": "torch",
    "torch-distributed-inplace.yaml": "torch",
    "mpi-distributed.yaml": "mpi", "mpi-distributed-intel.yaml": "mpi", "mpi-distributed-mpich.yaml": "mpi",
    "jax-distributed.yaml": "jax", "xgboost-distributed.yaml": "xgboost",
    "deepspeed-distributed.yaml": "deepspeed", "mlx-distributed.yaml": "mlx",
    "torchtune-llama3.2-1b.yaml": "torchtune",
}
# The image each framework's runtimes run (built from Dockerfile.torch or Dockerfile.mpi by build args).
FRAMEWORK_IMAGES = {"jax": REGISTRY + "trainer-launcher-jax", "xgboost": REGISTRY + "trainer-launcher-xgboost",
                    "deepspeed": REGISTRY + "trainer-launcher-deepspeed", "mlx": REGISTRY + "trainer-launcher-mlx",
                    "torchtune": REGISTRY + "trainer-launcher-torchtune"}
RUNTIME_FILES = sorted(RUNTIMES.glob("*.yaml"))  # the kustomization is .yml
DOCS = {p.name: _load(p) for p in RUNTIME_FILES}
TORCH = {n: d for n, d in DOCS.items() if "torch" in d["spec"]["mlPolicy"]}
IN_PLACE = {n for n, d in DOCS.items()
            if d["spec"]["template"]["spec"]["failurePolicy"].get("restartStrategy") == failure_policy.IN_PLACE_RESTART_STRATEGY}
MPI = {n: d for n, d in DOCS.items() if "mpi" in d["spec"]["mlPolicy"]}

needs_crd = pytest.mark.skipif(
    not k8s_checks.CLUSTER_RUNTIME_CRD.exists(),
    reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})",
)


def replicated_jobs(doc: dict) -> dict[str, dict]:
    return {rjob["name"]: rjob for rjob in doc["spec"]["template"]["spec"]["replicatedJobs"]}


def pod_spec(rjob: dict) -> dict:
    return rjob["template"]["spec"]["template"]["spec"]


def only_container(rjob: dict) -> dict:
    (container,) = pod_spec(rjob)["containers"]
    return container


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


# --- the set of files ----------------------------------------------------------------------

def test_there_is_a_runtime_for_every_framework_upstream_ships_and_every_mpi():
    assert set(DOCS) == set(FRAMEWORK_OF)
    generic_mpi = [d for n, d in MPI.items() if FRAMEWORK_OF[n] == "mpi"]
    assert {d["metadata"]["labels"][MPI_FLAVOR] for d in generic_mpi} == set(MPI_IMAGES)


def test_kustomization_lists_exactly_the_runtime_files():
    listed = _load(KUSTOMIZATION)["resources"]
    assert sorted(listed) == [p.name for p in RUNTIME_FILES]
    assert len(listed) == len(set(listed))


def test_the_sdks_container_backend_pointed_at_runtimes_loads_each_runtime_without_a_warning(caplog):
    """TrainingRuntimeSource(sources=["runtimes/"]) reads every *.yaml there as a runtime, on every
    call; the kustomization (kustomization.yml) is not one of them."""
    from kubeflow.trainer.backends.container.runtime_loader import list_training_runtimes_from_sources

    caplog.set_level(logging.DEBUG, logger="kubeflow.trainer.backends.container.runtime_loader")
    loaded = list_training_runtimes_from_sources([str(RUNTIMES)])
    assert sorted(runtime.name for runtime in loaded) == sorted(doc["metadata"]["name"] for doc in DOCS.values())
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_each_file_is_one_cluster_training_runtime_named_like_the_file():
    for name, doc in DOCS.items():
        with open(RUNTIMES / name, encoding="utf-8") as handle:
            assert len(list(yaml.safe_load_all(handle))) == 1, name
        assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        assert doc["kind"] == "ClusterTrainingRuntime"
        assert doc["metadata"]["name"] + ".yaml" == name


# --- the upstream CRD, CEL rules and admission --------------------------------------------

@needs_crd
@pytest.mark.parametrize("name", sorted(DOCS))
def test_runtime_is_accepted_by_the_upstream_crd_and_the_jobset_webhook(name):
    assert k8s_checks.validate_runtime(DOCS[name]) == []


@needs_crd
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(DOCS))
def test_embedded_jobs_and_claims_are_valid_core_objects(name, version):
    version = max(version, FIRST_KUBERNETES.get(name, version), key=lambda v: tuple(map(int, v.split("."))))
    objects = k8s_checks.embedded_jobs(DOCS[name]) + k8s_checks.embedded_claims(DOCS[name])
    assert [e for obj in objects for e in k8s_checks.core_errors(obj, version)] == []


@needs_crd
def test_every_cel_rule_of_the_crd_compiles_except_transition_rules():
    import celpy

    rules = k8s_checks.cel_rules(k8s_checks.openapi_schema())
    skipped = [(path, r["rule"]) for path, r in rules if k8s_checks.TRANSITION_MARK in r["rule"]]
    evaluated = [(path, r["rule"]) for path, r in rules if k8s_checks.TRANSITION_MARK not in r["rule"]]
    assert len(evaluated) >= 5
    # Only the immutability rules need oldSelf; they cannot apply to a create.
    assert {rule for _, rule in skipped} == {"self == oldSelf"}
    assert k8s_checks.UNSUPPORTED_RULES == {}
    environment = celpy.Environment()
    for _, rule in evaluated:
        environment.compile(rule)  # raises on a function cel-python lacks


def _mutated(name: str, change) -> dict:
    doc = copy.deepcopy(DOCS[name])
    change(doc)
    return doc


def _spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def _job(doc: dict, rjob: str) -> dict:
    return replicated_jobs(doc)[rjob]["template"]["spec"]


REJECTED = {
    # Older Trainer docs put numProcPerNode here; v2.3 moved it to the TrainJob.
    "unknown field": ("torch-distributed.yaml",
                      lambda d: d["spec"]["mlPolicy"]["torch"].update(numProcPerNode="auto"),
                      "'numProcPerNode' was unexpected"),
    "bad enum": ("mpi-distributed-intel.yaml",
                 lambda d: d["spec"]["mlPolicy"]["mpi"].update(mpiImplementation="Intel"),
                 "'Intel' is not one of"),
    "CEL: two policies": ("mpi-distributed.yaml",
                          lambda d: d["spec"]["mlPolicy"].update(torch={}),
                          "Only one of the policy can be configured"),
    "CEL: no processes": ("mpi-distributed.yaml",
                          lambda d: d["spec"]["mlPolicy"]["mpi"].update(numProcPerNode=0),
                          "must be >= 1"),
    "CEL: startupPolicy with dependsOn": (
        "torch-distributed-with-initializers.yaml",
        lambda d: _spec(d).update(startupPolicy={"startupPolicyOrder": "InOrder"}),
        "mutually exclusive"),
    "CEL: namespaced claim": (
        "torch-distributed-with-initializers.yaml",
        lambda d: _spec(d)["volumeClaimPolicies"][0]["templates"][0]["metadata"].update(namespace="x"),
        "namespace cannot be set"),
    "int32 overflow": ("mpi-distributed.yaml",
                       lambda d: d["spec"]["mlPolicy"]["mpi"].update(numProcPerNode=2**31),
                       "is not a 'int32'"),
    "duplicate replicated job": ("torch-distributed.yaml",
                                 lambda d: _spec(d)["replicatedJobs"].append(copy.deepcopy(_spec(d)["replicatedJobs"][0])),
                                 "duplicate entries"),
    "launcher before its workers": ("mpi-distributed.yaml",
                                    lambda d: _spec(d)["replicatedJobs"].reverse(),
                                    "cannot depend on another"),
    "JobSet rule name with a hyphen": ("torch-distributed.yaml",
                                       lambda d: _spec(d)["failurePolicy"]["rules"][0].update(name="permanent-exit"),
                                       "letters, digits and _,: only"),
    "unknown Job failure reason": ("torch-distributed.yaml",
                                   lambda d: _spec(d)["failurePolicy"]["rules"][0].update(onJobFailureReasons=["OOMKilled"]),
                                   "is not a Job failure reason"),
    "exit codes out of order": (
        "torch-distributed.yaml",
        lambda d: _job(d, "node")["podFailurePolicy"]["rules"][1]["onExitCodes"].update(values=[143, 0, 130]),
        "ordered ascending"),
    "0 with In": ("torch-distributed.yaml",
                  lambda d: _job(d, "node")["podFailurePolicy"]["rules"][1]["onExitCodes"].update(operator="In"),
                  "0 cannot be used with In"),
    "policy names no container": (
        "mpi-distributed.yaml",
        lambda d: _job(d, "launcher")["podFailurePolicy"]["rules"][1]["onExitCodes"].update(containerName="launcher"),
        "names no container"),
    "podFailurePolicy with OnFailure": (
        "torch-distributed.yaml",
        lambda d: _job(d, "node")["template"]["spec"].update(restartPolicy="OnFailure"),
        "only Never is supported"),
    "claim nobody mounts": (
        "torch-distributed-with-initializers.yaml",
        lambda d: [c.pop("volumeMounts") for r in _spec(d)["replicatedJobs"] for c in r["template"]["spec"]["template"]["spec"]["containers"]],
        "no container mounts it"),
    "claim declared as a pod volume": (
        "torch-distributed-with-initializers.yaml",
        lambda d: _job(d, "node")["template"]["spec"].update(volumes=[{"name": "initializer", "emptyDir": {}}]),
        "which JobSet provides"),
    "InPlaceRestart: backoffLimit": (
        "torch-distributed-inplace.yaml", lambda d: _job(d, "node").update(backoffLimit=0), "2147483647 (MaxInt32)"),
    "InPlaceRestart: podReplacementPolicy": (
        "torch-distributed-inplace.yaml", lambda d: _job(d, "node").pop("podReplacementPolicy"), "must be Failed"),
    "InPlaceRestart: completions": (
        "torch-distributed-with-initializers.yaml",
        lambda d: _spec(d)["failurePolicy"].update(restartStrategy="InPlaceRestart"), "completions and parallelism"),
    "bad label": ("torch-distributed.yaml",
                  lambda d: d["metadata"]["labels"].update({FRAMEWORK: "torch distributed"}),
                  "not a valid label value"),
}


@needs_crd
@pytest.mark.parametrize("case", sorted(REJECTED))
def test_the_validator_rejects_what_the_api_server_would(case):
    name, change, expected = REJECTED[case]
    errors = k8s_checks.validate_runtime(_mutated(name, change))
    assert any(expected in e for e in errors), errors


@needs_crd
def test_kubernetes_validate_rejects_an_unknown_container_field():
    doc = _mutated("mpi-distributed.yaml",
                   lambda d: only_container(replicated_jobs(d)["node"]).update(readinessProb={"tcpSocket": {"port": 2222}}))
    (job,) = [j for j in k8s_checks.embedded_jobs(doc) if j["metadata"]["name"].endswith("-node-0")]
    errors = k8s_checks.core_errors(job, KUBERNETES_VERSIONS[0])
    assert errors and "readinessProb" in errors[0]


# --- the failure policy agrees with the exit-code table -----------------------------------

@pytest.mark.parametrize("name", sorted(DOCS))
def test_failure_policy_is_the_one_derived_from_the_exit_code_table(name):
    doc, in_place = DOCS[name], name in IN_PLACE
    assert _spec(doc)["failurePolicy"] == failure_policy.jobset_failure_policy(in_place=in_place)
    for rjob_name, rjob in replicated_jobs(doc).items():
        expected = failure_policy.job_policy(rjob_name, in_place=in_place)
        job = rjob["template"]["spec"]
        assert job["backoffLimit"] == expected["backoffLimit"], rjob_name
        assert job.get("podReplacementPolicy") == expected.get("podReplacementPolicy"), rjob_name
        assert job["podFailurePolicy"] == expected["podFailurePolicy"], rjob_name
        assert job["template"]["spec"]["restartPolicy"] == expected["template"]["spec"]["restartPolicy"], rjob_name
        # One value: the launcher's default grace, and the margin it needs for its termination message.
        pod = expected["template"]["spec"]["terminationGracePeriodSeconds"]
        assert job["template"]["spec"]["terminationGracePeriodSeconds"] == pod, rjob_name
        container = only_container(rjob)
        rules = {key: container[key] for key in ("restartPolicy", "restartPolicyRules") if key in container}
        assert rules == (failure_policy.container_restart_rules() if in_place else {}), rjob_name


def pod_failure_action(rules: list[dict], exit_codes: dict[str, int], conditions: frozenset[str] = frozenset()) -> str:
    """Kubernetes' podFailurePolicy matching: rules in order, the first match wins, no match is
    Count. onExitCodes looks at the named container (every container without a name) and
    skips containers that exited 0; an unknown operator never matches."""
    for rule in rules:
        if "onPodConditions" in rule:
            if any(p["type"] in conditions and p.get("status", "True") == "True" for p in rule["onPodConditions"]):
                return rule["action"]
            continue
        requirement = rule["onExitCodes"]
        codes = [code for container, code in exit_codes.items()
                 if requirement.get("containerName") in (None, container) and code != 0]
        if requirement["operator"] == "In":
            matched = any(code in requirement["values"] for code in codes)
        elif requirement["operator"] == "NotIn":
            matched = any(code not in requirement["values"] for code in codes)
        else:
            matched = False
        if matched:
            return rule["action"]
    return "Count"


def job_failure_reason(job: dict, exit_codes: dict[str, int], conditions: frozenset[str] = frozenset()) -> str | None:
    """Why the Job fails when its pods keep failing like this; None when it never fails."""
    action = pod_failure_action(job["podFailurePolicy"]["rules"], exit_codes, conditions)
    if action == "FailJob":
        return "PodFailurePolicy"
    if action == "Count":  # the (backoffLimit + 1)th counted failure fails the Job
        return "BackoffLimitExceeded"
    return None  # Ignore: a replacement pod, nothing counted


def jobset_action(policy: dict, rjob_name: str, reason: str) -> str:
    """JobSet: the first rule whose reasons and targets match; no match restarts the JobSet."""
    for rule in policy.get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        if rule.get("targetReplicatedJobs") and rjob_name not in rule["targetReplicatedJobs"]:
            continue
        return rule["action"]
    return "RestartJobSet"


def restarted_in_place(pod: dict, exit_codes: dict[str, int]) -> bool:
    """Kubernetes' container restart rules (1.34+): a container whose exit code matches its first
    matching Restart rule is restarted where it runs, and its pod does not fail."""
    for container in pod["containers"]:
        code = exit_codes.get(container["name"])
        for rule in container.get("restartPolicyRules", []) if code is not None else []:
            values, operator = rule["exitCodes"]["values"], rule["exitCodes"]["operator"]
            if (code in values) == (operator == "In"):
                return rule["action"] == "Restart"
    return False


def verdict(doc: dict, rjob_name: str, exit_codes: dict[str, int], conditions: frozenset[str] = frozenset()) -> str:
    if not conditions and restarted_in_place(_job(doc, rjob_name)["template"]["spec"], exit_codes):
        return "RestartInPlace"
    reason = job_failure_reason(_job(doc, rjob_name), exit_codes, conditions)
    return "PodReplaced" if reason is None else jobset_action(_spec(doc)["failurePolicy"], rjob_name, reason)


def every_outcome():
    """Every way the launcher can end in failure, as outcome.py classifies it."""
    outcomes = [classify(code) for code in range(1, 256)]
    outcomes += [classify(-signum) for signum in range(1, 65)]
    outcomes += [classify(1, evidence="NCCL communicator was aborted"), classify(-signal.SIGABRT, evidence="Xid 79")]
    outcomes += [terminated(signum)
                 for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)]
    outcomes += [ConfigError("STORAGE_URI", "ftp://x", "an hf:// or s3:// URI").outcome(), WaitTimeout("no master").outcome()]
    # Every reason of the table with a code of its own (the rules' codes are all above).
    outcomes += [Outcome.of(reason, f"ended: {reason}") for reason in Reasons.all() if reason.code]
    return outcomes


@pytest.mark.parametrize("name", sorted(DOCS))
def test_kubernetes_retries_exactly_the_failures_the_launcher_calls_retryable(name):
    doc = DOCS[name]
    assert _spec(doc)["failurePolicy"]["maxRestarts"] > 0
    for rjob_name, rjob in replicated_jobs(doc).items():
        container = only_container(rjob)["name"]
        retry = "RestartInPlace" if name in IN_PLACE else "RestartJobSet"
        for outcome in every_outcome():
            expected = retry if is_retryable(outcome.exit_code, DEFAULT_RETRYABLE_EXIT_CODES) else "FailJobSet"
            got = verdict(doc, rjob_name, {container: outcome.exit_code})
            assert got == expected, (rjob_name, outcome.exit_code, outcome.reason)


@pytest.mark.parametrize("code, expected", [
    (1, "FailJobSet"),     # a Python exception, CUDA out of memory
    (2, "FailJobSet"),     # the launcher's configuration error
    (127, "FailJobSet"),   # command not found
    (134, "FailJobSet"),   # SIGABRT without evidence of a node fault
    (139, "FailJobSet"),   # SIGSEGV
    (130, "RestartJobSet"),
    (137, "RestartJobSet"),  # SIGKILL, the OOM killer
    (138, "RestartJobSet"),  # a node or network fault the launcher recognised
    (143, "RestartJobSet"),
])
def test_what_happens_to_a_trainjob_whose_trainer_exits_with(code, expected):
    doc = DOCS["torch-distributed.yaml"]
    assert verdict(doc, "node", {"node": code}) == expected
    assert is_retryable(classify(code).exit_code, DEFAULT_RETRYABLE_EXIT_CODES) == (expected == "RestartJobSet")


def test_a_preempted_pod_is_replaced_without_counting_whatever_its_exit_code():
    doc = DOCS["torch-distributed.yaml"]
    assert verdict(doc, "node", {"node": 1}, frozenset({"DisruptionTarget"})) == "PodReplaced"


def test_only_the_named_container_decides():
    doc = DOCS["torch-distributed.yaml"]
    # A sidecar's exit code does not fail the Job; the trainer's retryable code is what counts.
    assert verdict(doc, "node", {"node": 137, "log-shipper": 1}) == "RestartJobSet"
    assert verdict(doc, "node", {"node": 0, "log-shipper": 1}) == "RestartJobSet"


def test_initializers_retry_pods_before_the_jobset_restarts():
    jobs = replicated_jobs(DOCS["torch-distributed-with-initializers.yaml"])
    assert all(jobs[name]["template"]["spec"]["backoffLimit"] > 0 for name in INITIALIZERS)
    assert jobs["node"]["template"]["spec"]["backoffLimit"] == 1  # one pod replaced, which rejoins the others


# --- who retries what: the table in the docs says what Kubernetes does -------------------------

def test_who_retries_reads_the_policy_as_kubernetes_matches_it():
    """failure_policy.job_action and jobset_rule (what the docs' table is made of) agree with the
    matching above, which follows Kubernetes' rules, for every exit code and a disrupted pod."""
    doc = DOCS["torch-distributed.yaml"]
    rules = _job(doc, "node")["podFailurePolicy"]["rules"]
    for code in range(1, 256):
        assert failure_policy.job_action(code) == pod_failure_action(rules, {"node": code}), code
        reason = job_failure_reason(_job(doc, "node"), {"node": code})
        expected = jobset_action(_spec(doc)["failurePolicy"], "node", reason)
        assert failure_policy.jobset_rule(reason)["action"] == expected, code
    disrupted = frozenset({"DisruptionTarget"})
    assert failure_policy.job_action(1, disrupted=True) == pod_failure_action(rules, {"node": 1}, disrupted)


def test_who_retries_has_a_row_per_way_a_pod_ends_and_the_module_docstring_agrees():
    rows = failure_policy.who_retries()
    assert [row.ending.split(":")[0].split(" (")[0] for row in rows] == [
        "0", "permanent", "retryable", "pod disrupted", "another pod lost"]
    permanent, retryable, disrupted, lost = rows[1:]
    assert "restarts left or not" in permanent.launcher  # a permanent verdict ends at once
    assert failure_policy.MAX_RESTARTS_VARIABLE in retryable.launcher
    assert KNOBS["rejoin_timeout"].env in lost.launcher and "PeerLost" in lost.launcher  # the others hold
    # The docstring's summary: each class's line names the Job's action and the JobSet's.
    summary = {line.split("(")[0].strip(): line for line in (failure_policy.__doc__ or "").splitlines()
               if line.startswith("    ") and "(" in line}
    for key, row in (("permanent", permanent), ("retryable", retryable), ("pod disrupted", disrupted),
                     ("another pod lost", lost)):
        job_action = row.job.split("`")[1]
        assert f"{job_action}:" in summary[key], key
        if row.jobset.startswith("`"):
            assert row.jobset.split("`")[1] in summary[key], key


def test_the_launchers_restart_knob_is_the_one_the_table_names():
    from launcher.core.knobs import KNOBS

    if "max_restarts" not in KNOBS:
        pytest.skip("the launcher's in-place restarts (issue 37) are not in this checkout yet")
    assert KNOBS["max_restarts"].env == failure_policy.MAX_RESTARTS_VARIABLE


def _policy_cli(capsys, *argv: str) -> dict:
    assert cli.main(["policy", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("rjob_name", ["node", "dataset-initializer"])
def test_policy_command_prints_what_the_runtimes_carry(capsys, monkeypatch, rjob_name):
    monkeypatch.delenv("LAUNCHER_RETRYABLE_EXIT_CODES", raising=False)
    printed = _policy_cli(capsys, "--job", rjob_name)
    doc = DOCS["torch-distributed-with-initializers.yaml"]
    job = _job(doc, rjob_name)
    assert printed["job"]["podFailurePolicy"] == job["podFailurePolicy"]
    assert printed["job"]["backoffLimit"] == job["backoffLimit"]
    assert printed["jobSet"]["failurePolicy"] == _spec(doc)["failurePolicy"]


def test_policy_command_follows_the_launchers_retryable_codes(capsys, monkeypatch):
    monkeypatch.setenv("LAUNCHER_RETRYABLE_EXIT_CODES", "137,75")
    printed = _policy_cli(capsys, "--max-restarts", "5")
    assert printed["job"]["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"] == [0, 75, 137]
    assert printed["jobSet"]["failurePolicy"]["maxRestarts"] == 5
    assert cli.main(["policy", "--retryable-exit-codes", "0"]) == 2


# --- the in-pod contract ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DOCS))
def test_framework_label_lets_the_sdk_find_the_runtime(name):
    labels = DOCS[name]["metadata"]["labels"]
    assert labels[FRAMEWORK] == FRAMEWORK_OF[name]
    # The label agrees with the policy the controller applies.
    policy = {"torchtune": "torch", "deepspeed": "mpi", "mlx": "mpi"}.get(FRAMEWORK_OF[name], FRAMEWORK_OF[name])
    assert policy in DOCS[name]["spec"]["mlPolicy"]


@pytest.mark.parametrize("name", sorted(DOCS))
def test_containers_and_ancestor_labels_are_where_trainer_looks(name):
    jobs = replicated_jobs(DOCS[name])
    for rjob_name, rjob in jobs.items():
        labels = rjob["template"].get("metadata", {}).get("labels", {})
        container = only_container(rjob)
        if rjob_name in INITIALIZERS:
            assert labels == {ANCESTOR: rjob_name}
            assert container["name"] == rjob_name
        elif rjob_name == "node" and name in MPI:  # MPI workers take nothing from the TrainJob
            assert ANCESTOR not in labels
            assert container["name"] == "node"
        else:
            assert rjob_name in ("node", "launcher")
            assert labels == {ANCESTOR: "trainer"}
            assert container["name"] == "node"
        assert rjob.get("replicas", 1) == 1
    trainers = [n for n, r in jobs.items() if r["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer"]
    assert trainers == (["launcher"] if name in MPI else ["node"])


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_training_pod_gets_a_memory_backed_dev_shm(name):
    # A pod's /dev/shm is 64 MB, which `trainer-launcher smoke` fails (tests/test_images.py shows it).
    for rjob_name, rjob in replicated_jobs(DOCS[name]).items():
        if rjob_name in INITIALIZERS:
            continue
        volumes = {v["name"]: v for v in pod_spec(rjob).get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for m in only_container(rjob).get("volumeMounts", [])}
        assert volumes[mounts["/dev/shm"]] == {"name": mounts["/dev/shm"], "emptyDir": {"medium": "Memory"}}


def _parsed(command: list[str], trainjob_args: list[str]):
    assert command[0] == "trainer-launcher"
    head, rest = cli._split([*command[1:], *trainjob_args])
    assert rest == trainjob_args
    return cli._parser(cli.frameworks()).parse_args(head)


def test_commands_are_launcher_invocations_that_take_the_trainjob_args():
    # TrainJob args may start with torchrun's or mpirun's own flags; `--` keeps them off the launcher.
    passed = {"torch": ["--nproc-per-node", "2", "train.py", "--epochs", "3"],
              "mpi": ["-x", "NCCL_DEBUG", "python3", "train.py"],
              "jax": ["python", "train.py", "--steps", "100"],
              "xgboost": ["python", "train.py", "--rounds", "100"]}
    for name, doc in DOCS.items():
        for rjob_name, rjob in replicated_jobs(doc).items():
            container = only_container(rjob)
            assert "args" not in container  # left for the TrainJob
            if rjob_name in INITIALIZERS:
                args = _parsed(container["command"], [])
                assert (args.command, args.kind) == ("init", rjob_name.split("-")[0])
            elif rjob_name == "node" and name in MPI:
                args = _parsed(container["command"], [])
                assert args.command == "mpi" and args.worker
            elif container["command"][0] == "tune":
                # torchtune's own command; the image's tune shim runs `tune run` through the
                # launcher (tests/test_tune.py plans and runs it).
                assert FRAMEWORK_OF[name] == "torchtune" and container["command"][1] == "run"
                assert (ROOT / "images" / "shims" / "tune").exists()
            else:
                framework = next(policy for policy in passed if policy in doc["spec"]["mlPolicy"])
                args = _parsed(container["command"], passed[framework])
                assert args.command == framework and not getattr(args, "worker", False)


def test_initializers_and_trainer_share_the_initializer_volume_at_workspace():
    doc = DOCS["torch-distributed-with-initializers.yaml"]
    (policy,) = _spec(doc)["volumeClaimPolicies"]
    assert [t["metadata"]["name"] for t in policy["templates"]] == ["initializer"]
    for rjob_name in (*INITIALIZERS, "node"):
        rjob = replicated_jobs(doc)[rjob_name]
        assert {"name": "initializer", "mountPath": "/workspace"} in only_container(rjob)["volumeMounts"], rjob_name
        # Our image runs as uid 1000 and a new volume belongs to root: the group makes it writable.
        assert pod_spec(rjob)["securityContext"]["fsGroup"] == 1000, rjob_name


def test_training_waits_for_both_downloads_and_the_mpi_launcher_for_its_workers():
    jobs = replicated_jobs(DOCS["torch-distributed-with-initializers.yaml"])
    assert sorted(jobs["node"]["dependsOn"], key=lambda d: d["name"]) == [
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]
    for doc in MPI.values():
        assert replicated_jobs(doc)["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
        assert _spec(doc)["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}


@pytest.mark.parametrize("name", sorted(MPI))
def test_mpi_workers_serve_ssh_as_mpiuser_with_the_mounted_keys(name):
    doc = DOCS[name]
    mpi = doc["spec"]["mlPolicy"]["mpi"]
    assert mpi["mpiImplementation"] == "OpenMPI"
    assert mpi["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    assert mpi["runLauncherAsNode"] is True
    jobs = replicated_jobs(doc)
    probe = only_container(jobs["node"])["readinessProbe"]
    assert probe["tcpSocket"]["port"] == MpiSettings.model_fields["ssh_port"].default == 2222
    for rjob in jobs.values():
        # Secret files are root-owned, mode 0640: the group (fsGroup) is how uid 1000 reads them.
        assert pod_spec(rjob)["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
        assert env_of(only_container(rjob))["LAUNCHER_SSH_AUTH_MOUNT_PATH"] == mpi["sshAuthMountPath"]


def test_images_are_ours_tagged_with_the_package_version():
    for name, doc in DOCS.items():
        for rjob in replicated_jobs(doc).values():
            image, _, tag = only_container(rjob)["image"].rpartition(":")
            assert tag == __version__, name
            if only_container(rjob)["command"][1:2] == ["init"]:
                assert image == TORCH_IMAGE, name  # one initializer image for every framework
            elif FRAMEWORK_OF[name] in FRAMEWORK_IMAGES:
                assert image == FRAMEWORK_IMAGES[FRAMEWORK_OF[name]], name
            elif name in TORCH:
                assert image == TORCH_IMAGE, name
            else:
                assert image == MPI_IMAGES[doc["metadata"]["labels"][MPI_FLAVOR]], name
    entries = {e["name"]: e for e in _load(KUSTOMIZATION)["images"]}
    assert set(entries) == {TORCH_IMAGE, *MPI_IMAGES.values(), *FRAMEWORK_IMAGES.values()}
    assert all(e["newTag"] == __version__ for e in entries.values())


def test_the_launcher_in_each_pod_stops_its_ranks_within_the_pods_grace_and_keeps_its_margin():
    """What each pod's grace leaves the launcher is what it takes by default: the ranks get the
    whole grace to checkpoint, and the kubelet's SIGKILL comes only after the margin."""
    grace = LauncherSettings.model_fields["grace_period"].default
    for doc in DOCS.values():
        for rjob in replicated_jobs(doc).values():
            pod = pod_spec(rjob)["terminationGracePeriodSeconds"]
            assert failure_policy.grace_period_for(pod) == grace
            assert pod - grace >= failure_policy.TERMINATION_MARGIN


# --- in-place restart (launcher/k8s/inplace.py) --------------------------------------------

def _env_sources(container: dict) -> dict[str, str]:
    """Each variable's value, or the field the downward API takes it from."""
    return {item["name"]: item["value"] if "value" in item else item["valueFrom"]["fieldRef"]["fieldPath"]
            for item in container.get("env", [])}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_runtimes_give_the_launcher_what_jobsets_agent_reads(name, tmp_path):
    from launcher.k8s import api, inplace

    (rjob,) = replicated_jobs(DOCS[name]).values()
    env = _env_sources(only_container(rjob))
    assert env[inplace.JOBSET_NAME_ENV] == "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
    assert env[inplace.POD_NAME_ENV] == "metadata.name"
    (tmp_path / "namespace").write_text("team-a")
    agent = inplace.InPlaceRestart.from_env({
        inplace.JOBSET_NAME_ENV: "llama", inplace.POD_NAME_ENV: "llama-node-0-0-x2b4q",
        inplace.EXIT_CODE_ENV: env[inplace.EXIT_CODE_ENV], api.HOST_ENV: "10.96.0.1",
        api.SERVICE_ACCOUNT_DIR_ENV: str(tmp_path)})
    assert agent is not None
    # The launcher's exit when the JobSet asks restarts its container in place, and is retryable.
    assert verdict(DOCS[name], "node", {"node": agent.exit_code}) == "RestartInPlace"
    assert is_retryable(agent.exit_code, DEFAULT_RETRYABLE_EXIT_CODES)
    assert pod_spec(rjob)["serviceAccountName"] == _load_all(IN_PLACE_RBAC)[0]["metadata"]["name"]


def _load_all(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(yaml.safe_load_all(handle))


def test_the_in_place_service_account_is_bound_to_its_role():
    account, role, binding = _load_all(IN_PLACE_RBAC)
    assert (account["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role", "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    # Namespaced objects without a namespace: `kubectl apply -n <namespace>` places them.
    assert all("namespace" not in obj["metadata"] for obj in (account, role, binding))
    for obj in (account, role, binding, *_load_all(IN_PLACE_ADMISSION)):
        assert k8s_checks.core_errors(obj, KUBERNETES_VERSIONS[-1]) == []


def _admits(old: dict, new: dict, username: str) -> bool:
    """The admission policy as the API server evaluates it, with cel-python: True when the
    update is let through (not matched, or every validation holds)."""
    import celpy
    from celpy import celtypes

    policy = _load_all(IN_PLACE_ADMISSION)[0]["spec"]
    environment = celpy.Environment()

    def evaluate(expression: str, activation: dict):
        return environment.program(environment.compile(expression)).evaluate(activation)

    request = {"request": celpy.json_to_cel({"userInfo": {"username": username}})}
    if not all(evaluate(c["expression"], request) for c in policy["matchConditions"]):
        return True
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    variables: dict = {}
    for variable in policy["variables"]:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    return all(evaluate(v["expression"], activation) for v in policy["validations"])


@pytest.mark.parametrize("change, admitted", [
    (lambda pod: pod["metadata"].setdefault("annotations", {}).update({"jobset.sigs.k8s.io/in-place-restart-attempt": "1"}), True),
    (lambda pod: pod["metadata"]["annotations"].update({"team": "b"}), False),
    (lambda pod: pod["metadata"]["labels"].update({"app": "other"}), False),
    (lambda pod: pod["metadata"].update(finalizers=["example.com/hold"]), False),
    (lambda pod: pod["spec"]["containers"][0].update(image="elsewhere/evil:1"), False),
], ids=["the attempt", "another annotation", "a label", "a finalizer", "the spec"])
def test_the_admission_policy_lets_the_in_place_account_change_only_the_attempt(change, admitted):
    old = {"metadata": {"name": "llama-node-0-0-x2b4q", "labels": {"app": "llama"}, "annotations": {"team": "a"}},
           "spec": {"containers": [{"name": "node", "image": "ghcr.io/trainer-launcher/trainer-launcher-torch:0.1.0"}]}}
    new = copy.deepcopy(old)
    change(new)
    account = "system:serviceaccount:team-a:trainer-launcher-in-place-restart"
    assert _admits(old, new, account) == admitted
    assert _admits(old, new, "system:serviceaccount:team-a:default")  # others: not this policy's business


# --- kustomize ----------------------------------------------------------------------------

def _kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


needs_kustomize = pytest.mark.skipif(_kustomize_command() is None, reason="neither kustomize nor kubectl on PATH")


def _build(directory: Path) -> list[dict]:
    result = subprocess.run([*_kustomize_command(), str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


@needs_kustomize
def test_kubectl_apply_k_gets_every_runtime_unchanged():
    built = {doc["metadata"]["name"] + ".yaml": doc for doc in _build(RUNTIMES)}
    assert built == DOCS


@needs_kustomize
def test_a_kustomize_overlay_retargets_the_images(tmp_path):
    overlay = {
        "resources": [os.path.relpath(RUNTIMES, tmp_path)],
        "images": [{"name": TORCH_IMAGE, "newName": "registry.example.com/ml/torch", "newTag": "7.7"},
                   {"name": MPI_IMAGES["intel"], "newName": "registry.example.com/ml/impi", "newTag": "7.7"}],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    images = {}
    for doc in _build(tmp_path):
        for rjob in replicated_jobs(doc).values():
            images.setdefault(doc["metadata"]["name"], set()).add(only_container(rjob)["image"])
    assert images["torch-distributed-with-initializers"] == {"registry.example.com/ml/torch:7.7"}
    assert images["mpi-distributed-intel"] == {"registry.example.com/ml/impi:7.7"}
    assert images["mpi-distributed"] == {f"{MPI_IMAGES['openmpi']}:{__version__}"}


# --- the example TrainJobs docs/cluster.md shows ---------------------------------------------

EXAMPLES = sorted((ROOT / "examples").glob("trainjob-*.yaml"))
TRAINJOB_CRD = k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"


@needs_crd
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_trainjobs_are_accepted_and_name_a_shipped_runtime(path):
    doc = _load(path)
    schema = k8s_checks.openapi_schema(TRAINJOB_CRD)
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    errors = errors or k8s_checks.cel_errors(defaulted, schema)
    assert errors == []
    assert doc["spec"]["runtimeRef"]["name"] in {d["metadata"]["name"] for d in DOCS.values()}


def test_there_is_an_example_trainjob_for_every_framework():
    examples = {p.name: _load(p) for p in EXAMPLES}
    assert set(examples) == {f"trainjob-{framework}.yaml" for framework in set(FRAMEWORK_OF.values())}
    runtime_framework = {d["metadata"]["name"]: FRAMEWORK_OF[n] for n, d in DOCS.items()}
    for name, doc in examples.items():
        assert name == f"trainjob-{runtime_framework[doc['spec']['runtimeRef']['name']]}.yaml"


# --- who the pods run as --------------------------------------------------------------------

TORCH_FAMILY = {n for n, framework in FRAMEWORK_OF.items() if framework in ("torch", "jax", "xgboost", "torchtune")}


@pytest.mark.parametrize("name", sorted(TORCH_FAMILY))
def test_every_pod_of_the_torch_images_runtimes_runs_as_uid_1000_never_root(name):
    """The torch image starts as root for docker/podman (its entrypoint drops to uid 1000); a
    TrainJob's `command:` replaces that entrypoint, so these pods say who they run as: uid 1000,
    never root, and fsGroup 1000 so that a new volume (root's) is theirs to write."""
    for rjob_name, rjob in replicated_jobs(DOCS[name]).items():
        context = pod_spec(rjob).get("securityContext", {})
        assert context == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}, rjob_name
