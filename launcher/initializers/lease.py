"""One writer per target: a lease file on the (possibly shared, RWX) volume.

``<target>/.trainer-launcher/lease`` names its holder (host, pid, a random id: nothing secret)
and a heartbeat counter the holder rewrites every TTL/3. Another initializer of the same target
waits; it judges the lease stale by its OWN monotonic clock: the file's bytes not changing for the
TTL. Wall clocks are never compared, so skew between nodes cannot matter.

Why no flock/fcntl: advisory locks over NFS depend on lockd/NLM or NFSv4 state, which some RWX
backends do not provide, and a lock held by a partitioned client is invisible to the others. We
rely only on operations NFSv3+, NFSv4, CephFS and local file systems perform atomically on the
server: ``open(O_CREAT|O_EXCL)`` (an exclusive create: exactly one creator succeeds), ``rename``
over an existing name, and close-to-open consistency (each poll opens and reads the file afresh;
the holder fsyncs each beat so the server sees it).

Taking over a stale lease whose bytes were X: the waiter first creates ``lease.claim-<hash X>-<n>``
with O_EXCL (exactly one waiter per X wins it), checks the lease still reads X, then renames its
own lease over it and reads it back. A lease's bytes never repeat (random id, growing counter), so
a claim for X means nothing once the lease reads anything else. Claim ``n+1`` is tried only if
claim ``n`` stayed taken while X stayed unchanged for another TTL (its winner died mid-takeover).
A holder that finds someone else's id in the lease (it was paused for longer than the TTL) steps
down at once: ``on_lost`` (from the heartbeat thread) has the initializer stop its download and
exit retryably rather than let two writers run. It steps down only on that evidence, never
because its own beats were late: a late beat that nobody acted on costs nothing. A holder paused
past the TTL looks dead to a waiter on another node and can be taken over whatever the TTL, so
``release`` finds out whether the lease was still its own (if so, no other initializer took it
meanwhile) and logs a loss that no beat caught.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from launcher.core.outcome import Reasons
from launcher.initializers.errors import TransientError
from launcher.initializers.knobs import INIT_KNOBS
from launcher.initializers.state import own_state_directory

LEASE = "lease"
LOG_EVERY = 5.0


class LeaseTimeout(TransientError):
    """Another initializer held the target's lease, and kept renewing it, for the whole wait."""

    reason = Reasons.LEASE_TIMEOUT


# --- pure: what the file says, and a waiter's judgement of it ----------------------------------


@dataclass(frozen=True)
class Holder:
    id: str
    hostname: str
    pid: int
    ttl: float
    beat: int = 0
    node: str | None = None  # boot id + PID namespace: the same value means "pid is visible here"
    start: str | None = None  # the process's start time (since boot): tells a reused pid apart
    time: str = ""  # wall clock, for people reading the file; never compared

    def encode(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Holder | None:
        try:
            data = json.loads(raw or b"")
            return cls(
                id=str(data["id"]),
                hostname=str(data["hostname"]),
                pid=int(data["pid"]),
                ttl=float(data["ttl"]),
                beat=int(data["beat"]),
                node=data.get("node"),
                start=data.get("start"),
                time=str(data.get("time", "")),
            )
        except (ValueError, TypeError, KeyError):
            return None  # empty (just created), torn by a concurrent rewrite, or not ours

    def next(self, wall: str = "") -> Holder:
        return replace(self, beat=self.beat + 1, time=wall)

    def who(self) -> str:
        return f"{self.hostname} pid {self.pid}"


class Watch:
    """A waiter's view of the lease, by its own monotonic clock."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        self.raw: bytes | None = None
        self.holder: Holder | None = None
        self.changed = 0.0  # when the bytes last changed
        self.first_seen = 0.0  # when this holder id was first seen
        self.generation = 0
        self.claim_busy_since: float | None = None

    def see(self, raw: bytes, now: float) -> None:
        if raw == self.raw:
            return
        holder = Holder.decode(raw)
        if self.raw is None or (holder is not None and (self.holder is None or holder.id != self.holder.id)):
            self.first_seen = now
        self.raw, self.holder, self.changed = raw, holder or self.holder, now
        self.generation, self.claim_busy_since = 0, None

    def limit(self) -> float:
        # A holder configured with a longer TTL beats less often: never judge it by ours alone.
        return max(self.ttl, self.holder.ttl if self.holder else 0.0)

    def stale(self, now: float, dead_here: bool = False) -> bool:
        return dead_here or now - self.changed >= self.limit()

    def claim_to_try(self, now: float) -> int | None:
        """The claim generation to try now, or None while another waiter's claim may still be live."""
        if self.claim_busy_since is not None:
            if now - self.claim_busy_since < self.limit():
                return None
            self.generation, self.claim_busy_since = self.generation + 1, None
        return self.generation

    def claim_taken(self, now: float) -> None:
        if self.claim_busy_since is None:
            self.claim_busy_since = now

    def line(self, target: str, now: float, waited: float, wait: float) -> str:
        who = self.holder.who() if self.holder else "an unreadable lease"
        limit = f"giving up after {wait:.0f}s" if wait else "no time limit"
        return (
            f"{target}: another initializer is writing it; waiting for the lease held by {who} "
            f"(seen for {now - self.first_seen:.0f}s, last heartbeat {now - self.changed:.0f}s ago, "
            f"stale after {self.limit():.0f}s without one; waited {waited:.0f}s, {limit})"
        )


def dead_here(holder: Holder | None, here: str | None, start_of: Callable[[int], str | None]) -> bool:
    """True when the holder ran in this very PID namespace and its process is gone (or its pid now
    belongs to another process): a crashed predecessor on this node need not cost a whole TTL."""
    if holder is None or here is None or holder.node != here or holder.start is None:
        return False
    return start_of(holder.pid) != holder.start


# --- I/O ----------------------------------------------------------------------------------------


def this_node() -> str | None:
    """Boot id and PID namespace: where the same value is recorded, its pids mean our pids."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # /proc belongs to another PID namespace: pids cannot be checked here
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None  # not Linux: only the TTL decides


def start_of(pid: int | str) -> str | None:
    """Field 22 of /proc/PID/stat (start time in ticks since boot); None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _read(path: str) -> bytes | None:
    """The lease's bytes, None when there is none. A symlink at its name is never followed
    (initializers only make regular files there): it reads as an unreadable lease."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return b""
        raise
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _remove_planted_link(path: str, log: Callable[[str], None]) -> None:
    """A symlink at the lease's name is no lease (see _read): waiting a TTL for it to go stale
    would be waiting for nothing, so it goes at once. Should a holder's lease replace it in
    between, that holder sees its lease gone at its next beat and stops: never two writers."""
    if os.path.islink(path):
        log(f"{path}: a symbolic link, not a lease; removed (its target left alone)")
        os.unlink(path)


def _wall() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Lease:
    """A lease this process holds: renewed by a daemon thread until :meth:`release`."""

    def __init__(self, path: str, fd: int, holder: Holder, on_lost: Callable[[str], None], log: Callable[[str], None]):
        self.path, self.fd, self.holder, self.on_lost, self.log = path, fd, holder, on_lost, log
        self._released = threading.Event()
        self._lock = threading.Lock()  # one report of a loss: a beat's or release's
        self._told = False
        self.kept: bool | None = None  # set by release: whether the lease was still ours
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        last_ok = time.monotonic()
        while not self._released.wait(self.holder.ttl / 3):
            try:
                holder = self.holder.next(_wall())
                data = holder.encode()
                # In place through our own descriptor: if a taker renamed its lease over ours,
                # these bytes land in our orphaned file and never clobber the taker's.
                os.pwrite(self.fd, data, 0)
                os.ftruncate(self.fd, len(data))
                os.fsync(self.fd)
                self.holder = holder
                now_there = Holder.decode(_read(self.path))
            except OSError as error:
                if time.monotonic() - last_ok > self.holder.ttl:
                    return self._lost(f"could not renew the lease {self.path} for {self.holder.ttl:.0f}s ({error})")
                continue
            if self._released.is_set():
                return
            if now_there is None or now_there.id != self.holder.id:
                who = now_there.who() if now_there else "nobody"
                return self._lost(
                    f"the lease {self.path} was taken over by {who} (this initializer "
                    f"did not renew it for {self.holder.ttl:.0f}s); stopping so that only one writes"
                )
            last_ok = time.monotonic()

    def _lost(self, message: str) -> None:
        with self._lock:  # one report of a loss, never after release (which reports its own)
            if self._told or self._released.is_set():
                return
            self._told = True
        self.on_lost(message)

    def release(self) -> None:
        """Remove the lease if it is still ours, and set :attr:`kept`: True when it was (the lease
        file was this one's throughout, so no other initializer took the lease while this one held
        it); False when another had taken it over (this one did not renew it for the TTL, by the
        taker's clock), which is logged here unless ``on_lost`` said so already, or when the lease
        could not be read."""
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
            told = self._told
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.kept = False
        try:
            raw = _read(self.path)
            current = Holder.decode(raw)
            if current is not None and current.id == self.holder.id:
                os.unlink(self.path)
                self.kept = True
            elif not told:
                state = f"held by {current.who()}" if current else ("gone" if raw is None else "unreadable")
                self.log(
                    f"the lease {self.path} was no longer this initializer's when it released it ({state}): "
                    f"another one took it over, having seen no renewal for {self.holder.ttl:.0f}s, and may "
                    f"have written the target meanwhile"
                )
        except OSError as error:
            self.log(f"could not release the lease {self.path} ({error}); a waiter takes it over after the TTL")
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def _create(path: str, data: bytes) -> int | None:
    """Exclusive create (NFSv3+ does it on the server); the descriptor, or None if it exists."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    try:
        os.write(fd, data)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(path)  # a full or failing volume: leave no empty lease that others must wait out
        raise
    return fd


def _claim_path(directory: str, raw: bytes, generation: int) -> str:
    return os.path.join(directory, f"{LEASE}.claim-{hashlib.sha256(raw).hexdigest()[:16]}-{generation}")


def take_over(directory: str, stale: bytes, generation: int, mine: bytes) -> int | None:
    """Replace the lease that reads ``stale`` by ``mine``; the descriptor if we won, else None."""
    path = os.path.join(directory, LEASE)
    claim = _claim_path(directory, stale, generation)
    marker = _create(claim, b"")
    if marker is None:
        return None
    os.close(marker)
    if _read(path) != stale:  # it moved on (the holder woke up, or a claim winner already replaced it)
        with contextlib.suppress(FileNotFoundError):  # the new holder cleared the claims already
            os.unlink(claim)
        return None
    temporary = f"{path}.tmp-{secrets.token_hex(8)}"
    fd = _create(temporary, mine)
    if fd is None:  # 64 random bits named a file that exists: it is not ours to move
        raise FileExistsError(errno.EEXIST, "the lease's temporary file exists already", temporary)
    os.replace(temporary, path)
    if os.pread(fd, len(mine) + 1, 0) != mine or _read(path) != mine:
        os.close(fd)
        return None
    for generation_seen in range(generation + 1):  # X never returns: its claims mean nothing now
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_claim_path(directory, stale, generation_seen))
    return fd


def acquire(
    target: str,
    ttl: float,
    wait: float,
    log: Callable[[str], None],
    on_lost: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Lease:
    """Hold the target's lease, waiting for (or taking over from) another holder. Raises
    :class:`LeaseTimeout` after ``wait`` seconds (0: no limit) of a lease that stays live."""
    os.makedirs(target, exist_ok=True)
    directory = own_state_directory(target, log)
    path = os.path.join(directory, LEASE)
    _remove_planted_link(path, log)
    here = this_node()
    me = Holder(secrets.token_hex(8), socket.gethostname(), os.getpid(), ttl, 0, here, start_of("self"), _wall())
    watch = Watch(ttl)
    started = clock()
    logged: float | None = None
    poll = min(1.0, ttl / 10)
    while True:
        fd = _create(path, me.encode())
        if fd is not None:
            if logged is not None:
                log(
                    f"{target}: the lease was released; this initializer holds it now (waited {clock() - started:.0f}s)"
                )
            break
        raw = _read(path)
        if raw is None:  # released between our create and our read: try to create again
            sleep(min(poll, 0.05))
            continue
        now = clock()
        watch.see(raw, now)
        gone = dead_here(watch.holder, here, start_of)
        if watch.stale(now, gone):
            generation = watch.claim_to_try(now)
            if generation is not None:
                fd = take_over(directory, raw, generation, me.encode())
                if fd is not None:
                    why = "its process is gone" if gone else f"no heartbeat for {now - watch.changed:.0f}s"
                    holder = watch.holder.who() if watch.holder else "an unreadable lease"
                    log(f"{target}: took over the lease of {holder} ({why})")
                    break
                watch.claim_taken(now)
        if wait and now - started >= wait:
            who = watch.holder.who() if watch.holder else "an unreadable lease"
            raise LeaseTimeout(
                f"gave up after waiting {wait:.0f}s ({INIT_KNOBS['lease_wait'].env}) for the lease "
                f"{path}, held by {who} and still renewed {now - watch.changed:.0f}s ago"
            )
        if logged is None or now - logged >= LOG_EVERY:
            log(watch.line(target, now, now - started, wait))
            logged = now
        sleep(poll)
    for name in os.listdir(directory):  # claims on leases that are gone mean nothing any more
        if name.startswith(f"{LEASE}.claim-"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
    return Lease(path, fd, me, on_lost, log)
