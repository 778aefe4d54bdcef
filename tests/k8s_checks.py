"""What a Kubernetes API server (with the Trainer CRDs and the JobSet webhook installed) would
check on a ClusterTrainingRuntime, done offline: no API server can be had here.

- the CRD's ``openAPIV3Schema`` after structural defaulting, with unknown fields rejected
  (as ``kubectl apply --validate=strict`` / server-side field validation does);
- the CRD's ``x-kubernetes-validations`` CEL rules, with cel-python, wherever the schema has them;
- ``x-kubernetes-list-type`` set/map uniqueness;
- the admission rules of batch/v1 Job (podFailurePolicy) and of the JobSet webhook that the
  schema cannot express (first job has no dependsOn, rule names, volume claim templates, ...).

Each check returns a list of human-readable errors; empty means accepted.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

SHARED = Path(__file__).resolve().parents[2] / "shared"
CRD_DIR = SHARED / "upstream" / "kubeflow-trainer-v2.3.0" / "crds"
CLUSTER_RUNTIME_CRD = CRD_DIR / "trainer.kubeflow.org_clustertrainingruntimes.yaml"

# Rules that compare with the stored object run only on update; a create has no oldSelf.
TRANSITION_MARK = "oldSelf"
# Rules cel-python cannot evaluate, each with the reason: none today. A rule that fails to
# compile and is not listed here fails the test instead of being skipped silently.
UNSUPPORTED_RULES: dict[str, str] = {}

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_JOBSET_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
JOB_FAILURE_REASONS = {"BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                       "MaxFailedIndexesExceeded", "PodFailurePolicy"}
POD_FAILURE_ACTIONS = {"FailJob", "FailIndex", "Ignore", "Count"}
TRAINER_ANCESTOR = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")


# --- the CRD schema ---------------------------------------------------------------------------

@lru_cache(maxsize=None)
def crd(path: Path = CLUSTER_RUNTIME_CRD) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def openapi_schema(path: Path = CLUSTER_RUNTIME_CRD, version: str = "v1alpha1") -> dict:
    (served,) = [v for v in crd(path)["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def strict(schema: dict) -> dict:
    """The schema as the API server applies it: unknown fields pruned-and-rejected (strict field
    validation), ``nullable`` allowing null. Returns a copy."""
    schema = copy.deepcopy(schema)

    def visit(node: dict) -> None:
        if node.get("nullable") is True and "type" in node:
            node["type"] = [node["type"], "null"]
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for child in node.get("properties", {}).values():
            visit(child)
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                visit(node[key])
        for key in ("anyOf", "allOf", "oneOf"):
            for child in node.get(key, []):
                visit(child)

    visit(schema)
    return schema


def with_defaults(doc, schema: dict):
    """Structural defaulting, which the API server applies before it validates. Returns a copy."""
    doc = copy.deepcopy(doc)

    def visit(node, node_schema: dict) -> None:
        if isinstance(node, dict):
            props = node_schema.get("properties", {})
            for name, prop in props.items():
                if name not in node and "default" in prop:
                    node[name] = copy.deepcopy(prop["default"])
            for name, value in node.items():
                if name in props:
                    visit(value, props[name])
                elif isinstance(node_schema.get("additionalProperties"), dict):
                    visit(value, node_schema["additionalProperties"])
        elif isinstance(node, list) and isinstance(node_schema.get("items"), dict):
            for item in node:
                visit(item, node_schema["items"])

    visit(doc, schema)
    return doc


_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def schema_errors(doc: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(strict(schema), format_checker=_FORMATS)
    return [f"{_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def _path(parts) -> str:
    return "." + ".".join(str(p) for p in parts) if parts else "."


# --- CEL and list types -----------------------------------------------------------------------

def cel_rules(schema: dict) -> list[tuple[str, dict]]:
    """Every (schema path, rule) in the schema."""
    found: list[tuple[str, dict]] = []

    def visit(node: dict, path: str) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, rule))
        for name, child in node.get("properties", {}).items():
            visit(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            visit(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], f"{path}{{}}")

    visit(schema, "")
    return found


@lru_cache(maxsize=None)
def _program(rule: str):
    import celpy

    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def cel_errors(doc, schema: dict) -> list[str]:
    """Evaluate each rule with ``self`` bound to the node the rule's schema describes."""
    import celpy

    errors: list[str] = []

    def check(node, node_schema: dict, path: str) -> None:
        for rule in node_schema.get("x-kubernetes-validations", []):
            text = rule["rule"]
            if TRANSITION_MARK in text or text in UNSUPPORTED_RULES:
                continue
            try:
                result = _program(text).evaluate({"self": celpy.json_to_cel(node)})
            except celpy.CELEvalError as error:  # the API server rejects an object a rule errors on
                result = error
            if not isinstance(result, celpy.celtypes.BoolType):
                errors.append(f"{path}: rule {text!r} did not give a bool: {result!r}")
            elif not result:
                errors.append(f"{path}: {rule.get('message') or text}")
        list_type = node_schema.get("x-kubernetes-list-type")
        if isinstance(node, list) and list_type in ("set", "map"):
            keys = node_schema.get("x-kubernetes-list-map-keys", [])
            seen = [repr(item) if list_type == "set" else tuple(item.get(k) for k in keys) for item in node]
            duplicates = {s for s in seen if seen.count(s) > 1}
            if duplicates:
                errors.append(f"{path}: duplicate entries in a list of type {list_type}: {sorted(map(str, duplicates))}")
        if isinstance(node, dict):
            props = node_schema.get("properties", {})
            for name, value in node.items():
                if name in props:
                    check(value, props[name], f"{path}.{name}")
                elif isinstance(node_schema.get("additionalProperties"), dict):
                    check(value, node_schema["additionalProperties"], f"{path}.{name}")
        elif isinstance(node, list) and isinstance(node_schema.get("items"), dict):
            for index, item in enumerate(node):
                check(item, node_schema["items"], f"{path}[{index}]")

    check(doc, schema, "")
    return errors


# --- metadata ---------------------------------------------------------------------------------

def metadata_errors(doc: dict, cluster_scoped: bool = True) -> list[str]:
    errors: list[str] = []
    meta = doc.get("metadata") or {}
    name = meta.get("name", "")
    if not (_DNS1123_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append(f"metadata.name {name!r}: not a DNS-1123 subdomain")
    if cluster_scoped and "namespace" in meta:
        errors.append("metadata.namespace: set on a cluster-scoped resource")
    for key, value in (meta.get("labels") or {}).items():
        errors += [f"metadata.labels[{key!r}]: {e}" for e in label_key_errors(key)]
        if not isinstance(value, str) or (value and not (_LABEL_NAME.match(value) and len(value) <= 63)):
            errors.append(f"metadata.labels[{key!r}]: value {value!r} is not a valid label value")
    return errors


def label_key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and not (_DNS1123_SUBDOMAIN.match(prefix) and len(prefix) <= 253):
        errors.append(f"prefix {prefix!r} is not a DNS-1123 subdomain")
    if not (_LABEL_NAME.match(name) and len(name) <= 63):
        errors.append(f"name {name!r} is not a qualified name")
    return errors


def validate_runtime(doc: dict, path: Path = CLUSTER_RUNTIME_CRD) -> list[str]:
    """Everything the API server, the CRD and the JobSet webhook check on create."""
    schema = openapi_schema(path)
    defaulted = with_defaults(doc, schema)
    errors = schema_errors(defaulted, schema) + metadata_errors(doc)
    if errors:  # CEL runs only on schema-valid objects
        return errors
    errors += cel_errors(defaulted, schema)
    spec = defaulted["spec"]["template"]["spec"]
    errors += jobset_errors(spec)
    for rjob in spec["replicatedJobs"]:
        errors += [f"replicatedJob {rjob['name']}: {e}" for e in job_errors(rjob["template"]["spec"])]
    return errors


# --- batch/v1 Job admission -------------------------------------------------------------------

def job_errors(job_spec: dict) -> list[str]:
    """batch/v1 Job validation beyond the OpenAPI schema, for the fields the runtimes use."""
    errors: list[str] = []
    pod = job_spec["template"]["spec"]
    names = {c["name"] for c in pod.get("containers", []) + pod.get("initContainers", [])}
    if job_spec.get("backoffLimit", 0) < 0:
        errors.append("backoffLimit: must be >= 0")
    policy = job_spec.get("podFailurePolicy")
    if policy is None:
        return errors
    if pod.get("restartPolicy") != "Never":
        errors.append("template.spec.restartPolicy: only Never is supported with podFailurePolicy")
    rules = policy.get("rules", [])
    if len(rules) > 20:
        errors.append("podFailurePolicy.rules: at most 20 rules")
    for index, rule in enumerate(rules):
        where = f"podFailurePolicy.rules[{index}]"
        if rule.get("action") not in POD_FAILURE_ACTIONS:
            errors.append(f"{where}.action: {rule.get('action')!r} is not one of {sorted(POD_FAILURE_ACTIONS)}")
        if rule.get("action") == "FailIndex" and job_spec.get("backoffLimitPerIndex") is None:
            errors.append(f"{where}.action: FailIndex needs backoffLimitPerIndex")
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            errors.append(f"{where}: exactly one of onExitCodes and onPodConditions")
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            values = codes.get("values", [])
            if codes.get("operator") not in ("In", "NotIn"):
                errors.append(f"{where}.onExitCodes.operator: {codes.get('operator')!r} is not In or NotIn")
            if not 1 <= len(values) <= 255:
                errors.append(f"{where}.onExitCodes.values: 1 to 255 values")
            if values != sorted(set(values)):
                errors.append(f"{where}.onExitCodes.values: must be ordered ascending without duplicates")
            if codes.get("operator") == "In" and 0 in values:
                errors.append(f"{where}.onExitCodes.values: 0 cannot be used with In")
            if "containerName" in codes and codes["containerName"] not in names:
                errors.append(f"{where}.onExitCodes.containerName: {codes['containerName']!r} names no container")
        for pattern in rule.get("onPodConditions", []):
            if pattern.get("status", "True") not in ("True", "False", "Unknown"):
                errors.append(f"{where}.onPodConditions.status: {pattern.get('status')!r}")
    return errors


# --- the JobSet webhook -----------------------------------------------------------------------

def jobset_errors(spec: dict) -> list[str]:
    errors: list[str] = []
    rjobs = spec["replicatedJobs"]
    if rjobs and rjobs[0].get("dependsOn"):
        errors.append("replicatedJobs[0].dependsOn: the first replicated job cannot depend on another")
    earlier: set[str] = set()
    for rjob in rjobs:
        for dependency in rjob.get("dependsOn", []):
            if dependency["name"] not in earlier:
                errors.append(f"replicatedJob {rjob['name']}: depends on {dependency['name']!r}, not an earlier job")
        earlier.add(rjob["name"])
    names = {rjob["name"] for rjob in rjobs}
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs", []):
        if target not in names:
            errors.append(f"successPolicy.targetReplicatedJobs: {target!r} is no replicated job")
    rule_names: list[str] = []
    for rule in (spec.get("failurePolicy") or {}).get("rules", []):
        rule_names.append(rule["name"])
        if not (_JOBSET_RULE_NAME.match(rule["name"]) and len(rule["name"]) <= 128):
            errors.append(f"failurePolicy rule name {rule['name']!r}: letters, digits and _,: only")
        for target in rule.get("targetReplicatedJobs", []):
            if target not in names:
                errors.append(f"failurePolicy rule {rule['name']}: {target!r} is no replicated job")
        for reason in rule.get("onJobFailureReasons", []):
            if reason not in JOB_FAILURE_REASONS:
                errors.append(f"failurePolicy rule {rule['name']}: {reason!r} is not a Job failure reason")
    if len(set(rule_names)) != len(rule_names):
        errors.append("failurePolicy: rule names must be unique")
    if (spec.get("failurePolicy") or {}).get("restartStrategy") == "InPlaceRestart":
        errors += _in_place_errors(rjobs)
    claims: list[str] = []
    for policy in spec.get("volumeClaimPolicies", []):
        for template in policy["templates"]:
            claim = template["metadata"]["name"]
            claims.append(claim)
            if not _DNS1123_SUBDOMAIN.match(claim):
                errors.append(f"volumeClaimPolicies template {claim!r}: not a DNS-1123 subdomain")
            mounted = False
            for rjob in rjobs:
                pod = rjob["template"]["spec"]["template"]["spec"]
                if any(v["name"] == claim for v in pod.get("volumes", [])):
                    errors.append(f"replicatedJob {rjob['name']}: declares volume {claim!r}, which JobSet provides")
                mounted |= any(m["name"] == claim for c in pod.get("containers", []) + pod.get("initContainers", [])
                               for m in c.get("volumeMounts", []))
            if not mounted:
                errors.append(f"volumeClaimPolicies template {claim!r}: no container mounts it")
    if len(set(claims)) != len(claims):
        errors.append("volumeClaimPolicies: template names must be unique")
    return errors


def _in_place_errors(rjobs: list[dict]) -> list[str]:
    """JobSet v0.12's webhook with its InPlaceRestart gate on (pkg/webhooks/jobset_webhook.go):
    every replicated job's backoffLimit is MaxInt32, its podReplacementPolicy Failed, and its
    completions equal its parallelism, both set. Trainer sets those two from numNodes on the
    trainer's job (the ancestor label), after the runtime and before the webhook."""
    errors = []
    for rjob in rjobs:
        job = rjob["template"]["spec"]
        if job.get("backoffLimit") != 2**31 - 1:
            errors.append(f"replicatedJob {rjob['name']}: backoffLimit must be 2147483647 (MaxInt32) with InPlaceRestart")
        if job.get("podReplacementPolicy") != "Failed":
            errors.append(f"replicatedJob {rjob['name']}: podReplacementPolicy must be Failed with InPlaceRestart")
        by_trainer = (rjob["template"].get("metadata") or {}).get("labels", {}).get(TRAINER_ANCESTOR[0]) == TRAINER_ANCESTOR[1]
        if not by_trainer and (job.get("completions") is None or job.get("completions") != job.get("parallelism")):
            errors.append(f"replicatedJob {rjob['name']}: completions and parallelism must be set and equal with InPlaceRestart")
    return errors


# --- core objects through kubernetes-validate --------------------------------------------------

def embedded_jobs(doc: dict) -> list[dict]:
    """A batch/v1 Job per replicated job, as JobSet would create it from the template."""
    jobs = []
    for rjob in doc["spec"]["template"]["spec"]["replicatedJobs"]:
        template = rjob["template"]
        jobs.append({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{doc['metadata']['name']}-{rjob['name']}-0", **template.get("metadata", {})},
            "spec": template["spec"],
        })
    return jobs


def embedded_claims(doc: dict) -> list[dict]:
    claims = []
    for policy in doc["spec"]["template"]["spec"].get("volumeClaimPolicies", []):
        for template in policy["templates"]:
            claims.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", **template})
    return claims


def core_errors(obj: dict, kubernetes_version: str) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{obj['kind']} {obj['metadata'].get('name')}: {_path(error.absolute_path)}: {error.message}"]
    return []
