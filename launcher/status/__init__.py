"""Job status for the TrainJob: progress and metrics to the Trainer status server, hang detection."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.core.lifecycle import Life
    from launcher.status.monitor import Monitor


def start_watch(life: Life) -> Monitor | None:
    """The pod's status watch, for the lifecycle (launcher.core.lifecycle.StartWatch). Imported
    only once the job runs: the monitor's modules stay off the launcher's start path."""
    from launcher.status.monitor import start

    planned = life.planned
    if planned is None:  # the lifecycle starts the watch once the pod is planned
        raise RuntimeError("the status watch is started before the pod's plan is made")
    return start(life.launcher, life.supervisor, node=planned.node, sends=planned.sends, **planned.watch)
