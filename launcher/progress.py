"""Report training progress to the launcher from inside a rank.

    from launcher import progress
    progress.report(step=step, total=max_steps, loss=loss, lr=lr)

Each call sends one datagram to the launcher's socket (``LAUNCHER_PROGRESS_SOCKET``, which the
launcher sets for the ranks it starts). A call never blocks and never raises: when the launcher
is not listening, its queue is full or the variable is unset, the report is dropped. That is the
point: progress is advisory, training is not.

Standard library only, and imported lazily: importing this module costs nothing measurable, so
it can sit in any training script, launched by us or not. This module reads the environment
itself (unlike the launcher's own code, which goes through settings.py) because it runs in the
user's process, where none of the launcher is loaded.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing's own meaning, without importing typing into the user's program
if TYPE_CHECKING:
    from collections.abc import Callable

SOCKET_ENV = "LAUNCHER_PROGRESS_SOCKET"
# Where a launcher-less program finds its global rank: the variable its framework's own launcher
# sets (torchrun, each implementation's mpirun, the coordinator's environment), first found wins.
_RANK_ENVS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID")
# Bounds on one datagram, well under the AF_UNIX datagram limit; the launcher bounds again.
_MAX_METRICS = 256
_MAX_TEXT = 256
# After a failed connect, wait this long before the next try: a loop of thousands of steps a
# second must not pay a connect() on every call while the launcher is away.
_RETRY_AFTER = 1.0

# (pid, path, socket or None, rank, monotonic time before which not to reconnect).
# One tuple, replaced whole: a forked child sees a foreign pid and starts afresh, and threads
# racing on it at worst make one extra socket.
_state: tuple | None = None
_GONE: frozenset[int] | None = None  # errno values that mean the launcher's socket is gone
# json's encoder, time.time and time.monotonic, once needed
_encode: Callable[[object], str] | None = None
_clock: Callable[[], float] | None = None
_monotonic: Callable[[], float] | None = None


def report(step: int | None = None, total: int | None = None, **metrics) -> None:
    """Send ``step`` of ``total`` and the metrics to the launcher; drop them on any problem."""
    try:
        path = os.environ.get(SOCKET_ENV)
        if not path:
            return
        _send(path, _datagram(step, total, metrics))
    except Exception:  # noqa: BLE001 - a progress report must never break training
        pass


def _datagram(step, total, metrics: dict) -> bytes:
    global _encode, _clock
    if _encode is None:
        import json
        import time

        # one encoder for every call: json.dumps with options builds a new one each time
        _encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
        _clock = time.time
    values: dict[str, int | float | str] = {}
    for name, value in metrics.items():
        if len(values) >= _MAX_METRICS:
            break
        text = _value(value)
        if text is not None:
            values[str(name)[:_MAX_TEXT]] = text
    if _encode is None or _clock is None:  # set together just above
        raise RuntimeError("progress: the encoder is not set")
    message = {"rank": _rank(), "step": _count(step), "total": _count(total), "metrics": values, "time": _clock()}
    return _encode(message).encode("utf-8", "replace")


def _count(value) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)  # also a 0-d tensor or numpy integer
    except (TypeError, ValueError, OverflowError):
        return None


def _value(value) -> int | float | str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # JSON has no NaN or infinity; the text keeps what the user would want to see
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, str):
        return value[:_MAX_TEXT]
    try:
        number = float(value)  # a 0-d tensor or numpy scalar, without importing either
    except (TypeError, ValueError, OverflowError):
        return str(value)[:_MAX_TEXT]
    return _value(number)


def _rank() -> int | None:
    state = _state
    if state is not None and state[0] == os.getpid():
        return state[3]
    return _rank_from_env()


def _rank_from_env() -> int | None:
    for name in _RANK_ENVS:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def _send(path: str, data: bytes) -> None:
    global _state
    state = _state
    if state is None or state[2] is None or state[0] != os.getpid() or state[1] != path:
        state = _connect(path, state)
        if state is None:
            return
    try:
        state[2].send(data)
    except OSError as error:
        if _GONE is None or _monotonic is None:  # set by _connect before it made any state
            return
        if error.errno in _GONE:
            # the launcher went away or was replaced: connect again on a later call
            state[2].close()
            _state = (state[0], path, None, state[3], _monotonic() + _RETRY_AFTER)
        # else a full queue (EAGAIN) or an oversized report: this one is dropped, the socket is fine


def _connect(path: str, state: tuple | None) -> tuple | None:
    """A connected state for this process, or None while a failed connect is recent."""
    global _state, _GONE, _monotonic
    import errno
    import socket
    import time

    if _GONE is None:
        _GONE = frozenset(
            (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET, errno.EBADF)
        )
        _monotonic = time.monotonic
    pid = os.getpid()
    if state is None or state[0] != pid or state[1] != path:
        # a fresh process, or a forked child: the inherited socket is its parent's business
        state = (pid, path, None, _rank_from_env(), 0.0)
    if time.monotonic() < state[4]:
        _state = state
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        _state = (pid, path, None, state[3], time.monotonic() + _RETRY_AFTER)
        return None
    _state = state = (pid, path, sock, state[3], 0.0)
    return state
