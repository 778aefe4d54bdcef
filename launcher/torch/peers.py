"""The nodes of one torch job, talking through the rendezvous store they already share.

Runs inside the torch agent (torch is imported there anyway). torchrun leaves each node to
itself: a rank that dies on node 1 leaves node 0's ranks running, or node 0 waiting in torchrun's
exit barrier for 300 s and then reporting success; and when a job succeeds, the node hosting the
store may exit while another still reads the barrier's last key ("Connection reset by peer").

Over a second client connection to the same TCPStore (the one torchrun's rendezvous serves on the
master address and port, or on the c10d endpoint), every agent:

- publishes the job's stop record (launcher/runner/report.py) as soon as its own ranks have
  failed for good (no restarts left); the first writer wins, so there is one per generation;
- watches for that record and, when a peer wrote it, stops its own ranks;
- publishes its node's outcome, as its launcher classified it, and reads every node's, so each
  node can name the same root cause;
- ends in one order: every node publishes, waits for every node's outcome (or ``linger``
  seconds), reads them and, when it is not the store's host, says it is done with the store as
  its last word to it; the host (the node whose agent serves the store: torchrun's rendezvous
  made the server there) leaves only once every node that published said so, or ``DONE_WAIT``
  seconds passed. The host's agent holds torchrun's store object until it exits
  (compat.keep_rendezvous_store): the server would otherwise close when torchrun returns there,
  while the others are still in torchrun's exit barrier or here (issue 23);
- on a hang (launcher.status.monitor), takes its own ranks' Python stacks when any node asks, and
  publishes their top frames: the rank that stopped is often on another node than the one that
  noticed, and only there can its stack be taken before the job is torn down.

Keys live under ``trainer-launcher/``; a JobSet restart brings a new store (each agent hosts it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

from launcher.runner import report as records

PREFIX = "trainer-launcher/"
DEPARTED = PREFIX + "departed"
ALL_DEPARTED = PREFIX + "all-departed"
CONNECT_TIMEOUT = 5.0
POLL = 0.2  # seconds between looks at the stop record
# After every node published, how long the store's host waits for the others to be done with it.
DONE_WAIT = 10.0
DUMP = PREFIX + "dump-stacks"
DUMPED = PREFIX + "dumped"
# How long the node that asked waits for the others' stacks (each takes at most a few seconds).
DUMP_WAIT = 8.0
# Every node beats while it has not concluded: one that has not published its outcome and whose
# beat stood still this long is gone (a lost pod), and the others stop waiting for it.
BEAT = 1.0
STALE = 10.0


def node_key(node_rank: int) -> str:
    return f"{PREFIX}node/{node_rank}"


def stacks_key(node_rank: int) -> str:
    return f"{PREFIX}stacks/{node_rank}"


def beat_key(node_rank: int) -> str:
    return f"{PREFIX}beat/{node_rank}"


def done_key(node_rank: int) -> str:
    """Set by a node that is not the store's host as its last word to the store."""
    return f"{PREFIX}done/{node_rank}"


@dataclass(frozen=True)
class PeerConfig:
    """Where the job's store is and who we are, as the launcher planned it."""

    host: str
    port: int
    nnodes: int
    node_rank: int
    node: str
    linger: float  # seconds to wait for the other nodes to publish their outcome
    # The launcher asks for every node's stacks by creating this file; the answer (every node's
    # top frames, JSON) appears atomically at dump_request + ".done". None: no hang detection.
    dump_request: str | None = None
    generation: int = 0  # which start in place of the job this is (its stop record's key)

    @classmethod
    def from_json(cls, data: dict | None) -> PeerConfig | None:
        if not data:
            return None
        return cls(
            data["host"],
            int(data["port"]),
            int(data["nnodes"]),
            int(data["nodeRank"]),
            data["node"],
            float(data["linger"]),
            data.get("dumpRequest"),
            int(data.get("generation", 0)),
        )


class Peers:
    """This node's side of the job-wide channel. ``on_stop`` runs on the watcher thread when a
    peer's stop record arrives (or the store's host vanished) while this node has not finished."""

    def __init__(
        self,
        config: PeerConfig,
        on_stop: Callable[[], None],
        on_dump: Callable[[], list[dict]] | None = None,
    ):
        """``on_dump``: take this node's ranks' stacks (and log them); their top frames return."""
        self.config = config
        self._on_stop = on_stop
        self._on_dump = on_dump
        self._asked = self._dumped = False
        self._lock = threading.Lock()
        self.role: str | None = None  # "root" once we published the stop record, "victim" once a peer did
        self.stop_record: records.StopRecord | None = None  # a peer's, once we are its victim
        self.lost: str | None = None  # the store's host:port, once it vanished without a record
        self.failed_at: float | None = None
        self._finished = threading.Event()
        self._watcher_idle = threading.Event()  # the watcher will not touch the store again
        self._watcher_idle.set()
        self._beat_idle = threading.Event()  # the heartbeat will not touch the store again
        self._beat_idle.set()
        self._joined = threading.Event()  # torchrun's agent has its rendezvous store (joined())
        self._store = None  # the main thread's connection (publishing, leaving)

    # --- connections -------------------------------------------------------------------------

    def _connect(self, deadline: float | None, give_up: threading.Event | None = None):
        """A plain client (no world size: it must not count as one of torchrun's agents). Dialled
        only once the port accepts: a TCPStore client that cannot connect logs C++ errors."""
        from torch.distributed import TCPStore

        pause = give_up or threading.Event()
        while not pause.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                socket.create_connection((self.config.host, self.config.port), timeout=CONNECT_TIMEOUT).close()
                return TCPStore(
                    self.config.host,
                    self.config.port,
                    world_size=None,
                    is_master=False,
                    timeout=timedelta(seconds=CONNECT_TIMEOUT),
                    wait_for_workers=False,
                )
            except Exception:  # noqa: BLE001 - not up yet (the master's agent creates it), or gone
                pause.wait(POLL)
        return None

    def _main_store(self):
        if self._store is None:
            self._store = self._connect(time.monotonic() + CONNECT_TIMEOUT)
        return self._store

    # --- watching ------------------------------------------------------------------------------

    def joined(self) -> None:
        """torchrun's agent is through its rendezvous and holds its store: the watcher may dial
        a client of its own. Not before: a second TCPStore built while the agent's own still sits
        in its constructor (waiting for every node to join) crashed the agent with SIGSEGV in
        the watcher's constructor (seen once in CI, torch 2.13.0)."""
        self._joined.set()

    def start(self) -> None:
        self._watcher_idle.clear()
        self._beat_idle.clear()
        threading.Thread(target=self._watch, name="trainer-launcher-peers", daemon=True).start()
        threading.Thread(target=self._beat, name="trainer-launcher-beat", daemon=True).start()

    def _beat(self) -> None:
        """Count up this node's beat every BEAT seconds until it concludes, on a connection of its
        own: the watcher stops at the stop record, and this node may take its grace period to stop
        its ranks after it."""
        try:
            while not self._joined.wait(POLL):
                if self._finished.is_set():
                    return
            store = self._connect(None, self._finished)
            while store is not None:
                store.add(beat_key(self.config.node_rank), 1)
                if self._finished.wait(BEAT):
                    return
        except Exception:  # noqa: BLE001 - the store's host is gone: the watcher says so
            return
        finally:
            self._beat_idle.set()

    def _watch(self) -> None:
        try:
            self._watch_store()
        finally:
            self._watcher_idle.set()

    def _watch_store(self) -> None:
        while not self._joined.wait(POLL):
            if self._finished.is_set():
                return
        store = self._connect(None, self._finished)
        if store is None:
            return
        record = lost = None
        # Polled, not a blocking wait: a wait still pending when the store's host leaves at the
        # end of a good run would fail, and torch logs that failure with a C++ stack trace.
        while record is None and lost is None and not self._finished.wait(POLL):
            try:
                self._stacks(store)
                stop = records.stop_key(self.config.generation)
                if store.check([stop]):
                    record = records.StopRecord.parse(store.get(stop).decode())
                    if record is not None and record.generation != self.config.generation:
                        record = None  # an older generation's: not this one's stop
            except Exception:  # noqa: BLE001 - the store's host went away before anyone published a stop record
                lost = f"{self.config.host}:{self.config.port}"
        self._watcher_idle.set()  # done with the store: conclude may say so for this node
        with self._lock:
            if (record is None and lost is None) or self.role is not None or self._finished.is_set():
                return  # done, or the record is our own
            self.role = "victim"
            self.stop_record, self.lost = record, lost
        self._on_stop()

    def _stacks(self, store) -> None:
        """Ask every node for its stacks when our launcher asked us; give ours when any node asked."""
        request = self.config.dump_request
        if request is None or self._on_dump is None:
            return
        if not self._asked and os.path.exists(request):
            self._asked = True
            store.compare_set(DUMP, "", self.config.node)
        if self._dumped or not store.check([DUMP]):
            return
        self._dumped = True
        store.set(stacks_key(self.config.node_rank), json.dumps({"node": self.config.node, "ranks": self._on_dump()}))
        store.add(DUMPED, 1)
        if self._asked:
            self._answer(store, request)

    def _answer(self, store, request: str) -> None:
        """Every node's stacks (those that answered within DUMP_WAIT), for our launcher."""
        deadline = time.monotonic() + DUMP_WAIT
        while store.add(DUMPED, 0) < self.config.nnodes and time.monotonic() < deadline:
            time.sleep(POLL)
        answers = []
        for rank in range(self.config.nnodes):
            if store.check([stacks_key(rank)]):
                answers.append(json.loads(store.get(stacks_key(rank))))
        done = request + ".done"
        with open(done + ".tmp", "w") as handle:
            json.dump(answers, handle)
        os.replace(done + ".tmp", done)

    # --- publishing ----------------------------------------------------------------------------

    def publish_stop(self, record: records.StopRecord) -> None:
        """Our ranks failed for good: tell the others to stop theirs (the first record wins)."""
        with self._lock:
            if self.role is not None:
                return
            self.failed_at = time.time()
            mine = replace(record, node_rank=self.config.node_rank, node=self.config.node)
            store = self._main_store()
            if store is None:
                self.role = "root"
                return
            try:
                won, winner = records.claim(_Keys(store), mine)
            except Exception:  # noqa: BLE001 - the store failed: this node's own record stands
                self.role = "root"
                return
            self.role = "root" if won else "victim"
            if not won:
                self.stop_record = winner

    def conclude(self, outcome: dict | None) -> list[dict]:
        """Publish this node's outcome, wait for every node's, and return them (ours included).
        The end of the job, in one order: a node that is not the store's host says it is done
        with the store as its last word to it; the host returns only once every node that
        published said so (or ``DONE_WAIT`` passed), so it never takes the store away from a
        node still using it. Never raises: a lost peer costs only time."""
        self._finished.set()
        summary = {
            "nodeRank": self.config.node_rank,
            "node": self.config.node,
            "outcome": outcome,
            "failedAt": self.failed_at,
        }
        store = self._main_store()
        if store is None:
            self._alone("no connection")
            return [summary]
        try:
            store.set(node_key(self.config.node_rank), json.dumps(summary))
            self._await_nodes(store)
            summaries = []
            for rank in range(self.config.nnodes):
                key = node_key(rank)
                if store.check([key]):
                    summaries.append(json.loads(store.get(key)))
        except Exception as error:  # noqa: BLE001 - never raises: a lost peer costs only time
            self._alone(f"{type(error).__name__}: {error}")
            return [summary]
        # The watcher's last look at the store is over at once (it waits on _finished), unless it
        # is answering a stacks request.
        self._watcher_idle.wait(DUMP_WAIT + CONNECT_TIMEOUT)
        self._beat_idle.wait(CONNECT_TIMEOUT)
        others = [s["nodeRank"] for s in summaries if s["nodeRank"] != self.config.node_rank]
        try:
            if self.serves_store():
                if others:
                    store.wait([done_key(rank) for rank in others], timedelta(seconds=DONE_WAIT))
            else:
                store.set(done_key(self.config.node_rank), "1")  # our last word to the store
        except Exception:  # noqa: BLE001 - a node published and then vanished: the host waited long enough
            pass
        return summaries

    def _alone(self, why: str) -> None:
        """Say, in the pod's log, that this node concludes without the others' outcomes: a peer it
        then calls lost may only have been out of reach of a store that failed here."""
        where = f"{self.config.host}:{self.config.port}"
        print(
            f"trainer-launcher: warning: the other nodes' outcomes could not be read from the job's store at {where} "
            f"({why.splitlines()[0][:200]}); {self.config.node} concludes on its own",
            file=sys.stderr,
            flush=True,
        )

    def _await_nodes(self, store) -> None:
        """Arrive, and wait until every node did, ``linger`` seconds passed, or every node yet to
        arrive has stopped beating for STALE seconds (a lost pod says nothing more)."""
        nnodes, me = self.config.nnodes, self.config.node_rank
        if store.add(DEPARTED, 1) >= nnodes:
            store.set(ALL_DEPARTED, "1")
            return
        start = time.monotonic()
        beats: dict[int, tuple[int, float]] = {}  # node rank -> (its count, when it last changed)
        while not store.check([ALL_DEPARTED]) and time.monotonic() < start + self.config.linger:
            time.sleep(POLL)
            now = time.monotonic()
            missing = [rank for rank in range(nnodes) if rank != me and not store.check([node_key(rank)])]
            for rank in missing:
                count = store.add(beat_key(rank), 0)
                if beats.get(rank, (None,))[0] != count:
                    beats[rank] = (count, now)
            if missing and all(now - beats[rank][1] >= STALE for rank in missing):
                return

    def serves_store(self) -> bool:
        """Whether this node's agent serves the job's store (torchrun's rendezvous made the
        server here: node rank 0 under Trainer, whichever node's address is the endpoint)."""
        from launcher.torch import compat

        serving = compat.serves_port(self.config.port)
        return self.config.node_rank == 0 if serving is None else serving


class _Keys:
    """The job's store as the stop record's transport (launcher/runner/report.py)."""

    def __init__(self, store):
        self.store = store

    def claim(self, key: str, value: str) -> str:
        return self.store.compare_set(key, "", value).decode()


def stop_local_ranks(workers: list, grace: float) -> None:
    """SIGTERM every local rank's process group (torchrun starts each in its own session), then
    SIGKILL what is left after ``grace``. Used when torchrun's own teardown cannot run because its
    main thread is blocked in the store."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        alive = [p for p in workers if p.poll() is None]
        for process in alive:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, sig)
        end = time.monotonic() + wait
        while any(p.poll() is None for p in alive) and time.monotonic() < end:
            time.sleep(0.05)
