"""The one place that spawns and waits: a small PID 1.

Children run in their own process groups with PR_SET_PDEATHSIG, so no child outlives a launcher
that is SIGKILLed. Signals arrive through a wakeup pipe into one select loop, which also relays
the children's output (scanning it for node-fault evidence), reaps every process that dies
(as PID 1 or as child subreaper: orphans too), and enforces the teardown grace: the first child
to fail, or a terminating signal, sends SIGTERM to every process group below us, and whatever is
still alive after the grace period gets SIGKILL. It returns only when nothing it started lives.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.core.failure_policy import DEFAULT_GRACE_PERIOD
from launcher.core.outcome import COMMAND_NOT_FOUND, LauncherError, Reasons

if TYPE_CHECKING:
    from types import FrameType, ModuleType
    from typing import TypeAlias

    _Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_ONLY = (signal.SIGUSR1, signal.SIGUSR2)
TAIL_LINES = 50  # enough for mpirun's abort banner
MARKS = 32  # lines that show a fault or a peer's loss, kept for the judge (launcher.core.judge)
LINE_LIMIT = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class Interrupted(Exception):
    """A wait was cut short: a terminating signal arrived or a child exited."""


class SpawnError(LauncherError):
    """The command could not be started: 127 not found, 126 not executable (as a shell says)."""

    def __init__(self, message: str, exit_code: int = COMMAND_NOT_FOUND):
        super().__init__(message)
        self.reason = Reasons.COMMAND_NOT_FOUND if exit_code == COMMAND_NOT_FOUND else Reasons.NOT_EXECUTABLE


def set_child_subreaper() -> bool:
    """Become the reaper of orphaned descendants (what PID 1 is anyway)."""
    return os.getpid() == 1 or _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


@dataclass
class Child:
    name: str
    pid: int
    popen: subprocess.Popen
    returncode: int | None = None  # negative: killed by that signal
    exited_at: float | None = None
    after_teardown: bool = False  # exited after we began tearing the job down
    evidence: str | None = None  # first output line showing a node/network fault or a peer's loss
    marks: deque = field(default_factory=lambda: deque(maxlen=MARKS))  # every such line, the latest
    primary: bool = False  # its exit, success or not, ends the job (daemons like sshd are not)
    released: bool = False  # sent away before its go word: its leaving with 0 interrupts nothing
    # Started ahead for the job's next generation (a restart in place): no part of this one's job,
    # neither waited for, signalled nor torn down with it, until next_generation adopts it.
    standby: bool = False
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def exit_status(self) -> int:
        """``returncode`` of a child that has exited: what judging it reads."""
        if self.returncode is None:
            raise RuntimeError(f"{self.name} (pid {self.pid}) is judged before it exited")
        return self.returncode


class _Stream:
    """One output pipe of a child, relayed to our stdout or stderr line by line when a
    transform (e.g. a prefix) is set, else byte for byte."""

    def __init__(self, pipe, child: Child, target: int, transform, scan, redrawn):
        self.pipe, self.fd = pipe, pipe.fileno()
        self.child, self.target, self.transform, self.scan = child, target, transform, scan
        self.redrawn = redrawn
        self.partial = b""

    def redraw(self, segment: bytes) -> None:
        self.redrawn(self.child, segment.decode("utf-8", "replace").replace("\x00", ""))

    def feed(self, data: bytes, write) -> None:
        if self.transform is None:
            write(self.target, data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        body = self.partial.rstrip(b"\r")  # a trailing \r may be half of a \r\n
        if b"\r" in body:
            # A progress bar redraws its line with \r and ends it only when done: each redraw is
            # news for the line observers, and only the latest is the line.
            *redraws, latest = body.split(b"\r")
            self.partial = latest + self.partial[len(body) :]
            if redraws[-1]:
                self.redraw(redraws[-1])
        if len(self.partial) > LINE_LIMIT:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self._line(line, write)

    def end_line(self, write) -> None:
        """The pipe is closed, or the job is over: a last line without its newline is a line, and
        is ended here. A pod's log (the container runtime's) takes a line when its newline comes,
        else when the container exits: after our verdict, which we write next (on stderr)."""
        if self.partial:
            self._line(self.partial, write)
            if self.transform is None:
                write(self.target, b"\n")
            self.partial = b""

    def _line(self, line: bytes, write) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r").replace("\x00", "")
        self.scan(self.child, text)
        if self.transform is not None:
            write(self.target, self.transform(text).encode("utf-8", "replace") + b"\n")


class Supervisor:
    def __init__(self, grace_period: float = DEFAULT_GRACE_PERIOD, evidence: re.Pattern[str] | None = None):
        self.grace_period = grace_period
        self.evidence = evidence
        self.children: list[Child] = []
        self.exits: list[Child] = []  # in the order they exited
        self.first_failure: Child | None = None
        self.received_signal: int | None = None
        self.teardown_started: float | None = None
        self._killed = False
        self._by_pid: dict[int, Child] = {}
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._stdout_of: dict[int, _Stream] = {}  # by the child's pid, while its pipe is open
        self._watched: dict[int, Callable[[], None]] = {}
        self._closed_targets: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._saved: dict[int, _Handler] = {}
        self._psutil: ModuleType | None = None  # imported when the loop first serves
        self._saved_wakeup = -1
        # Watchers of the job (its monitor): each output line, and each turn of the loop.
        self.line_observers: list[Callable[[Child, str], None]] = []
        self.tickers: list[Callable[[], None]] = []

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Supervisor:
        set_child_subreaper()
        for sig in (*TERMINATING, *FORWARDED_ONLY, signal.SIGCHLD):
            self._saved[sig] = signal.signal(sig, _note_signal)
        self._saved_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc) -> None:
        if any(c.returncode is None for c in self.children):
            for child in self.children:
                child.standby = False  # nothing stands by any more
            self.kill_all()
            self.run()
        signal.set_wakeup_fd(self._saved_wakeup)
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        for stream in list(self._streams.values()):
            self._close_stream(stream)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
        transform: Callable[[str], str] | None = None,
        primary: bool = False,
        standby: bool = False,
    ) -> Child:
        """Start ``argv`` in its own process group, dying with us, its output relayed. When a
        ``primary`` child exits, everything else is torn down. A ``standby`` child waits for the
        job's next generation (:attr:`Child.standby`)."""
        parent = os.getpid()

        def in_child() -> None:
            # Runs between fork and exec: die with the launcher, even if it is SIGKILLed.
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(128 + signal.SIGKILL)

        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                process_group=0,
                preexec_fn=in_child,
            )
        except FileNotFoundError:
            raise SpawnError(f"{argv[0]}: command not found") from None
        except PermissionError:
            raise SpawnError(f"{argv[0]}: permission denied", 126) from None
        child = Child(name=name, pid=popen.pid, popen=popen, primary=primary, standby=standby)
        self.children.append(child)
        self._by_pid[popen.pid] = child
        for pipe, target in ((popen.stdout, 1), (popen.stderr, 2)):
            if pipe is None:  # both are asked for as pipes above
                raise RuntimeError(f"{name}: subprocess gave no pipe for its output")
            os.set_blocking(pipe.fileno(), False)
            stream = _Stream(pipe, child, target, transform, self._scan, self._observe)
            self._streams[stream.fd] = stream
            if target == 1:
                self._stdout_of[child.pid] = stream
            self._selector.register(stream.fd, selectors.EVENT_READ, stream)
        return child

    def next_generation(self) -> None:
        """Every child has exited: forget them, their failure and the teardown, so the job's
        processes can start again in place (launcher.core.lifecycle). A signal received stays."""
        if any(c.returncode is None and not c.standby for c in self.children):
            raise RuntimeError("a new generation starts while a child of the last one lives")
        self.children = [c for c in self.children if c.standby and c.returncode is None]
        self.exits = []
        self._by_pid = {c.pid: c for c in self.children}
        for child in self.children:
            child.standby = False  # adopted: this generation's now
        self.first_failure = None
        self.teardown_started = None
        self._killed = False

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` from the loop whenever ``fd`` is readable (until ``unwatch``)."""
        self._selector.register(fd, selectors.EVENT_READ, callback)
        self._watched[fd] = callback

    @staticmethod
    def release(child: Child) -> None:
        """``child`` was started ahead of the plan and is sent away (its go pipe closes unsaid): its
        exit with 0 interrupts no wait. A failure is still the job's."""
        child.released = True

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            self._selector.unregister(fd)

    def drain(self) -> None:
        """Relay (and scan) every line the children have written so far, without waiting."""
        for stream in list(self._streams.values()):
            while stream.fd in self._streams and self._read(stream):
                pass

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> list[Child]:
        """Serve until every child has exited and nothing below us lives; return the exits."""
        self._load_psutil()  # while the children run, not on the exit path
        while any(c.returncode is None and not c.standby for c in self.children):
            self.poll(self._timeout())
        if self._descendants():  # orphans: daemons a child left behind
            self.begin_teardown()
            while self._descendants():
                self.poll(self._timeout(0.05))
        drain_until = time.monotonic() + 1.0
        while self._open_streams() and time.monotonic() < drain_until:
            self.poll(0.05)
        for stream in self._open_streams():  # held open by an escaped process: the job is over
            stream.end_line(self._write)
        return self.exits

    def _open_streams(self) -> list[_Stream]:
        """The output pipes still open, but those of a standby child (it outlives the job's run)."""
        return [stream for stream in self._streams.values() if not stream.child.standby]

    def sleep(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Serve for ``seconds``, or until ``until()`` holds; raise Interrupted as soon as a signal
        stops the job or a child exits (one that was released may leave with 0)."""
        end = time.monotonic() + seconds
        while True:
            self.poll(max(0.0, min(end - time.monotonic(), 0.5)))
            if self.received_signal is not None or any(not (c.released and c.returncode == 0) for c in self.exits):
                raise Interrupted()
            if time.monotonic() >= end or (until is not None and until()):
                return

    def serve_during(self, work: Callable[[], Any], tick: Callable[[], None], every: float = 0.5) -> list:
        """Run ``work`` on a daemon thread while this one serves the loop (signals, the children's
        output, ``tick`` at least every ``every`` s). Back the moment ``work`` returns, with its
        result in a list, or at a terminating signal, with an empty one: the thread is left to die
        with the process. What ``work`` raises is raised here."""
        wake_r, wake_w = os.pipe()
        result: list = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                result.append(work())
            except BaseException as error:  # noqa: BLE001 - raised again in the serving thread
                failed.append(error)
            finally:
                with contextlib.suppress(OSError):  # the server left at a signal and closed its end
                    os.write(wake_w, b"\0")
                os.close(wake_w)

        ended = False

        def on_wake() -> None:
            nonlocal ended
            ended = True

        self.watch(wake_r, on_wake)
        try:
            threading.Thread(target=run, name="beside-the-loop", daemon=True).start()
            while not ended and self.received_signal is None:
                self.poll(every)
                tick()
        finally:
            self.unwatch(wake_r)
            os.close(wake_r)
        if failed:
            raise failed[0]
        return result

    def poll(self, timeout: float | None) -> None:
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_r:
                self._handle_signals()
            elif (callback := self._watched.get(key.fd)) is not None and callback is key.data:
                callback()
            elif (stream := self._streams.get(key.fd)) is not None and stream is key.data:
                self._read(stream)  # not closed by an earlier event of this batch
        self._reap()
        for tick in self.tickers:
            tick()
        if (
            self.teardown_started is not None
            and not self._killed
            and time.monotonic() >= self.teardown_started + self.grace_period
        ):
            self.kill_all()

    def _timeout(self, idle: float = 0.5) -> float:
        if self.teardown_started is not None and not self._killed:
            return max(0.0, min(idle, self.teardown_started + self.grace_period - time.monotonic()))
        return idle

    # --- signals -------------------------------------------------------------------------------

    def _handle_signals(self) -> None:
        try:
            received = os.read(self._wake_r, 512)
        except BlockingIOError:
            return
        for signum in received:
            if signum in TERMINATING:
                if self.received_signal == signal.SIGINT == signum:
                    self.kill_all()  # a second Ctrl-C: no more grace
                elif self.received_signal is None:
                    self.received_signal = signum
                self.forward(signum)
                self.begin_teardown(send=False)
            elif signum in FORWARDED_ONLY:
                self.forward(signum)

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every process group below us (ranks often run in their own)."""
        own = os.getpgrp()
        groups = {c.pid for c in self.children if c.returncode is None and not c.standby}
        for pid in self._descendants():
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(pid))
        for group in groups - {own}:
            with contextlib.suppress(OSError):
                os.killpg(group, signum)

    def begin_teardown(self, send: bool = True) -> None:
        if self.teardown_started is None:
            self.teardown_started = time.monotonic()
            if send:
                self.forward(signal.SIGTERM)

    def kill_all(self) -> None:
        """SIGKILL every process below us, group by group and one by one."""
        self._killed = True
        if self.teardown_started is None:
            self.teardown_started = time.monotonic()
        pids = self._descendants()
        self.forward(signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _load_psutil(self) -> ModuleType:
        """psutil (20 ms to import), once the children are started: a pod's start (an
        initializer's go word) does not wait for it."""
        if self._psutil is None:
            import psutil

            self._psutil = psutil
        return self._psutil

    def _descendants(self) -> list[int]:
        """Live processes below us (zombies excluded: the next reap takes them)."""
        psutil = self._load_psutil()
        try:
            found = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        spared = {c.pid for c in self.children if c.standby}
        while spared:  # a standby child's own children stand by too
            more = {p.pid for p in found if p.pid not in spared and _parent(p) in spared}
            if not more:
                break
            spared |= more
        alive = []
        for process in found:
            if process.pid in spared:
                continue
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process.pid)
            except psutil.Error:
                pass
        return alive

    # --- children ------------------------------------------------------------------------------

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self._by_pid.get(pid)
            if child is None:
                continue  # an orphan we inherited: reaped, nothing else to do
            child.returncode = os.waitstatus_to_exitcode(status)
            child.popen.returncode = child.returncode
            child.exited_at = time.monotonic()
            if child.standby:
                continue  # not this generation's: the next one finds it gone and starts another
            child.after_teardown = self.teardown_started is not None
            self.exits.append(child)
            if child.returncode != 0 and self.first_failure is None and not child.after_teardown:
                self.first_failure = child
                self.begin_teardown()
            elif child.primary:
                self.begin_teardown()

    def _scan(self, child: Child, text: str) -> None:
        child.tail.append(text[:500])
        if self.evidence is not None and self.evidence.search(text):
            child.marks.append(text.strip()[:500])
            if child.evidence is None:
                child.evidence = child.marks[-1]
        self._observe(child, text)

    def _observe(self, child: Child, text: str) -> None:
        for observe in self.line_observers:
            observe(child, text)

    def _read(self, stream: _Stream) -> bool:
        """Relay what one pipe holds; False once it is empty for now or closed. A child's stdout is
        relayed before its stderr: what it wrote there first (a rank's line, then a nested
        launcher's verdict) is in the pipe by now, and one read takes all a pipe holds."""
        if stream.target == 2 and (out := self._stdout_of.get(stream.child.pid)) is not None:
            self._read(out)
        try:
            data = os.read(stream.fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            stream.feed(data, self._write)
            return True
        self._close_stream(stream)
        return False

    def _close_stream(self, stream: _Stream) -> None:
        stream.end_line(self._write)
        if self._stdout_of.get(stream.child.pid) is stream:
            del self._stdout_of[stream.child.pid]
        self._selector.unregister(stream.fd)
        del self._streams[stream.fd]
        stream.pipe.close()

    def _write(self, target: int, data: bytes) -> None:
        if target in self._closed_targets:
            return
        view = memoryview(data)
        while view:
            try:
                written = os.write(target, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except OSError as error:
                if error.errno in (errno.EPIPE, errno.EBADF):
                    self._closed_targets.add(target)
                    return
                raise
            view = view[written:]


def _parent(process) -> int | None:
    try:
        return process.ppid()
    except Exception:  # noqa: BLE001 - psutil.Error: gone meanwhile
        return None


def _note_signal(signum, frame) -> None:
    """The signal's number reaches the loop through the wakeup fd; nothing to do here."""
