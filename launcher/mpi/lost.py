"""A worker pod lost under mpirun: its node gone, its container killed whole, the pod deleted.

Its ranks cannot report (their watchers went with them), and each MPI ends in words of its own,
none of them the truth: Open MPI 5's mpirun exits 0, as if the job had succeeded; Open MPI 4's
205 and MPICH's 255 read as permanent failures. Only Intel MPI's 137 happened to be retryable.
The evidence is in the launcher pod's own output, said by those who saw the pod go: ssh (its
session to the worker closed by the remote host, or the server silent past its keepalives), Open
MPI's runtime (it lost its daemon on the worker's node), MPICH's mpiexec (a proxy's control
connection closed under it). A lost pod is ``PeerLost``: retryable, and with restarts left mpirun
starts again once the replacement's sshd serves.
"""

from __future__ import annotations

import ipaddress
import re

from launcher.core import lifecycle, netwait
from launcher.core.outcome import Outcome, RootCause
from launcher.core.reasons import Reasons
from launcher.core.supervisor import Child

# Lines that say a worker pod went away, and the name of its host where they give one.
_LOST = (
    re.compile(r"Connection to (?P<host>\S+?) closed by remote host"),  # ssh
    re.compile(r"Timeout, server (?P<host>\S+) not responding"),  # ssh, ServerAliveInterval spent
    # Open MPI 4 (ORTE) and 5 (PRTE): the banner's first line, then "Remote daemon: [...] on node h".
    re.compile(r"(?:ORTE|PRTE) has lost communication with a remote daemon"),
    re.compile(r"Remote daemon: *\S+ on node (?P<host>\S+)"),
    # MPICH's hydra: a proxy's control socket closed while the job ran.
    re.compile(r"control_cb \(.*\): assert \(!closed\) failed"),
)


class LostWorkers:
    """Watches mpirun's output (a line observer of the supervisor) for a worker pod's loss: the
    first such line, and the first host any names."""

    def __init__(self, child: Child):
        self.child = child
        self.line: str | None = None
        self.host: str | None = None

    def __call__(self, child: Child, text: str) -> None:
        if child is not self.child or (self.line is not None and self.host is not None):
            return
        for pattern in _LOST:
            if match := pattern.search(text):
                self.line = self.line or text.strip()[:500]
                if self.host is None and match.groupdict().get("host"):
                    self.host = _pod(match["host"])
                return

    def name_gone(self, hosts: tuple[str, ...], port: int) -> None:
        """Where the output named no host (MPICH's mpiexec may exit before ssh says which), the first
        worker whose sshd does not answer now: the lost pod, unless its replacement already serves."""
        if self.line is None or self.host is not None:
            return
        for host in hosts:
            try:
                netwait.knock(host, port, 1.0)
            except (OSError, UnicodeError):
                self.host = _pod(host)
                return

    def outcome(self, what: str) -> Outcome | None:
        """``PeerLost``, naming the lost pod where the output did; None when nothing was lost."""
        if self.line is None:
            return None
        who = f"the worker pod {self.host}" if self.host else "a worker pod (mpirun's output does not say which)"
        return Outcome.of(
            Reasons.PEER_LOST,
            f"{what} lost {who}: its node, container or pod went away while the job ran",
            RootCause(node=self.host),
            self.line,
        )


def pod_lost_before(life: lifecycle.Life) -> str | None:
    """The worker pod the last start lost (\"\" when its name is unknown); None when it lost none."""
    last = life.history[-1] if life.generation and life.history else None
    if last is None or last.reason != Reasons.PEER_LOST:
        return None
    return last.root_cause.node or "" if last.root_cause is not None else ""


def not_back(pod: str, timeout: float, waited: str) -> Outcome:
    """``PeerLost``: the lost pod's replacement never served within the rejoin timeout."""
    who = f"the worker pod {pod}" if pod else "the lost worker pod"
    return Outcome.of(
        Reasons.PEER_LOST,
        f"{who} did not come back to rejoin the job within {timeout:g}s (LAUNCHER_REJOIN_TIMEOUT): {waited}",
        RootCause(node=pod or None),
    )


def _pod(host: str) -> str:
    """The pod's name, as its hostname and the ranks' reports say it: the DNS name's first label."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host.split(".")[0]
    return host
