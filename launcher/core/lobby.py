"""Where the pods of a job that restarts in place agree on the generation they start: the lobby.

A pod that Kubernetes replaced (its machine lost, its container killed) starts from nothing, at
generation 0, while the pods that remained have moved on to a later one and hold for it
(``LAUNCHER_REJOIN_TIMEOUT``). Before each generation's processes start, every pod checks in at the
lobby, which pod 0's launcher serves for the pod's whole life on a port of its own (the first
above every generation's ports): it says its node rank and its generation, and hears the job's,
the highest any pod has said. A pod behind jumps to it; the others wait until every pod is there.
A replacement may come before the others noticed the loss, while the generation it would join
still runs: the lobby knows it by its launcher's id, new for that node rank, and tells it the next
generation, which the others start once they lose its predecessor. A replaced pod 0 serves a new
lobby, where the pods that remained arrive with the generation they hold for, and it jumps there.

One request per connection, one JSON line each way, so that a lobby that went away with its pod
and came back with the replacement costs a client only a refused connection:

    -> {"rank": 1, "node": "tj-node-0-1", "generation": 2, "pod": "<this launcher's id>"}
    <- {"generation": 2, "missing": {"0": "tj-node-0-0"}}

The standard library and the table of reasons only: it runs in the launcher, before anything
heavy is imported.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core.outcome import LauncherError, Outcome, Reasons, RootCause

# Seconds between two check-ins of a pod that waits: the first soon, then slower, so that pod 0's
# one thread answers a few hundred pods at most once a second each.
POLL = 0.2
POLL_CAP = 1.0
CONNECT_TIMEOUT = 2.0
LINE_LIMIT = 4096


@dataclass(frozen=True)
class Place:
    """Where the job's lobby is, as a framework's plan says: pod 0's address and the port above
    every generation's, and who this pod is."""

    host: str
    port: int
    nnodes: int
    rank: int


class Missing(LauncherError):
    """Pods never checked in before the deadline: on a restart, the lost pod was not replaced in
    time (PeerLost, as without restarts); on the first start, the pods never all came."""

    def __init__(self, message: str, node: str | None, lost: bool):
        super().__init__(message)
        self.node = node
        self.reason = Reasons.PEER_LOST if lost else Reasons.RENDEZVOUS_TIMEOUT

    def outcome(self, message: str | None = None) -> Outcome:
        return Outcome.of(self.reason, str(self) if message is None else message, RootCause(node=self.node))


class _Checkins:
    """The lobby's state, shared by its server thread and pod 0's own check-ins."""

    def __init__(self, nnodes: int):
        self.nnodes = nnodes
        self.generation = 0
        self.at: dict[int, int] = {}  # node rank -> the generation it last checked in for
        self.names: dict[int, str] = {}
        self.pods: dict[int, str] = {}  # node rank -> the launcher that checked in for it (its own id)
        self.started = -1  # the last generation every pod checked in for: its processes run
        self._lock = threading.Lock()

    def check_in(self, rank: int, node: str, generation: int, pod: str) -> dict:
        with self._lock:
            if self.pods.get(rank, pod) != pod and self.started == self.generation:
                # A new launcher for a rank of the generation that runs: it replaces a lost pod, and
                # the others, which lose it there, start the next generation, where it joins them.
                self.generation += 1
            self.at[rank], self.names[rank], self.pods[rank] = generation, node, pod
            self.generation = max(self.generation, generation)
            missing = {
                str(r): self.names.get(r, f"node rank {r}")
                for r in range(self.nnodes)
                if self.at.get(r) != self.generation
            }
            if not missing:
                self.started = self.generation
            return {"generation": self.generation, "missing": missing}


class Lobby:
    """This pod's side of the lobby: pod 0 serves it (:meth:`serve`), every pod :meth:`agree`-s."""

    def __init__(self, place: Place, node: str):
        self.place, self.node = place, node
        self.id = uuid.uuid4().hex  # this launcher's, which a replacement's differs from
        self._checkins = _Checkins(place.nnodes) if place.rank == 0 else None
        self._server: socket.socket | None = None

    def serve(self) -> None:
        """Pod 0: listen on the lobby's port until :meth:`close` (a thread of its own)."""
        if self._checkins is None:
            return
        try:
            server = socket.create_server(("", self.place.port), family=socket.AF_INET6, dualstack_ipv6=True)
        except (OSError, ValueError):  # no IPv6 here
            server = socket.create_server(("", self.place.port))
        self._server = server
        threading.Thread(target=self._accept, args=(server,), name="trainer-launcher-lobby", daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        checkins = self._checkins
        assert checkins is not None
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                conn.settimeout(CONNECT_TIMEOUT)
                asked = json.loads(_read_line(conn))
                rank, node, generation = int(asked["rank"]), str(asked["node"])[:253], int(asked["generation"])
                said = checkins.check_in(rank, node, generation, str(asked["pod"])[:64])
                conn.sendall(json.dumps(said).encode() + b"\n")

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None

    def _ask(self, generation: int) -> dict | None:
        """One check-in; None: the lobby cannot be reached (its pod is gone, or not up yet)."""
        if self._checkins is not None:
            return self._checkins.check_in(self.place.rank, self.node, generation, self.id)
        asked = {"rank": self.place.rank, "node": self.node, "generation": generation, "pod": self.id}
        try:
            with socket.create_connection((self.place.host, self.place.port), timeout=CONNECT_TIMEOUT) as conn:
                conn.sendall(json.dumps(asked).encode() + b"\n")
                said = json.loads(_read_line(conn))
                return {"generation": int(said["generation"]), "missing": dict(said["missing"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def agree(self, generation: int, timeout: float, sleep: Callable[[float], None], restarting: bool) -> int:
        """Check in for ``generation`` until every pod is at the job's generation: return it
        (later than ``generation`` when this pod was replaced and the others moved on). Waits on
        ``sleep`` (a signal ends it) for ``timeout`` seconds; then :class:`Missing`, as PeerLost
        when the job was ``restarting`` (a lost pod was not replaced in time)."""
        deadline, pause = time.monotonic() + timeout, POLL
        while True:
            said = self._ask(generation)
            if said is not None and (said["generation"] > generation or not said["missing"]):
                return said["generation"]
            if time.monotonic() >= deadline:
                raise self._missing(said, restarting, timeout)
            sleep(pause)
            pause = min(pause * 1.5, POLL_CAP)

    def _missing(self, said: dict | None, restarting: bool, timeout: float) -> Missing:
        """Who never came: pod 0 itself when its lobby could not be reached, else the pods it lacks."""
        if said is None:
            where = f"{self.place.host}:{self.place.port}"
            node, who = self.place.host, f"pod 0 (serving the job's lobby at {where})"
        else:
            names = sorted(said["missing"].values())
            node, who = names[0], ", ".join(names)
        if restarting:
            knob, what = "LAUNCHER_REJOIN_TIMEOUT", "did not come back to rejoin the job"
        else:
            knob, what = "LAUNCHER_RENDEZVOUS_TIMEOUT", "never checked in at the job's lobby"
        return Missing(f"{who} {what} within {timeout:g}s ({knob})", node, restarting)


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < LINE_LIMIT:
        chunk = conn.recv(LINE_LIMIT)
        if not chunk:
            break
        data += chunk
    return data
