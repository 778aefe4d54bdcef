"""The pods of one XGBoost job telling each other that it failed: a stop board, served by pod 0.

xgboost's collective has no word for "a worker died": its peers usually see the broken ring at
once and raise, but not always. With three or more workers, a worker whose peer crashed can sit
in a collective until ``dmlc_timeout`` (30 minutes by default) - seen here with a worker that
exited through ``os._exit`` mid-round - and every pod that does notice exits with its own idea of
the cause. So pod 0's launcher serves a board on ``DMLC_TRACKER_PORT + 1`` and every other pod's
launcher keeps one connection to it, once the tracker is up:

- a launcher whose worker (or tracker) failed on its own posts a stop record: the launcher's one
  stop record (launcher/runner/report.py, ``StopRecord``) of this start of the job (its
  ``generation``), naming its pod (``nodeRank``), the worker that failed and its pod's judged
  ``outcome``; the first record of the generation wins, one of another generation is stale;
- the board sends that record to every pod, pod 0 included; each stops its workers and exits with
  the record's exit code, naming the same worker;
- when the job succeeds, pod 0 (the last to finish: its tracker waits for every worker) says
  ``done`` before it leaves; a connection that breaks without ``done`` or a record means pod 0 is
  gone, and a pod whose workers still run stops them (138, PeerLost);
- after a failure, pod 0 keeps the board up until every pod has hung up, or ``LINGER`` seconds.

Newline-delimited JSON over TCP: ``{"stop": <record>}`` and ``{"done": true}``. Every socket is
non-blocking and served from the supervisor's select loop (``Supervisor.watch``); nothing here
blocks but a client's connect and its one post. A board that cannot listen or be reached costs
the job this propagation only, and says so once.

Whom it trusts. The board listens on every address and the XGBoost runtime mounts no Secret, so
the pods share no token: anything on the pod network can connect. What the pods do share is the
controller's naming (``DMLC_TRACKER_URI`` is ``<trainjob>-node-0-0.<trainjob>``, pod i is
``<trainjob>-node-0-<i>.<trainjob>``), so the board takes a record only from an address that the
name of the pod it names resolves to (:func:`peer_policy`); with a loopback tracker, only from
loopback; with a tracker named otherwise it cannot tell, takes a record from anyone, and the
launcher says so at start. Every record, at both ends, must pass :func:`check_record`. Whatever
is refused is dropped with one line per peer; nothing a peer sends ends the job or the launcher.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core import log
from launcher.core.outcome import Outcome
from launcher.runner.report import TEXT_LIMIT, StopRecord

PORT_OFFSET = 1  # the board listens on the tracker's port + 1
LINGER = 5.0  # seconds pod 0 keeps the board up after a failure, for the others to read the record
CONNECT_TIMEOUT = 2.0
LINE_LIMIT = 64 * 1024
# A record's free text, cut to what a termination message can show anyway (4096 bytes in all).
MESSAGE_LIMIT = 2000
EVIDENCE_LIMIT = 500
REASON_LIMIT = 64  # a reason is a word of the outcome table, not prose
EXTRA_DEPTH = 4  # a hang's stacks are the deepest extra a pod posts: {"hang": {"stacks": {rank: [frame]}}}
# Seconds between two lookups of the pods' names, at least: a flood of strangers, each an unknown
# address, costs one lookup per interval.
REFRESH = 5.0
PENDING_LIMIT = 64  # records from unknown addresses that wait on a lookup
WARNED_LIMIT = 256  # peers told about once each; past that, quietly

Watch = Callable[[int, Callable[[], None]], None]
Unwatch = Callable[[int], None]
Resolve = Callable[[str], set[str]]


class BadRecord(ValueError):
    """A stop record the board will not act on. Its text is ours: it never repeats the peer's."""


# --- what a record must be -------------------------------------------------------------------------


def check_record(value: object, pods: range, generation: int) -> StopRecord:
    """``value`` as a stop record may be acted on: a :class:`StopRecord` of ``generation`` whose
    ``nodeRank`` is a pod index in ``pods``, whose ``node``, ``rank``, ``localRank``,
    ``exitCode`` (0-255), ``signal`` and ``error`` have their types, and whose ``outcome``
    :meth:`Outcome.from_json` reads, its free text cut to the limits above.

    Raises BadRecord, in a few words of our own, for anything else: a record of another
    generation is stale (an earlier start's, or a stranger's)."""
    if not isinstance(value, dict):
        raise BadRecord("a stop record that is not an object")
    if type(value.get("generation")) is not int:  # type(): True is an int to isinstance
        raise BadRecord("a stop record whose generation is not an integer")
    if value["generation"] != generation:
        raise BadRecord(f"a stale stop record: of another generation than this job's ({generation})")
    pod = value.get("nodeRank")
    if type(pod) is not int or pod not in pods:
        raise BadRecord(f"a stop record whose nodeRank is not an integer {_span(pods)}")
    if not _is_root_cause(value):
        raise BadRecord("a stop record whose node, rank, localRank, exitCode or signal is not one")
    code, error = value.get("exitCode"), value.get("error")
    if code is not None and not 0 <= code <= 255:
        raise BadRecord("a stop record whose exitCode is not an integer 0-255")
    if error is not None and not isinstance(error, str):
        raise BadRecord("a stop record whose error is not a string")
    outcome = value.get("outcome")
    if not isinstance(outcome, dict):
        raise BadRecord("a stop record without an outcome object")
    code = outcome.get("exitCode")
    if type(code) is not int or not 0 <= code <= 255:
        raise BadRecord("an outcome whose exitCode is not an integer 0-255")
    reason = outcome.get("reason")
    if not isinstance(reason, str) or not 0 < len(reason) <= REASON_LIMIT:
        raise BadRecord(f"an outcome whose reason is not a string of 1-{REASON_LIMIT} characters")
    if not isinstance(outcome.get("message"), str):
        raise BadRecord("an outcome whose message is not a string")
    for name in ("evidence", "causeReason"):
        if outcome.get(name) is not None and not isinstance(outcome[name], str):
            raise BadRecord(f"an outcome whose {name} is not a string")
    root = outcome.get("rootCause")
    if root is not None and not _is_root_cause(root):
        raise BadRecord("an outcome whose rootCause is not node, rank, localRank, exitCode and signal")
    if not all(_shallow(item, EXTRA_DEPTH) for item in outcome.values()):
        # The termination message and the logs walk these recursively: keep them shallow.
        raise BadRecord(f"an outcome nested deeper than {EXTRA_DEPTH} levels")
    clean = {**outcome, "message": _cut(outcome["message"], MESSAGE_LIMIT), "reason": reason}
    if outcome.get("evidence") is not None:
        clean["evidence"] = _cut(outcome["evidence"], EVIDENCE_LIMIT)
    Outcome.from_json(clean)  # what every pod does with it: checked above, proven here
    return StopRecord(
        generation=generation,
        node=value.get("node"),
        node_rank=pod,
        rank=value.get("rank"),
        local_rank=value.get("localRank"),
        exit_code=value.get("exitCode"),
        signal=value.get("signal"),
        error=None if error is None else _cut(error, TEXT_LIMIT),
        outcome=clean,
    )


def _span(pods: range) -> str:
    return f"from {pods.start} to {pods.stop - 1}" if pods else "(this job has no other pod)"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_root_cause(root: object) -> bool:
    if not isinstance(root, dict):
        return False
    texts = (root.get("node"), root.get("signal"))
    numbers = (root.get("rank"), root.get("localRank"), root.get("exitCode"))
    return all(text is None or (isinstance(text, str) and len(text) <= 253) for text in texts) and all(
        number is None or (type(number) is int and -(2**31) <= number < 2**31) for number in numbers
    )


def _shallow(value: object, depth: int) -> bool:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return depth > 0 and all(_shallow(item, depth - 1) for item in value)
    return True


# --- whom the board trusts -------------------------------------------------------------------------

# The controller's name for pod 0 (launcher/local/nodes.py emulates it): <trainjob>-node-0-0.<trainjob>,
# perhaps with the cluster's domain after it.
_POD_0 = re.compile(
    r"(?P<job>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)-node-0-0\.(?P=job)"
    r"(?P<domain>(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*)\.?"
)


def pod_names(tracker_host: str, pods: int) -> tuple[str, ...] | None:
    """Every pod's DNS name, derived from pod 0's (``DMLC_TRACKER_URI``), or None where that is
    not the controller's name for it (an address, a name of the user's)."""
    match = _POD_0.fullmatch(tracker_host.lower())
    if match is None:
        return None
    job, domain = match["job"], match["domain"]
    return tuple(f"{job}-node-0-{index}.{job}{domain}" for index in range(pods))


@dataclass(frozen=True)
class Peers:
    """Who may post to pod 0's board: ``names`` (the peer's address is one that the named pod's
    name resolves to), ``loopback`` (a loopback peer), or ``anyone``."""

    kind: str
    names: tuple[str, ...] | None = None


def peer_policy(tracker_host: str, pods: int) -> Peers:
    host = tracker_host.strip("[]")
    names = pod_names(host, pods)
    if names is not None:
        return Peers("names", names)
    lowered = host.lower().rstrip(".")
    address = _address(host)
    if (
        lowered == "localhost"
        or lowered.endswith(".localhost")
        or (address is not None and ipaddress.ip_address(address).is_loopback)
    ):
        return Peers("loopback")
    return Peers("anyone")


def _address(text: str) -> str | None:
    """An IP address as the board compares them: IPv4 for an IPv4-mapped IPv6 peer (a board
    bound to ``::`` sees those), no zone."""
    try:
        address = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def resolve_name(name: str) -> set[str]:
    """Every address ``name`` resolves to here; none when it does not (yet)."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return set()
    return {address for info in found if (address := _address(str(info[4][0]))) is not None}


class _Lookups:
    """The pods' addresses, looked up by a helper thread, so the select loop never waits on DNS:
    one lookup at a time, each ``refresh`` seconds after the last at least. ``completed`` counts
    the lookups whose result the loop has taken, in order."""

    def __init__(
        self,
        names: tuple[str, ...],
        resolve: Resolve,
        refresh: float,
        watch: Watch,
        unwatch: Unwatch,
        on_done: Callable[[], None],
    ):
        self.addresses: dict[str, frozenset[int]] = {}
        self.completed = 0
        self.names, self._resolve, self._refresh = names, resolve, refresh
        self._unwatch, self._on_done = unwatch, on_done
        self._lock = threading.Lock()
        self._running = self._again = self._closed = False
        self._last = float("-inf")
        self._result: dict[str, frozenset[int]] | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        watch(self._wake_r, self._take)

    def request(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._running:
                self._again = True
                return
            self._running = True
        threading.Thread(target=self._work, name="xgboost-board-lookups", daemon=True).start()

    def close(self) -> None:
        with self._lock:  # the helper writes under it: the pipe's numbers are never reused under it
            self._closed = True
            self._unwatch(self._wake_r)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _work(self) -> None:
        while True:
            time.sleep(max(0.0, self._last + self._refresh - time.monotonic()))
            self._last = time.monotonic()
            found: dict[str, set[int]] = {}
            for index, name in enumerate(self.names):
                if self._closed:
                    return
                try:
                    addresses = self._resolve(name)
                except Exception:  # noqa: BLE001 - any resolver's failure finds nothing; the next lookup may
                    addresses = set()
                for address in addresses:
                    found.setdefault(address, set()).add(index)
            with self._lock:
                if self._closed:
                    return
                self._result = {address: frozenset(pods) for address, pods in found.items()}
                again, self._again = self._again, False
                self._running = again
                with contextlib.suppress(BlockingIOError):  # the loop has a wake word waiting already:
                    os.write(self._wake_w, b".")  # it takes the newest result
            if not again:
                return

    def _take(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            result, self._result = self._result, None
        if result is not None:
            self.addresses = result
            self.completed += 1
            self._on_done()


# --- the wire --------------------------------------------------------------------------------------


def _lines(buffer: bytearray, data: bytes) -> tuple[list[dict], list[str]]:
    """Append ``data``; pop and parse every complete line: the JSON objects, and a few words on
    each line dropped."""
    buffer.extend(data)
    messages, problems = [], []
    while (end := buffer.find(b"\n")) != -1:
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the stack
            problems.append("a line that is not JSON, or is nested too deep")
            continue
        if isinstance(message, dict):
            messages.append(message)
        else:
            problems.append("a line that is not a JSON object")
    if len(buffer) > LINE_LIMIT:
        buffer.clear()
        problems.append(f"a line over {LINE_LIMIT // 1024} KiB")
    return messages, problems


def _send(connection: socket.socket, message: dict) -> bool:
    try:
        connection.setblocking(True)
        connection.settimeout(CONNECT_TIMEOUT)
        connection.sendall(json.dumps(message).encode() + b"\n")
        connection.setblocking(False)
        return True
    except OSError:
        return False


@dataclass
class _Client:
    connection: socket.socket
    address: str
    buffer: bytearray
    trusted: bool  # its address is a pod's: it is sent the stop record


class Board:
    """Pod 0's side: the listening socket and every other pod's connection."""

    def __init__(
        self,
        port: int,
        ipv6: bool,
        watch: Watch,
        unwatch: Unwatch,
        on_record: Callable[[StopRecord], None],
        pods: int,
        peers: Peers,
        resolve: Resolve = resolve_name,
        refresh: float = REFRESH,
        generation: int = 0,
    ):
        self.record: StopRecord | None = None
        self.generation = generation  # the start of the job whose records it takes
        self.done = False
        self.dropped = 0  # lines, records and connections refused
        self._watch, self._unwatch, self._on_record = watch, unwatch, on_record
        self._pods, self._peers = pods, peers
        self._clients: dict[int, _Client] = {}
        self._pending: list[tuple[str, StopRecord, int]] = []  # address, record, lookups completed when it came
        self._warned: set[str] = set()
        family = socket.AF_INET6 if ipv6 else socket.AF_INET
        self._server = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._server.bind(("::" if ipv6 else "0.0.0.0", port))
            self._server.listen(256)
        except OSError:
            self._server.close()
            raise
        self._server.setblocking(False)
        self._lookups: _Lookups | None = None
        if peers.kind == "names":
            if peers.names is None:
                self._server.close()
                raise ValueError("the board's peers are names, but no names are given")
            self._lookups = _Lookups(peers.names, resolve, refresh, watch, unwatch, self._on_lookup)
        watch(self._server.fileno(), self._accept)

    @property
    def clients(self) -> int:
        """The pods connected (a stranger's connection does not hold the board up)."""
        return sum(1 for client in self._clients.values() if client.trusted)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def post(self, record: StopRecord) -> None:
        """Our own pod's record: every other pod gets it (unless one was posted first)."""
        if self.record is None:
            self.record = record
            self._broadcast({"stop": record.to_json()}, trusted_only=True)

    def finish(self) -> None:
        """The job succeeded here: tell every connection the board closes on purpose (a pod whose
        address is not known yet must not take the close for pod 0's loss)."""
        self.done = True
        self._broadcast({"done": True}, trusted_only=False)

    def close(self) -> None:
        for fd in list(self._clients):
            self._drop(fd)
        if self._lookups is not None:
            self._lookups.close()
        self._unwatch(self._server.fileno())
        self._server.close()

    def _accept(self) -> None:
        try:
            connection, peer = self._server.accept()
        except OSError:
            return
        address = _address(str(peer[0])) or str(peer[0])
        if self._peers.kind == "loopback" and not ipaddress.ip_address(address).is_loopback:
            connection.close()
            self._refuse(address, "a connection from off this host, while the tracker is on loopback")
            return
        connection.setblocking(False)
        fd = connection.fileno()
        client = _Client(connection, address, bytearray(), self._lookups is None or address in self._lookups.addresses)
        self._clients[fd] = client
        self._watch(fd, lambda: self._read(fd))
        if not client.trusted:
            self._names().request()
        elif self.record is not None:
            _send(connection, {"stop": self.record.to_json()})
        if self.done:
            _send(connection, {"done": True})

    def _read(self, fd: int) -> None:
        client = self._clients[fd]
        try:
            data = client.connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        messages, problems = _lines(client.buffer, data)
        for problem in problems:
            self._refuse(client.address, problem)
        for message in messages:
            try:
                # pod 0 posts through post()
                record = check_record(message.get("stop"), range(1, self._pods), self.generation)
            except BadRecord as bad:
                self._refuse(client.address, str(bad))
                continue
            self._consider(client.address, record)

    def _consider(self, address: str, record: StopRecord) -> None:
        if self.record is not None:
            return  # the first record of the generation won
        pods: range | frozenset[int] | None
        if self._lookups is None:
            pods = range(self._pods)
        elif (pods := self._lookups.addresses.get(address)) is None:
            if len(self._pending) >= PENDING_LIMIT:
                self._refuse(address, "a record while too many others wait on a lookup of the pods' names")
                return
            self._pending.append((address, record, self._lookups.completed))
            self._lookups.request()
            return
        if record.node_rank not in pods:
            self._refuse(
                address, f"a record naming pod {record.node_rank}, whose name does not resolve to this address"
            )
            return
        self.record = record
        self._broadcast({"stop": record.to_json()}, trusted_only=True)
        if any(not client.trusted for client in self._clients.values()):
            self._names().request()  # a pod whose name did not resolve yet gets it once it does
        self._on_record(record)

    def _names(self) -> _Lookups:
        """The lookups of the pods' names: there are some wherever a connection can be untrusted."""
        if self._lookups is None:
            raise RuntimeError("the board looks up no names: its peers are not named pods")
        return self._lookups

    def _on_lookup(self) -> None:
        lookups = self._names()
        addresses = lookups.addresses
        for fd, client in list(self._clients.items()):
            if not client.trusted and client.address in addresses:
                client.trusted = True
                if self.record is not None and not _send(client.connection, {"stop": self.record.to_json()}):
                    self._drop(fd)
        waiting, self._pending = self._pending, []
        for address, record, asked in waiting:
            if lookups.completed <= asked:
                self._pending.append((address, record, asked))  # came while this lookup ran: the next decides
            elif address not in addresses:
                self._refuse(
                    address,
                    f"a record from an address that none of the job's pods' names ({lookups.names[0]}...) resolves to",
                )
            else:
                self._consider(address, record)

    def _refuse(self, address: str, problem: str) -> None:
        self.dropped += 1
        if address in self._warned or len(self._warned) >= WARNED_LIMIT:
            return
        self._warned.add(address)
        log.warning(
            f"xgboost: stop board: ignored what {address} sent: {problem} (said once per peer; the job goes on)"
        )

    def _broadcast(self, message: dict, trusted_only: bool) -> None:
        for fd, client in list(self._clients.items()):
            if (client.trusted or not trusted_only) and not _send(client.connection, message):
                self._drop(fd)

    def _drop(self, fd: int) -> None:
        client = self._clients.pop(fd)
        self._unwatch(fd)
        client.connection.close()


class BoardClient:
    """Every other pod's side: one connection to pod 0's board."""

    def __init__(
        self,
        host: str,
        port: int,
        watch: Watch,
        unwatch: Unwatch,
        on_record: Callable[[StopRecord], None],
        on_lost: Callable[[], None],
        pods: int,
        generation: int = 0,
    ):
        self.record: StopRecord | None = None
        self.generation = generation
        self.done = False
        self._unwatch, self._on_record, self._on_lost = unwatch, on_record, on_lost
        self._pods, self._where, self._warned = pods, f"{host}:{port}", False
        self._buffer = bytearray()
        self._connection = socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT)
        self._connection.setblocking(False)
        self._fd = self._connection.fileno()
        watch(self._fd, self._read)

    def post(self, record: StopRecord) -> None:
        if self._fd != -1:
            _send(self._connection, {"stop": record.to_json()})

    def close(self) -> None:
        if self._fd != -1:
            self._unwatch(self._fd)
            self._fd = -1
            self._connection.close()

    def _read(self) -> None:
        try:
            data = self._connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            if not self.done and self.record is None:
                self._on_lost()
            return
        messages, problems = _lines(self._buffer, data)
        for problem in problems:
            self._refuse(problem)
        for message in messages:
            if message.get("done") is True:
                self.done = True
            elif self.record is None:
                try:
                    record = check_record(message.get("stop"), range(self._pods), self.generation)
                except BadRecord as bad:
                    self._refuse(str(bad))
                    continue
                self.record = record
                self._on_record(record)

    def _refuse(self, problem: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                f"xgboost: stop board at {self._where}: ignored what it sent: {problem} (said once; the job goes on)"
            )
