"""One outcome for a multi-node job, from each node's own. Pure.

Every node of a failed job should say the same thing: which node and rank failed first, with that
failure's exit code, so the exit codes Kubernetes sees (and so the failure policy, and the
retryable flag) agree across pods. A node's ranks that died only because a peer vanished
("Connection closed by peer") did not fail first, even when they died a moment earlier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.core.outcome import PEER_LOSS_PATTERN, Outcome, Reasons, stopped_by

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
            bool(PEER_LOSS_PATTERN.search((n.outcome.evidence if n.outcome else None) or "")),
            math.inf if n.failed_at is None else n.failed_at,
            n.node_rank,
        ),
    )


def job_outcome(own: Outcome, node_rank: int, node: str, nodes: list[NodeOutcome]) -> Outcome:
    """This node's final outcome: its own if it failed first (or nobody did), else the root's."""
    root = root_cause(nodes)
    if root is None or root.node_rank == node_rank or root.outcome is None:  # the root has an outcome
        return own
    return stopped_by(root.outcome, node)
