"""The launcher's two records: the one **report** a process in the user's interpreter gives its
launcher, and the one **stop record** the pods of a job share when it fails.

A report says how one process ended: a rank, a framework's process or worker, or an agent that
runs a node's ranks. It is written once, complete or not at all: a file renamed into place
(:func:`write`), or one JSON line over a socket where the ranks run on other hosts. Its
``ending`` is one of :data:`ENDINGS`:

``succeeded``
    the program finished (where a process reports a success at all: an agent does);
``failed``
    the program failed on its own account: ``exitCode`` or ``signal``, ``error`` (the exception
    in a line), ``at`` (when, in seconds since the epoch, where known);
``peerLost``
    it failed because a peer went away: ``error`` is what it said of it, ``peer`` the address of
    the peer it lost where it knows it;
``stopped``
    a peer's stop record ended it: ``stoppedBy`` holds that record, which names the root cause;
``refused``
    the runner refused before the program ran: ``reason`` is the table's word
    (UnsupportedVersion, ConfigError, RendezvousFailed) and ``error`` the one line;
``crashed``
    the runner's own bug, not the program's: ``error`` and ``where`` (launcher/core/crash.py).

Every report may name ``rank``, ``localRank`` and ``node``. A process that runs several (an
agent, for its node's ranks) lists in ``ranks`` a report of each rank that failed, and
names the one that failed first in its own ``rank``. A report of a process that failed on its
own may still carry ``stoppedBy``: another pod's record won the job's root cause meanwhile.

A stop record is what the first pod to fail for good tells the others: ``generation`` (which
start of the job it ends: a restart in place begins the next one, and the records of an earlier
one are stale), ``node`` and ``nodeRank``, the ``rank`` that failed first with its
``localRank``, ``exitCode`` or ``signal``, ``error``, and ``outcome`` (that pod's judged outcome,
where a framework shares it). One record wins per generation: the first written (:func:`claim`).
Each framework carries it over what its pods already share (:class:`Transport`): a rendezvous or
coordination store, a stop board, or the rank reports themselves (docs/architecture.md).

Stdlib only and Python 3.10 syntax: it runs in the user's interpreter, loaded by path beside
program.py (``program.load_sibling``), and in the launcher as ``launcher.runner.report``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Protocol

ENDINGS = ("succeeded", "failed", "peerLost", "stopped", "refused", "crashed")
STOP_PREFIX = "trainer-launcher/stop/"
TEXT_LIMIT = 1000  # characters of an error in a record
_REPORT_FIELDS = ("rank", "localRank", "node", "exitCode", "signal", "at", "error", "where", "reason", "peer")
RANKS_LIMIT = 4096  # the ranks' reports one process may list (a node's)


# --- the report --------------------------------------------------------------------------------


def report(ending: str, exit_code: int | None = None, **fields: object) -> dict:
    """A report as JSON: ``ending``, ``exitCode`` and the fields named in the module docstring
    (``local_rank`` and ``stopped_by`` in Python's spelling). Fields that are None are left out."""
    if ending not in ENDINGS:
        raise ValueError(f"ending {ending!r}: expected one of {', '.join(ENDINGS)}")
    names = {"local_rank": "localRank", "stopped_by": "stoppedBy"}
    error = fields.get("error")
    if isinstance(error, str):
        fields["error"] = _cut(error)
    record: dict = {"ending": ending, "exitCode": exit_code}
    for name, value in fields.items():
        record[names.get(name, name)] = value
    return {key: value for key, value in record.items() if value is not None}


def write(path: str | None, record: dict) -> bool:
    """Write ``record`` to ``path`` for the launcher: complete or absent, never half (written
    beside it, then renamed). False when it could not be written (or there is no path): the
    launcher then judges from the exit status alone."""
    if not path:
        return False
    try:
        with open(f"{path}.tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(f"{path}.tmp", path)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Report:
    """A report as the launcher reads it: every field checked, anything malformed dropped."""

    ending: str
    exit_code: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    node: str | None = None
    signal: str | None = None
    at: float | None = None
    error: str | None = None
    where: str | None = None
    reason: str | None = None
    peer: str | None = None
    stopped_by: StopRecord | None = None
    ranks: tuple[Report, ...] = ()

    @property
    def returncode(self) -> int | None:
        """The exit code, or minus the signal's number, as Popen gives them."""
        return _returncode(self.exit_code, self.signal)

    def rank_report(self, rank: int | None) -> Report | None:
        """The report in ``ranks`` of ``rank``."""
        return next((each for each in self.ranks if each.rank == rank), None)

    @classmethod
    def parse(cls, data: object) -> Report | None:
        """The report in ``data`` (decoded JSON), or None where it is not one."""
        if not isinstance(data, dict) or data.get("ending") not in ENDINGS:
            return None
        fields = {name: _checked(name, data.get(name)) for name in _REPORT_FIELDS}
        ranks = data["ranks"] if isinstance(data.get("ranks"), list) else []
        parsed = (cls.parse(each) for each in ranks[:RANKS_LIMIT] if isinstance(each, dict) and "ranks" not in each)
        return cls(
            ending=data["ending"],
            exit_code=fields["exitCode"],
            rank=fields["rank"],
            local_rank=fields["localRank"],
            node=fields["node"],
            signal=fields["signal"],
            at=fields["at"],
            error=fields["error"],
            where=fields["where"],
            reason=fields["reason"],
            peer=fields["peer"],
            stopped_by=StopRecord.parse(data.get("stoppedBy")),
            ranks=tuple(each for each in parsed if each is not None),
        )

    @classmethod
    def read(cls, path: str | None) -> Report | None:
        """The report at ``path``: None where there is none (never written, or not a report)."""
        if not path:
            return None
        try:
            with open(path) as handle:
                return cls.parse(json.load(handle))
        except (OSError, ValueError):
            return None


# --- the stop record ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StopRecord:
    """The job's one stop record of a generation (module docstring)."""

    generation: int
    node: str | None = None
    node_rank: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    outcome: dict | None = None

    @property
    def returncode(self) -> int | None:
        """The failed rank's exit code, or minus its signal's number, as Popen gives them."""
        return _returncode(self.exit_code, self.signal)

    def to_json(self) -> dict:
        record = {
            "generation": self.generation,
            "node": self.node,
            "nodeRank": self.node_rank,
            "rank": self.rank,
            "localRank": self.local_rank,
            "exitCode": self.exit_code,
            "signal": self.signal,
            "error": _cut(self.error),
            "outcome": self.outcome,
        }
        return {key: value for key, value in record.items() if value is not None}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def parse(cls, data: object) -> StopRecord | None:
        """The record in ``data`` (decoded JSON, or its text), or None where it is not one."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError:
                return None
        if not isinstance(data, dict) or _int(data.get("generation")) is None:
            return None
        outcome = data.get("outcome")
        return cls(
            generation=data["generation"],
            node=_checked("node", data.get("node")),
            node_rank=_int(data.get("nodeRank")),
            rank=_int(data.get("rank")),
            local_rank=_int(data.get("localRank")),
            exit_code=_checked("exitCode", data.get("exitCode")),
            signal=_checked("signal", data.get("signal")),
            error=_checked("error", data.get("error")),
            outcome=outcome if isinstance(outcome, dict) else None,
        )


class Transport(Protocol):
    """What the pods of a job share, able to keep the first value set under a key."""

    def claim(self, key: str, value: str) -> str:
        """Set ``key`` to ``value`` unless it is set already; the value it holds afterwards."""
        ...


def stop_key(generation: int) -> str:
    """Where a generation's stop record lives, for transports with keys."""
    return f"{STOP_PREFIX}{generation}"


def claim(transport: Transport, record: StopRecord) -> tuple[bool, StopRecord]:
    """Publish ``record`` unless its generation has one: (whether ours won, the one that did).
    A value there that is not a record of its generation (a stranger's, a torn write, an earlier
    generation's) leaves ours standing."""
    mine = record.dumps()
    held = transport.claim(stop_key(record.generation), mine)
    if held == mine:
        return True, record
    winner = StopRecord.parse(held)
    return (False, winner) if winner is not None and winner.generation == record.generation else (True, record)


# --- fields ---------------------------------------------------------------------------------------


def _int(value: object) -> int | None:
    return value if type(value) is int else None  # type(): a JSON true is no number


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."


def _returncode(exit_code: int | None, signal_name: str | None) -> int | None:
    if exit_code is not None:
        return exit_code
    if not signal_name:
        return None
    import signal

    try:
        return -int(signal.Signals[signal_name])
    except KeyError:
        return None


def _checked(name: str, value: object):
    """A field's value where it has its type (an exit code 0-255; text, cut), else None."""
    if name in ("rank", "localRank"):
        return _int(value)
    if name == "at":
        return value if type(value) in (int, float) else None
    if name == "exitCode":
        number = _int(value)
        return number if number is not None and 0 <= number <= 255 else None
    return _cut(value) if isinstance(value, str) and value else None
