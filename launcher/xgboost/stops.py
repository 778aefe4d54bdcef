"""What one XGBoost pod tells the others: the job's one stop record (launcher/runner/report.py),
through pod 0's board (launcher/xgboost/board.py). A pod whose worker or tracker failed on its own
posts a record of its outcome; every other pod stops its workers and reports that outcome, naming
the same worker (PeerFailed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.runner.report import StopRecord
from launcher.xgboost import board as board_module

if TYPE_CHECKING:
    from launcher.core.outcome import Outcome
    from launcher.core.supervisor import Supervisor
    from launcher.xgboost.plan import XGBoostPlan

# A pod whose workers only lost a peer: how long it waits for the board to name the root cause.
PEER_WAIT = 2.0
SERVE_STEP = 0.2
# The start of the job a stop record ends: 0, then each restart in place passes its own to Stops,
# whose board (on that generation's port) takes only that generation's records.
FIRST_GENERATION = 0


def stop_record(outcome: Outcome, codes: frozenset[int], node: str, pod_index: int, generation: int) -> StopRecord:
    """The stop record of a pod's failure: its index and node, the worker that failed (from the
    outcome's root cause) with its error, and the outcome as the other pods will report it."""
    root = outcome.root_cause
    error = outcome.extra.get("error")
    return StopRecord(
        generation=generation,
        node=(root.node if root is not None else None) or node,
        node_rank=pod_index,
        rank=root.rank if root is not None else None,
        local_rank=root.local_rank if root is not None else None,
        exit_code=root.exit_code if root is not None else None,
        signal=root.signal if root is not None else None,
        error=error if isinstance(error, str) else None,
        outcome=outcome.to_json(codes),
    )


class Stops:
    """This pod's side of the board: pod 0 holds it, the others are its clients."""

    def __init__(
        self, supervisor: Supervisor, plan: XGBoostPlan, codes: frozenset[int], generation: int = FIRST_GENERATION
    ):
        self.supervisor, self.plan, self.codes, self.generation = supervisor, plan, codes, generation
        self.board: board_module.Board | None = None  # pod 0
        self.client: board_module.BoardClient | None = None  # every other pod
        self.posted = False  # this pod's failure went to the board
        self.adopted: StopRecord | None = None  # another pod's stop record
        self.pod_0_lost = False

    @property
    def port(self) -> int:
        return self.plan.tracker_port + board_module.PORT_OFFSET

    def open(self) -> None:
        """Pod 0: the board, before the tracker starts."""
        from launcher.core import log

        if self.plan.pod_index != 0:
            return
        peers = board_module.peer_policy(self.plan.tracker_host, self.plan.pods)
        try:
            self.board = board_module.Board(
                self.port,
                ":" in self.plan.tracker_host,
                self.supervisor.watch,
                self.supervisor.unwatch,
                self._on_record,
                self.plan.pods,
                peers,
                generation=self.generation,
            )
        except (OSError, OverflowError) as error:
            log.warning(
                f"xgboost: no stop board on port {self.port} ({getattr(error, 'strerror', None) or error}): "
                "a failure elsewhere reaches this pod only through xgboost's own collective"
            )
            return
        if peers.kind == "anyone":
            log.warning(
                f"xgboost: DMLC_TRACKER_URI={self.plan.tracker_host} is not the controller's "
                "<trainjob>-node-0-0.<trainjob>, so the stop board cannot tell the pods' addresses from "
                f"others': it takes a well-formed stop record from any peer that reaches port {self.port}"
            )

    def join(self) -> None:
        """Every other pod, once pod 0's tracker is up: a client of its board."""
        from launcher.core import log

        if self.plan.pod_index == 0:
            return
        try:
            self.client = board_module.BoardClient(
                self.plan.tracker_host,
                self.port,
                self.supervisor.watch,
                self.supervisor.unwatch,
                self._on_record,
                self._on_lost,
                self.plan.pods,
                generation=self.generation,
            )
        except (OSError, OverflowError) as error:
            log.warning(
                f"xgboost: pod 0's stop board at {self.plan.tracker_host}:{self.port} is out of reach "
                f"({getattr(error, 'strerror', None) or error}): a failure elsewhere reaches this pod "
                "only through xgboost's own collective"
            )

    def close(self) -> None:
        for side in (self.board, self.client):
            if side is not None:
                side.close()

    def _on_record(self, record: StopRecord) -> None:
        if record.node_rank != self.plan.pod_index and self.adopted is None:
            self.adopted = record
            self.supervisor.begin_teardown()

    def _on_lost(self) -> None:
        if any(c.returncode is None for c in self.supervisor.children) and not self.posted:
            self.pod_0_lost = True
            self.supervisor.begin_teardown()

    def post(self, outcome: Outcome) -> None:
        """Tell the board this pod's failure, once: not a success, nor a worker that only lost a
        peer, nor a stop this pod was told of."""
        from launcher.core.outcome import Reasons

        if self.posted or self.adopted is not None:
            return
        if outcome.exit_code == 0 or outcome.reason in (Reasons.PEER_LOST, Reasons.TERMINATED):
            return
        record = stop_record(outcome, self.codes, self.plan.node, self.plan.pod_index, self.generation)
        self.posted = True
        if self.board is not None:
            self.board.post(record)
        elif self.client is not None:
            self.client.post(record)

    def settle(self, own: Outcome) -> Outcome:
        """The job's outcome as this pod reports it: its own, or the stop record it adopted, or
        pod 0 gone without a word. Pod 0 keeps the board up for the others to read a failure."""
        from launcher.core.job_outcome import lost, lost_member, stopped_by
        from launcher.core.outcome import Outcome, Reasons

        node = self.plan.node
        if (board := self.board) is not None:
            if own.exit_code == 0 and self.adopted is None:
                board.finish()
            else:  # the others read the record before this pod, and its board, go away
                self._serve_for(board_module.LINGER, lambda: board.clients == 0)
        elif self.client is not None and own.reason == Reasons.PEER_LOST and self.adopted is None:
            self._serve_for(PEER_WAIT, lambda: self.adopted is not None or self.pod_0_lost)
        adopted = self.adopted
        if adopted is not None and adopted.outcome is not None:  # board.check_record vouched for it
            root = Outcome.from_json(adopted.outcome)  # and for its pod's address
            return stopped_by(replace(root, message=f"{root.message} (reported by pod {adopted.node_rank})"), node)
        index = self.plan.pod_index
        if self.pod_0_lost or own.reason == Reasons.PEER_LOST:
            gone = lost_member(index, self.plan.pods, self.pod_0_lost)
            if gone is not None:  # pod 0 runs the tracker and the board: its loss ends the job
                return lost(own, node, index, [gone])
        return own

    def _serve_for(self, seconds: float, done: Callable[[], bool]) -> None:
        end = time.monotonic() + seconds
        while not done() and time.monotonic() < end:
            self.supervisor.poll(min(SERVE_STEP, max(0.0, end - time.monotonic())))
