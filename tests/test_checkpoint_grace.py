"""Checkpoint on the way out: on SIGTERM (a preemption, a node drain, a TrainJob deleted) the ranks
get the launcher's grace to write a checkpoint, and a TrainJob that raises the pod's
terminationGracePeriodSeconds raises that grace with one value,
LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS (docs/failure-policy.md#checkpoint-on-the-way-out).

Real processes and real signals: `trainer-launcher torch` runs torchrun with two ranks that, on
SIGTERM, write a checkpoint that takes longer than the default grace, one part a second, and
rename it into place when it is whole. No Kubernetes here: the test sends the SIGTERM the kubelet
would, and gives the launcher the pod's grace in the variable a TrainJob's patch sets.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import k8s_checks
import pytest
import yaml

from conftest import REPO, Job, alive, clean_env, launcher, wait_for
from launcher.core import failure_policy

pytestmark = pytest.mark.timeout(240)

TRAINJOB_CRD = k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"
# Longer than the default grace: the checkpoint is cut unless the grace was raised.
PARTS = math.ceil(failure_policy.DEFAULT_GRACE_PERIOD) + 3

# A rank that trains until SIGTERM, then writes its checkpoint (the handler only asks: a second
# SIGTERM while it writes changes nothing), then ends as SIGTERM would have ended it.
PROGRAM = """
import os, signal, time
rank, where, parts = os.environ["RANK"], os.environ["CHECKPOINT_DIR"], int(os.environ["PARTS"])
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
ready = os.path.join(where, f"ready-{rank}")
with open(ready + ".tmp", "w") as out:
    out.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
while not asked:
    time.sleep(0.05)
checkpoint = os.path.join(where, f"rank-{rank}.ckpt")
with open(checkpoint + ".tmp", "w") as out:
    for part in range(parts):
        out.write(f"part {part}\\n")
        out.flush()
        time.sleep(1)
os.replace(checkpoint + ".tmp", checkpoint)
print(f"rank {rank} wrote its checkpoint", flush=True)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
os.kill(os.getpid(), signal.SIGTERM)
"""


def stop_a_training(tmp_path: Path, pod_grace: int) -> tuple[Job, list[Path], list[int]]:
    """Two ranks training in a pod whose grace is ``pod_grace``; SIGTERM once both are up.
    Returns the launcher, where each rank's checkpoint goes and the ranks' pids."""
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    env = clean_env(CHECKPOINT_DIR=str(tmp_path), PARTS=str(PARTS),
                    LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS=str(pod_grace))
    job = Job(launcher("torch", "--", "--standalone", "--nproc-per-node", "2", str(program)), env, tmp_path)
    ready = [tmp_path / f"ready-{rank}" for rank in (0, 1)]
    wait_for(lambda: all(path.exists() for path in ready) or job.process.poll() is not None,
             timeout=120, what="both ranks to start")
    assert job.process.poll() is None, job.stderr
    job.signal(signal.SIGTERM)
    return job, [tmp_path / f"rank-{rank}.ckpt" for rank in (0, 1)], [int(path.read_text()) for path in ready]


def test_a_raised_pod_grace_lets_every_rank_finish_a_checkpoint_longer_than_the_default_grace(tmp_path):
    job, checkpoints, _ = stop_a_training(tmp_path, pod_grace=PARTS * 4)
    assert job.wait(PARTS * 4) == 128 + signal.SIGTERM, job.stderr
    for checkpoint in checkpoints:
        assert checkpoint.read_text().splitlines() == [f"part {part}" for part in range(PARTS)]
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("Terminated", True)


def test_a_checkpoint_longer_than_the_grace_is_cut_and_the_launcher_still_reports(tmp_path):
    """The other side: a pod's grace of 7 s leaves the ranks 2 s, so the same checkpoint is cut
    by SIGKILL (never renamed into place), and the launcher still writes its message."""
    job, checkpoints, pids = stop_a_training(tmp_path, pod_grace=failure_policy.TERMINATION_MARGIN + 2)
    assert job.wait(60) == 128 + signal.SIGTERM, job.stderr
    for checkpoint in checkpoints:
        assert not checkpoint.exists()
        written = Path(f"{checkpoint}.tmp").read_text().splitlines()
        assert 0 < len(written) < PARTS, written
    assert job.termination()["reason"] == "Terminated"
    assert not [pid for pid in pids if alive(pid)]


# --- one value: the pod's grace and the launcher's (in-process, through the real CLI) ---------------

POD_GRACE = "LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS"


@pytest.mark.unit
@pytest.mark.parametrize(("env", "grace"), [
    ({}, failure_policy.DEFAULT_GRACE_PERIOD),
    ({POD_GRACE: "600"}, 600.0 - failure_policy.TERMINATION_MARGIN),  # what a TrainJob's patch sets
    ({POD_GRACE: "600", "LAUNCHER_GRACE_PERIOD": "1m"}, 60.0),  # a shorter grace of your own stays
])
def test_the_launchers_grace_is_the_pods_less_its_margin(cli, env, grace):
    result = cli(["plan", "--", "--standalone", "train.py"], env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["launcher"]["gracePeriod"] == grace


@pytest.mark.unit
@pytest.mark.parametrize("pod_grace", [failure_policy.TERMINATION_MARGIN + 1, 30, 600, 3600])
def test_the_policy_printed_for_that_grace_is_the_pods_grace_again(cli, pod_grace):
    """The runtimes' terminationGracePeriodSeconds and the launcher's grace are one value: from the
    pod's grace to the launcher's (the variable) and back (`trainer-launcher policy`)."""
    result = cli(["policy"], {POD_GRACE: str(pod_grace)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job"]["template"]["spec"]["terminationGracePeriodSeconds"] == pod_grace


def _the_docs_example() -> tuple[dict, str]:
    page = (REPO / "docs" / "failure-policy.md").read_text()
    section = page.split("## Checkpoint on the way out", 1)[1]
    return yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0]), section


@pytest.mark.unit
def test_the_docs_trainjob_raises_the_pods_grace_and_the_launchers_with_one_value(cli):
    """docs/failure-policy.md's TrainJob: one patch sets the pod's grace and the launcher's
    variable to the same number, and the launcher's grace is what the page says it is."""
    trainjob, section = _the_docs_example()
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert job["name"] == container["name"] == "node"  # the torch runtime's trainer job and container
    assert container["env"] == [{"name": POD_GRACE, "value": str(pod["terminationGracePeriodSeconds"])}]
    result = cli(["plan", "--", "--standalone", "train.py"], {POD_GRACE: container["env"][0]["value"]})
    grace = json.loads(result.stdout)["launcher"]["gracePeriod"]
    assert f"the ranks get {grace:g} s after SIGTERM" in " ".join(section.split())


@pytest.mark.unit
@pytest.mark.skipif(not TRAINJOB_CRD.exists(),
                    reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})")
def test_the_docs_trainjob_is_accepted_by_the_upstream_trainjob_crd():
    trainjob, _ = _the_docs_example()
    schema = k8s_checks.openapi_schema(TRAINJOB_CRD)
    defaulted = k8s_checks.with_defaults(trainjob, schema)
    assert k8s_checks.schema_errors(defaulted, schema) + k8s_checks.cel_errors(defaulted, schema) == []
    # Pruning would drop what the schema does not know: the fields the patch needs are in it.
    spec = schema["properties"]["spec"]["properties"]["runtimePatches"]["items"]["properties"]["trainingRuntimeSpec"]
    pod = spec["properties"]["template"]["properties"]["spec"]["properties"]["replicatedJobs"]["items"]
    pod = pod["properties"]["template"]["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    assert {"terminationGracePeriodSeconds", "containers"} <= set(pod["properties"])
