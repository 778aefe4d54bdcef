"""One outcome for a multi-node job, from each node's own. Pure.

Every node of a failed job should say the same thing: which node and rank failed first, with that
failure's exit code, so the exit codes Kubernetes sees (and so the failure policy, and the
retryable flag) agree across pods. A node's ranks that died only because a peer vanished
("Connection closed by peer") did not fail first, even when they died a moment earlier.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core.judge import peer_loss
from launcher.core.outcome import Outcome, Reasons, RootCause, stopped_by

# Outcomes that never make a node the root cause: it stopped because of another, or was told to.
SECONDARY_REASONS = (Reasons.PEER_FAILED, Reasons.TERMINATED)


@dataclass(frozen=True)
class NodeOutcome:
    node_rank: int
    node: str
    outcome: Outcome | None  # None: the node never said
    failed_at: float | None = None  # when its own ranks failed, on one clock shared by the nodes


def root_cause(nodes: list[NodeOutcome]) -> NodeOutcome | None:
    """The node that failed on its own first, or None if none did."""
    failed = [
        n
        for n in nodes
        if n.outcome is not None and n.outcome.exit_code != 0 and n.outcome.reason not in SECONDARY_REASONS
    ]
    if not failed:
        return None
    return min(
        failed,
        key=lambda n: (
            n.outcome is not None and peer_loss(n.outcome),
            math.inf if n.failed_at is None else n.failed_at,
            n.node_rank,
        ),
    )


def job_outcome(
    own: Outcome,
    node_rank: int,
    node: str,
    nodes: list[NodeOutcome],
    nnodes: int | None = None,
    outlived: Callable[[], Outcome] | None = None,
) -> Outcome:
    """This node's final outcome: its own if it failed first (or nobody did), else the root's.

    When this node's ranks stopped because a peer went away (``own`` is a peer's loss) and no other
    node failed on its own: a node of the ``nnodes`` that never said how its ranks ended is that
    peer, a lost pod; where every node said and none lost a peer itself, no peer vanished, and
    ``outlived()`` judges this node again knowing that (its ranks outlived peers that had ended)."""
    root = root_cause(nodes)
    if peer_loss(own) and nnodes is not None and (root is None or root.outcome is None or peer_loss(root.outcome)):
        said = {n.node_rank: n.outcome for n in nodes if n.outcome is not None}
        silent = sorted(set(range(nnodes)) - set(said) - {node_rank})
        if silent and (len(silent) == 1 or len(said) > 1):  # none said, of several: the store is gone
            return lost(own, node, node_rank, silent)
        if outlived is not None and not any(peer_loss(o) for rank, o in said.items() if rank != node_rank):
            return outlived()
    if root is None or root.node_rank == node_rank or root.outcome is None:  # the root has an outcome
        return own
    return stopped_by(root.outcome, node)


def lost(own: Outcome, node: str, node_rank: int, silent: list[int]) -> Outcome:
    """``own`` stopped because a peer went away, and these nodes never said how their ranks
    ended: they are gone (a deleted, evicted or preempted pod, a lost machine)."""
    names = [peer_name(node, node_rank, rank) for rank in silent]
    which = ", ".join(names)
    return Outcome.of(
        Reasons.PEER_LOST,
        f"{which} went away without a word (its pod was lost: deleted, evicted, preempted, or its "
        f"machine failed); {node} stopped its ranks",
        RootCause(node=names[0]),
        own.evidence,
        own.extra,
    )


def lost_member(index: int, members: int, host_gone: bool) -> int | None:
    """Which member of a job went away, as one that lost a peer can tell on its own: the host of
    what the members share (member 0: the store, the coordinator, the board) when that is gone,
    else the other one of two. None where it cannot tell."""
    if host_gone and index != 0:
        return 0
    return 1 - index if members == 2 else None


def peer_name(node: str, node_rank: int, rank: int) -> str:
    """Another node's pod name, where this one's ends in its node rank (a JobSet pod's hostname,
    ``<job>-node-0-<index>``); else "pod <index>" (a node's rank is its pod's index)."""
    suffix = f"-{node_rank}"
    return f"{node[: -len(suffix)]}-{rank}" if node.endswith(suffix) else f"pod {rank}"
