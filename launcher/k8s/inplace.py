"""JobSet in-place restart: the launcher as the pod's agent, in main-container mode (no sidecar).

A JobSet whose ``failurePolicy.restartStrategy`` is ``InPlaceRestart`` (JobSet v0.12, alpha, the
``InPlaceRestart`` feature gate) restarts a failed group by restarting the containers of its pods
where they run, instead of recreating every pod. Each pod runs an agent that the JobSet
controller steers through two fields of the JobSet's status; the launcher is that agent, with the
semantics of ``cmd/in-place-restart-agent`` of kubernetes-sigs/jobset v0.12.0 (commit
f22e565ac3cc, unchanged at the v0.13 development head) and its KEP (keps/467-InPlaceRestart):

- when its container starts, the agent reads its JobSet and announces the attempt it is at by
  setting its pod's annotation ``jobset.sigs.k8s.io/in-place-restart-attempt`` to
  ``status.currentInPlaceRestartAttempt + 1`` (0 when the JobSet has none yet), with a
  server-side apply patch;
- the barrier is down when ``status.currentInPlaceRestartAttempt`` equals that attempt: the
  controller sets it once every pod of the JobSet announced the same attempt. Only then does the
  work start;
- a restart is asked of this pod when ``status.previousInPlaceRestartAttempt`` is at least its
  attempt: the controller sets it to (the highest attempt announced) - 1 as soon as one pod came
  back, failed and restarted, with a higher one. The agent then exits with
  ``IN_PLACE_RESTART_EXIT_CODE``, which the container's ``restartPolicyRules`` answer by
  restarting the container in place; it comes back announcing the next attempt.
- a JobSet with the annotation ``jobset.sigs.k8s.io/disable-in-place-restart``, or whose restart
  strategy is not ``InPlaceRestart``, bypasses all of it: the barrier is down at once and no
  restart is ever asked.

The interface the pod's lifecycle calls::

    restart = InPlaceRestart.from_env(environ)   # None when JOBSET_NAME is unset (feature off);
                                                 # a bad value raises ConfigError (one line, exit 2)
    restart.barrier(sleep, deadline)             # announce this container's attempt, return once
                                                 # the barrier is down (or a restart was asked:
                                                 # check restart_requested() after it); WaitTimeout
                                                 # at ``deadline`` (time.monotonic()); ``sleep`` is
                                                 # the supervisor's, so a signal interrupts the wait
    restart.restart_requested()                  # non-blocking: True once the JobSet asked this
                                                 # pod to restart in place
    restart.exit_code                            # the exit code that makes the kubelet do it
    restart.close()                              # stop following the JobSet

``launcher.core`` may not import this package (tests/test_layers.py: k8s sits above core, beside
status): the lifecycle is handed ``InPlaceRestart.from_env`` as it is handed the status watch, and
nothing here is imported unless the feature is on.

It reads what the upstream agent reads: ``JOBSET_NAME`` (the switch), ``POD_NAME``,
``IN_PLACE_RESTART_EXIT_CODE`` and the namespace from the service account's ``namespace`` file;
the requests it makes, and so the RBAC it needs, are upstream's: ``patch`` on its pod, ``list``
and ``watch`` on its JobSet (by a ``metadata.name`` field selector). What the JobSet says comes
from a watch on a daemon thread, as the upstream agent's informer does: one long request per pod
that the API server answers only when the JobSet changes, where a poll would cost every pod a
request a period and still be that period late.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launcher.core import log
from launcher.core.failure_policy import IN_PLACE_RESTART_STRATEGY
from launcher.core.outcome import ConfigError, LauncherError, WaitTimeout
from launcher.core.reasons import TRANSIENT, Reasons
from launcher.k8s.api import ApiError, Client, InCluster, Unreachable, Watch

JOBSET_NAME_ENV, POD_NAME_ENV, EXIT_CODE_ENV = "JOBSET_NAME", "POD_NAME", "IN_PLACE_RESTART_EXIT_CODE"
# Upstream's agent defaults to 1, which the launcher's table gives a program's own failure
# (permanent under the runtimes' policy). 138 is the table's transient code: the runtimes
# restart a container in place on the retryable codes, so this one restarts it too.
DEFAULT_EXIT_CODE = TRANSIENT

ATTEMPT_ANNOTATION = "jobset.sigs.k8s.io/in-place-restart-attempt"
DISABLE_ANNOTATION = "jobset.sigs.k8s.io/disable-in-place-restart"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
POD = "/api/v1/namespaces/{namespace}/pods/{name}"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "trainer-launcher"

WATCH_SECONDS = 300  # the server ends each watch after this long; the thread starts the next
BARRIER_STEP = 0.1  # how often the barrier looks at what the watch thread saw
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


class NotPermitted(LauncherError):
    """The API server refused the agent's request for good (403, 404, 422): a missing Role or
    RoleBinding, a wrong name; no retry mends it."""

    reason = Reasons.MISCONFIGURED


@dataclass(frozen=True)
class JobSetStatus:
    """What the agent reads of its JobSet."""

    current: int | None  # status.currentInPlaceRestartAttempt
    previous: int | None  # status.previousInPlaceRestartAttempt
    bypass: bool  # in-place restart disabled, or another restart strategy

    @classmethod
    def of(cls, jobset: dict) -> JobSetStatus:
        status = jobset.get("status") or {}
        strategy = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("restartStrategy")
        annotations = (jobset.get("metadata") or {}).get("annotations") or {}
        return cls(
            _attempt(status.get("currentInPlaceRestartAttempt")),
            _attempt(status.get("previousInPlaceRestartAttempt")),
            DISABLE_ANNOTATION in annotations or strategy != IN_PLACE_RESTART_STRATEGY,
        )


def _attempt(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class InPlaceRestart:
    def __init__(self, config: InCluster, jobset: str, pod: str, exit_code: int = DEFAULT_EXIT_CODE):
        self.config, self.jobset, self.pod, self.exit_code = config, jobset, pod, exit_code
        self._client = Client(config)
        self._seen: JobSetStatus | None = None  # the JobSet as the watch thread last saw it
        self._fatal: LauncherError | None = None  # what the watch thread met that no retry mends
        self._attempt: int | None = None  # this container's attempt, once announced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Watch | None = None
        self._said: set[str] = set()  # the kinds of problem already logged

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InPlaceRestart | None:
        """The agent, when ``JOBSET_NAME`` is set; None otherwise. No request is made here."""
        jobset = environ.get(JOBSET_NAME_ENV, "")
        if not jobset:
            return None
        if not _DNS1123_SUBDOMAIN.match(jobset) or len(jobset) > 253:
            expected = "the JobSet's name (downward API: the annotation jobset.sigs.k8s.io/jobset-name)"
            raise ConfigError(JOBSET_NAME_ENV, jobset, expected)
        pod = environ.get(POD_NAME_ENV, "")
        if not _DNS1123_SUBDOMAIN.match(pod) or len(pod) > 253:
            raise ConfigError(POD_NAME_ENV, pod or None, "the pod's name (downward API: metadata.name)")
        raw = environ.get(EXIT_CODE_ENV, "")
        exit_code = DEFAULT_EXIT_CODE
        if raw:
            if not raw.strip().isdigit() or not 0 < int(raw) < 256:
                raise ConfigError(EXIT_CODE_ENV, raw, "an exit code 1..255 that restarts the container in place")
            exit_code = int(raw)
        return cls(InCluster.from_env(environ), jobset, pod, exit_code)

    # --- what the lifecycle calls -----------------------------------------------------------------

    def barrier(self, sleep: Callable[[float], None], deadline: float) -> None:
        """Announce this container's attempt and return once the barrier is down, or once a
        restart was asked (restart_requested() is then True). WaitTimeout at ``deadline``;
        NotPermitted when the API server refuses the requests for good."""
        self._follow()
        announce_failures = 0
        while True:
            if self._fatal is not None:
                raise self._fatal
            seen = self._seen
            if seen is not None and (seen.bypass or self.restart_requested()):
                if seen.bypass:
                    log.info(f"in-place restart: JobSet {self.jobset} does not restart in place; no barrier")
                return
            if seen is not None and self._attempt is None:
                attempt = 0 if seen.current is None else seen.current + 1
                try:
                    self._announce(attempt)
                    log.info(
                        f"in-place restart: pod {self.pod} at attempt {attempt}, waiting for the JobSet's other pods"
                    )
                except (ApiError, Unreachable) as error:
                    if isinstance(error, ApiError) and error.status in (403, 404, 422):
                        raise NotPermitted(f"in-place restart: cannot annotate pod {self.pod}: {error}") from None
                    self._say("announce", f"in-place restart: cannot annotate pod {self.pod} yet: {error}")
                    announce_failures += 1
            elif seen is not None and seen.current == self._attempt:
                log.info(f"in-place restart: barrier down at attempt {self._attempt}")
                return
            now = time.monotonic()
            if now >= deadline:
                raise WaitTimeout(self._timeout_message(seen))
            step = _BACKOFF[min(announce_failures, len(_BACKOFF)) - 1] if announce_failures else BARRIER_STEP
            sleep(min(step, deadline - now))

    def restart_requested(self) -> bool:
        """True once the JobSet asked this pod to restart in place (non-blocking)."""
        seen, attempt = self._seen, self._attempt
        return (
            attempt is not None
            and seen is not None
            and not seen.bypass
            and seen.previous is not None
            and attempt <= seen.previous
        )

    def close(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the requests ----------------------------------------------------------------------------

    def _announce(self, attempt: int) -> None:
        """Server-side apply of the one annotation, as its own field manager, forced."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.pod,
                "namespace": self.config.namespace,
                "annotations": {ATTEMPT_ANNOTATION: str(attempt)},
            },
        }
        path = POD.format(namespace=self.config.namespace, name=self.pod)
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        self._client.request("PATCH", path, query, body, content_type=APPLY_PATCH)
        self._attempt = attempt

    def _follow(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="in-place-restart-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """List the JobSet, then watch it from that version; list again when the version is gone
        (410) or the watch broke, with back-off while the API server does not answer."""
        path = JOBSETS.format(namespace=self.config.namespace)
        selector = f"metadata.name={self.jobset}"
        failures = 0
        while not self._stop.is_set():
            try:
                listed = self._client.request("GET", path, {"fieldSelector": selector})
                self._see_list(listed)
                version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                failures = 0
                while not self._stop.is_set():
                    version = self._watch_once(path, selector, version)
            except _Relist:
                continue
            except (ApiError, Unreachable) as error:
                if self._stop.is_set():
                    return
                if isinstance(error, ApiError) and error.status in (403, 404):
                    self._fatal = NotPermitted(f"in-place restart: cannot follow JobSet {self.jobset}: {error}")
                self._say("follow", f"in-place restart: cannot follow JobSet {self.jobset} yet: {error}")
                self._stop.wait(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
                failures += 1

    def _watch_once(self, path: str, selector: str, version: str) -> str:
        query = {
            "allowWatchBookmarks": "true",
            "fieldSelector": selector,
            "resourceVersion": version,
            "timeoutSeconds": str(WATCH_SECONDS),
            "watch": "true",
        }
        watch = self._client.watch(path, query, timeout=WATCH_SECONDS + 30)
        self._watch = watch
        if self._stop.is_set():  # close() came while the watch was being opened
            watch.close()
        try:
            for event in watch:
                kind, obj = event.get("type"), event.get("object")
                if not isinstance(obj, dict):
                    raise Unreachable(f"watch of JobSet {self.jobset}: an event without an object")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Relist()
                    raise Unreachable(f"watch of JobSet {self.jobset}: {obj.get('reason')}: {obj.get('message')}")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED"):
                    self._see(obj)
                elif kind == "DELETED":
                    self._seen = None
        finally:
            self._watch = None
        return version

    def _see_list(self, listed: dict) -> None:
        items = [
            item
            for item in listed.get("items") or []
            if isinstance(item, dict) and (item.get("metadata") or {}).get("name") == self.jobset
        ]
        self._seen = JobSetStatus.of(items[0]) if items else None
        self._fatal = None

    def _see(self, jobset: dict) -> None:
        if (jobset.get("metadata") or {}).get("name") == self.jobset:
            self._seen = JobSetStatus.of(jobset)
            self._fatal = None

    def _say(self, kind: str, problem: str) -> None:
        """One warning line for each kind of problem, not one for each retry."""
        if kind not in self._said:
            self._said.add(kind)
            log.warning(problem)

    def _timeout_message(self, seen: JobSetStatus | None) -> str:
        if seen is None:
            return f"in-place restart: JobSet {self.jobset} was never seen in namespace {self.config.namespace}"
        if self._attempt is None:
            return f"in-place restart: pod {self.pod} could not announce its attempt to JobSet {self.jobset}"
        return (
            f"in-place restart: the pods of JobSet {self.jobset} never all reached attempt {self._attempt}"
            f" (the JobSet is at {seen.current})"
        )


class _Relist(Exception):
    """The watch's version is gone (410): list again."""
