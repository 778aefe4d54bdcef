"""JobSet in-place restart with the launcher as the pod's agent (launcher/k8s/inplace.py).

No Kubernetes API server can run here: these tests talk to a stand-in (tests/jobset_server.py) that
serves exactly the requests JobSet's own agent makes and moves the JobSet's status as JobSet's
controller does, written from kubernetes-sigs/jobset v0.12.0 (commit f22e565ac3cc):
cmd/in-place-restart-agent/main.go, pkg/controllers/in_place_restart.go and keps/467-InPlaceRestart.
It runs on threads of the test's process, over https with a CA made for the session and a token
laid out as the kubelet projects it; the other pods' agents are the test announcing their attempts.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from jobset_server import ATTEMPT, JobSetServer
from status_fixtures import ProjectedVolume

from launcher.core.outcome import ConfigError, WaitTimeout
from launcher.core.reasons import CONFIG_ERROR, TRANSIENT
from launcher.k8s import inplace
from launcher.k8s.api import SERVICE_ACCOUNT_DIR_ENV
from launcher.k8s.inplace import InPlaceRestart, NotPermitted

RBAC = Path(__file__).resolve().parents[1] / "runtimes" / "in-place-restart" / "rbac.yaml"
NAMESPACE, JOBSET, PODS = "team-a", "llama", ["llama-node-0-0-abcde", "llama-node-0-1-fghij"]
ME, OTHER = PODS
TOKEN = "eyJhbGciOiJSUzI1NiJ9.the-service-account-token.c2lnbmF0dXJl"
WAIT = 60.0  # generous: a deadline that a working barrier never reaches


@pytest.fixture
def account(tmp_path: Path, status_certs) -> ProjectedVolume:
    return ProjectedVolume(tmp_path / "serviceaccount", {
        "token": TOKEN.encode(), "ca.crt": status_certs[0].read_bytes(), "namespace": NAMESPACE.encode()})


def _server(status_certs, account: ProjectedVolume, **kwargs) -> JobSetServer:
    return JobSetServer(status_certs, account.directory / "token", NAMESPACE, JOBSET, PODS, **kwargs)


@pytest.fixture
def server(status_certs, account):
    stand_in = _server(status_certs, account)
    yield stand_in
    stand_in.close()


def env_for(server: JobSetServer, account: ProjectedVolume, **extra: str) -> dict[str, str]:
    return {"JOBSET_NAME": JOBSET, "POD_NAME": ME, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port), SERVICE_ACCOUNT_DIR_ENV: str(account.directory), **extra}


class Barrier:
    """``agent.barrier`` on a thread of its own, as the lifecycle's wait would run it."""

    def __init__(self, agent: InPlaceRestart, deadline: float = WAIT):
        self.agent, self.error, self.done = agent, None, threading.Event()
        self._deadline = time.monotonic() + deadline
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.agent.barrier(time.sleep, self._deadline)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.error = error
        finally:
            self.done.set()

    def result(self, timeout: float = WAIT):
        assert self.done.wait(timeout), "the barrier never returned"
        return self.error


@pytest.fixture
def agents():
    made: list[InPlaceRestart] = []
    yield made
    for agent in made:
        agent.close()


def start(server, account, agents, **extra) -> InPlaceRestart:
    agent = InPlaceRestart.from_env(env_for(server, account, **extra))
    assert agent is not None
    agents.append(agent)
    return agent


def test_the_barrier_holds_until_every_pod_is_at_the_same_attempt_then_lifts(server, account, agents):
    agent = start(server, account, agents)
    barrier = Barrier(agent)
    # This pod announced attempt 0 (the JobSet has no current attempt yet) and watches its JobSet.
    server.wait_for(lambda: server.annotations(ME).get(ATTEMPT) == "0" and server.watching, what="the announcement")
    assert not barrier.done.is_set()  # the other pod has not announced: no current attempt
    assert server.status == {}
    server.annotate(OTHER, 0)
    assert barrier.result() is None
    assert server.status == {"currentInPlaceRestartAttempt": 0}
    assert not agent.restart_requested()


def test_the_requests_are_the_upstream_agents(server, account, agents):
    agent = start(server, account, agents)
    server.annotate(OTHER, 0)
    assert Barrier(agent).result() is None
    server.wait_for(lambda: any(r.query.get("watch") for r in server.requests), what="the watch")
    listed, patched, watched = (
        next(r for r in server.requests if r.method == "GET" and "watch" not in r.query),
        next(r for r in server.requests if r.method == "PATCH"),
        next(r for r in server.requests if r.query.get("watch")),
    )
    selector = f"metadata.name={JOBSET}"
    assert listed.path == f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}/jobsets"
    assert listed.query == {"fieldSelector": selector}
    assert watched.path == listed.path
    assert watched.query == {"allowWatchBookmarks": "true", "fieldSelector": selector, "resourceVersion": "1",
                             "timeoutSeconds": str(inplace.WATCH_SECONDS), "watch": "true"}
    # A server-side apply of the one annotation, forced, as the agent's own field manager.
    assert patched.path == f"/api/v1/namespaces/{NAMESPACE}/pods/{ME}"
    assert patched.query == {"fieldManager": "trainer-launcher", "force": "true"}
    assert patched.headers["Content-Type"] == "application/apply-patch+yaml"
    assert json.loads(patched.body) == {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": ME, "namespace": NAMESPACE, "annotations": {ATTEMPT: "0"}}}
    assert {r.headers["Authorization"] for r in server.requests} == {f"Bearer {TOKEN}"}
    assert all(r.code == 200 for r in server.requests)


def test_a_restart_is_asked_once_another_pod_comes_back_at_the_next_attempt(server, account, agents):
    agent = start(server, account, agents)
    server.annotate(OTHER, 0)
    assert Barrier(agent).result() is None
    assert not agent.restart_requested()
    # The other pod failed and its container restarted in place: its agent announces attempt 1,
    # the controller marks attempt 0 as the previous one, and this pod must restart too.
    server.annotate(OTHER, 1)
    server.wait_for(agent.restart_requested, what="restart_requested()")
    assert server.status == {"currentInPlaceRestartAttempt": 0, "previousInPlaceRestartAttempt": 0}
    assert agent.exit_code == TRANSIENT  # IN_PLACE_RESTART_EXIT_CODE unset: the table's transient code
    agent.close()
    # This container, restarted in place, announces attempt 1: every pod is there, the barrier lifts.
    again = start(server, account, agents)
    assert Barrier(again).result() is None
    assert server.annotations(ME)[ATTEMPT] == "1"
    assert server.status["currentInPlaceRestartAttempt"] == 1
    assert not again.restart_requested()


def test_a_restart_asked_while_at_the_barrier_ends_the_wait(server, account, agents):
    server.set_jobset(lambda js: js["status"].update(currentInPlaceRestartAttempt=0))
    server.annotate(OTHER, 2)  # the other pod went through two restarts meanwhile: previous is 1
    agent = start(server, account, agents, IN_PLACE_RESTART_EXIT_CODE="143")
    assert Barrier(agent).result() is None
    assert server.annotations(ME)[ATTEMPT] == "1"
    assert agent.restart_requested()
    assert agent.exit_code == 143


@pytest.mark.parametrize("change", [
    lambda js: js["spec"]["failurePolicy"].update(restartStrategy="Recreate"),
    lambda js: js["metadata"]["annotations"].update({"jobset.sigs.k8s.io/disable-in-place-restart": "true"}),
], ids=["another restart strategy", "disabled by annotation"])
def test_a_jobset_that_does_not_restart_in_place_has_no_barrier(server, account, agents, change):
    server.set_jobset(change)
    server.set_jobset(lambda js: js["status"].update(previousInPlaceRestartAttempt=5))
    agent = start(server, account, agents)
    assert Barrier(agent).result() is None
    assert "PATCH" not in [r.method for r in server.requests]
    assert server.annotations(ME) == {}
    assert not agent.restart_requested()


def test_the_watch_lists_again_when_its_version_is_gone(server, account, agents):
    agent = start(server, account, agents)
    barrier = Barrier(agent)
    server.wait_for(lambda: server.annotations(ME).get(ATTEMPT) == "0" and server.watching, what="the watch")
    server.expire()
    server.end_watches()  # as the API server does at timeoutSeconds
    server.wait_for(lambda: sum(1 for r in server.requests if r.method == "GET" and "watch" not in r.query) == 2,
                    what="the second list")
    server.annotate(OTHER, 0)
    assert barrier.result() is None


def test_the_shipped_role_grants_exactly_what_the_agent_asks(server, account, agents):
    agent = start(server, account, agents)
    server.annotate(OTHER, 0)
    assert Barrier(agent).result() is None
    server.annotate(OTHER, 1)
    server.wait_for(agent.restart_requested, what="restart_requested()")
    asked = set()
    for request in server.requests:
        if request.method == "PATCH":
            asked.add(("", "pods", "patch"))
        else:
            asked.add(("jobset.x-k8s.io", "jobsets", "watch" if request.query.get("watch") == "true" else "list"))
    with open(RBAC, encoding="utf-8") as handle:
        (role,) = [doc for doc in yaml.safe_load_all(handle) if doc["kind"] == "Role"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert asked == granted


@pytest.mark.parametrize("verb", ["patch", "list"])
def test_a_service_account_without_the_role_is_one_line_naming_what_was_refused(server, account, agents, verb):
    server.forbid(verb)
    agent = start(server, account, agents)
    error = Barrier(agent).result()
    assert isinstance(error, NotPermitted), error
    assert error.exit_code == CONFIG_ERROR
    message = str(error)
    assert "\n" not in message and "403" in message
    assert (ME if verb == "patch" else JOBSET) in message


def test_the_token_is_sent_and_never_shown(status_certs, tmp_path, account, agents, capfd):
    # The stand-in expects another token than the pod has: every request is refused (401).
    other = ProjectedVolume(tmp_path / "server-account", {"token": b"the-server-expects-this-one"})
    server = JobSetServer(status_certs, other.directory / "token", NAMESPACE, JOBSET, PODS)
    try:
        agent = start(server, account, agents)
        error = Barrier(agent, deadline=3).result()
        assert isinstance(error, WaitTimeout)
        assert {r.headers["Authorization"] for r in server.requests} == {f"Bearer {TOKEN}"}
        assert {r.code for r in server.requests} == {401}
    finally:
        server.close()
    said = capfd.readouterr().err
    assert "401 Unauthorized" in said  # the warning says why
    assert TOKEN not in said and TOKEN not in str(error)
    assert said.count("cannot follow") == 1  # once, not once a retry


def test_the_deadline_is_a_wait_timeout_naming_the_attempt(server, account, agents):
    agent = start(server, account, agents)
    barrier = Barrier(agent, deadline=3)
    error = barrier.result()
    assert isinstance(error, WaitTimeout)
    assert error.exit_code == TRANSIENT
    assert JOBSET in str(error) and "\n" not in str(error)


# --- configuration --------------------------------------------------------------------------------

def test_the_feature_is_off_without_jobset_name():
    assert InPlaceRestart.from_env({"POD_NAME": ME, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
    assert InPlaceRestart.from_env({"JOBSET_NAME": ""}) is None


@pytest.mark.parametrize("change, named, shown", [
    ({"JOBSET_NAME": "Llama_Run"}, "JOBSET_NAME", "'Llama_Run'"),
    ({"POD_NAME": ""}, "POD_NAME", "unset"),
    ({"IN_PLACE_RESTART_EXIT_CODE": "0"}, "IN_PLACE_RESTART_EXIT_CODE", "'0'"),
    ({"IN_PLACE_RESTART_EXIT_CODE": "256"}, "IN_PLACE_RESTART_EXIT_CODE", "'256'"),
    ({"IN_PLACE_RESTART_EXIT_CODE": "one"}, "IN_PLACE_RESTART_EXIT_CODE", "'one'"),
    ({"KUBERNETES_SERVICE_HOST": ""}, "KUBERNETES_SERVICE_HOST", "unset"),
    ({"KUBERNETES_SERVICE_PORT": "https"}, "KUBERNETES_SERVICE_PORT", "'https'"),
    ({SERVICE_ACCOUNT_DIR_ENV: "/nonexistent"}, "/nonexistent/namespace", "automountServiceAccountToken"),
])
def test_bad_configuration_is_one_line_naming_the_variable(account, change, named, shown):
    env = {"JOBSET_NAME": JOBSET, "POD_NAME": ME, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": "6443", SERVICE_ACCOUNT_DIR_ENV: str(account.directory), **change}
    with pytest.raises(ConfigError) as caught:
        InPlaceRestart.from_env(env)
    message = str(caught.value)
    assert message.startswith(named) and shown in message and "expected" in message
    assert "\n" not in message
    assert caught.value.exit_code == CONFIG_ERROR
