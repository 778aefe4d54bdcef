"""``trainer-launcher init dataset|model``: STORAGE_URI -> the target directory, then an outcome.

The pod's life is core's (launcher/core/lifecycle.py): this launcher starts the download's process
first (launcher.initializers.fetch: it imports while this one loads its settings), validates, takes
the target's lease (waiting for another initializer that holds it), then gives the download its
go word. The download is supervised like any framework's process: a SIGTERM reaches it at once
and leaves its partial files to be resumed, nothing half-written under a final name; a lease lost
to another node (this one looked dead) stops it the same way, so that only one writes. Either way
this launcher releases what it holds and delivers the outcome; the download hands its own over
(exit code, message).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING

from launcher.core import lifecycle
from launcher.core.exec_job import CommandPod, handoff, node_name

if TYPE_CHECKING:  # pydantic: loaded after the download's process has started
    from launcher.core.outcome import LauncherError, Outcome
    from launcher.core.settings import Override
    from launcher.core.supervisor import Child
    from launcher.initializers import lease

TARGETS = {"dataset": "/workspace/dataset", "model": "/workspace/model"}
FETCH = "launcher.initializers.fetch"  # the download's module


def run_init(kind: str, launcher_overrides: dict[str, Override], init_overrides: dict[str, Override]) -> int:
    return lifecycle.live(InitPod(kind, init_overrides), launcher_overrides)


class InitPod(CommandPod):
    """Start the download, validate, take the target's lease, give the download its go word."""

    name = "init"

    def __init__(self, kind: str, init_overrides: dict[str, Override]):
        super().__init__([sys.executable, "-m", FETCH])
        self.kind, self.init_overrides = kind, init_overrides
        self.lease: lease.Lease | None = None
        self.lost: str | None = None  # why the lease was lost, from its heartbeat thread
        self.fetch_go: lifecycle.GoPipe | None = None
        self.early: Child | None = None  # the download's process, until its go word

    def start_early(self, life: lifecycle.Life) -> None:
        self.fetch_go = go = life.go_pipe()
        self.command = [sys.executable, "-m", FETCH, "--go-fd", str(go.child_fd)]
        self.early = life.spawn("fetch", self.command, pipes=(go,))

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        from launcher.core import settings
        from launcher.core.outcome import ConfigError
        from launcher.initializers.order import Order
        from launcher.initializers.settings import InitSettings
        from launcher.initializers.uri import parse_storage_uri

        self.init = init = settings.load(InitSettings, self.init_overrides)
        if not init.storage_uri:
            raise ConfigError(
                "STORAGE_URI",
                None,
                "where to download from: hf://OWNER/NAME, s3://BUCKET/PREFIX, file:///PATH or https://HOST/FILE",
            )
        self.uri = parse_storage_uri(init.storage_uri)
        self.target = os.path.abspath(init.output_path or TARGETS[self.kind])
        self.order = Order.of(init, self.kind, self.target)
        return lifecycle.Planned(None, node_name(), "")

    def check_workspace(self, life: lifecycle.Life) -> None:
        from launcher.core import workspace

        workspace.warn_if_unwritable(self.target)

    def wait(self, life: lifecycle.Life) -> None:
        """The target's lease: one writer at a time (a second one then finds the files complete)."""
        from launcher.core import log
        from launcher.initializers import lease
        from launcher.initializers.errors import LocalIOError

        self.life, said = life, life.listen(self._lease_lost)
        self.tell_lost = said.child_fd  # the heartbeat thread writes why, the loop reads it
        try:
            os.makedirs(self.target, exist_ok=True)
            self.lease = lease.acquire(
                self.target,
                self.init.lease_ttl,
                self.init.lease_wait,
                log.info,
                self._on_lost,
                sleep=life.supervisor.sleep,
            )
        except OSError as error:
            raise LocalIOError(error, self.target) from None
        life.closing(self.lease.release)

    def wait_failed(self, life: lifecycle.Life, error: LauncherError) -> Outcome:
        from launcher.initializers.errors import failure_outcome

        return failure_outcome(error, self.uri.shown, self.target)

    def _on_lost(self, why: str) -> None:
        """In the lease's heartbeat thread: hand the loop why, nothing more."""
        with contextlib.suppress(OSError):  # the run is over
            os.write(self.tell_lost, why.encode()[:4096])

    def _lease_lost(self, data: bytes) -> None:
        if data and self.lost is None:
            self.lost = data.decode(errors="replace")
            self.life.supervisor.begin_teardown()

    def go(self, life: lifecycle.Life) -> None:
        """The download's go word: what to fetch, as validated, and how to say and hand its outcome."""
        go = self.fetch_go
        assert go is not None  # made at start_early
        go.send(
            {
                "order": self.order.to_json(),
                "log_format": life.launcher.log_format,
                "codes": sorted(life.launcher.retryable_exit_codes),
                "handoff": handoff(life),
            }
        )
        go.close()
        self.child = self.early

    def judge(self, life: lifecycle.Life) -> Outcome:
        from launcher.core.outcome import Outcome, Reasons

        if self.lost is not None:
            return Outcome.of(Reasons.LEASE_LOST, self.lost)
        return super().judge(life)

    def conclude(self, life: lifecycle.Life, own: Outcome) -> Outcome:
        """The lease goes before the outcome is told: a waiting initializer goes on at once."""
        if self.lease is not None:
            self.lease.release()
        return own
