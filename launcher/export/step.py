"""The export as a step of the pod's life (launcher.core.lifecycle's ``Export``): checked with the
plan, so a bad EXPORT_URI fails the pod before training starts, and run after the job, before the
outcome is delivered: the pod exits 0 only once its output is safe.

Which pods export: node 0 (the Job completion index, as Trainer gives every pod), or every node
under ``node-<index>/`` with ``--export-per-node``; never a launcher nested in ``trainer-launcher
exec`` (the outer one exports). After a failed job only with ``--export-on-failure``, and then the
job's own outcome stands, with the export's added. A signal during the export stops it (what was
sent stays, for the next try to skip) and the pod ends as Terminated."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core import log, settings
from launcher.core.outcome import ConfigError, LauncherError, Outcome, Reasons, internal_error, terminated

if TYPE_CHECKING:
    from launcher.core.lifecycle import Life
    from launcher.export.settings import ExportSettings
    from launcher.initializers.uri import StorageUri

SCHEMES = ("s3", "hf", "file")
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")  # a Hub owner or repo name


@dataclass(frozen=True)
class Plan:
    uri: StorageUri
    path: str
    path_from: str  # the flag or variable it came from
    subpath: str  # node-<index> with --export-per-node
    exports: bool  # this pod is one that exports


class Export:
    """The lifecycle's export hook."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.settings: ExportSettings | None = None

    def check(self, life: Life) -> None:
        """With the plan: the settings and the URI, or a ConfigError."""
        from launcher.export.settings import ExportSettings
        from launcher.initializers.uri import parse_storage_uri

        self.settings = export = settings.load(ExportSettings, life.overrides)
        if not export.export_uri:
            return
        named = settings.source_of(ExportSettings, "export_uri", life.overrides) or "EXPORT_URI"
        uri = parse_storage_uri(export.export_uri, SCHEMES, named)
        repo = f"{uri.authority}/{uri.path}".split("/")[:2]
        if uri.scheme == "hf" and not all(_HUB_NAME.fullmatch(part) for part in repo):
            raise ConfigError(
                named,
                uri.shown,
                "hf://OWNER/NAME[/SUBFOLDER], each name of letters, digits, '-', '_' and '.', at most 96",
            )
        path_from = settings.source_of(ExportSettings, "export_path", life.overrides) or "EXPORT_PATH"
        if not os.path.isabs(export.export_path):
            raise ConfigError(path_from, export.export_path, "an absolute path")
        nested = settings.handoff_path() is not None  # under `trainer-launcher exec`: it exports
        exports = not nested and (export.export_per_node or export.node_index == 0)
        subpath = f"node-{export.node_index}" if export.export_per_node else ""
        self.plan = Plan(uri, os.path.normpath(export.export_path), path_from, subpath, exports)

    def after(self, life: Life, outcome: Outcome) -> Outcome:
        plan, export = self.plan, self.settings
        if plan is None or export is None or not plan.exports or life.supervisor.received_signal is not None:
            return outcome
        failed = outcome.exit_code != 0
        if failed and not export.export_on_failure:
            log.info("export: skipped, the job failed (--export-on-failure exports its output all the same)")
            return outcome
        done = self._run(life, plan, export)
        if failed:
            return (
                outcome.with_extra(exportError=done.message)
                if done.exit_code
                else outcome.with_extra(**{k: v for k, v in done.extra.items() if k.startswith("export")})
            )
        if done.exit_code:
            return done
        return Outcome.of(
            Reasons.SUCCEEDED, f"{outcome.message}; {done.message}", extra={**outcome.extra, **done.extra}
        )

    def _run(self, life: Life, plan: Plan, export: ExportSettings) -> Outcome:
        """The export in a thread; this one serves signals and the TrainJob's status meanwhile."""
        progress: list = []
        reported = None

        def report() -> None:
            nonlocal reported
            if not progress or life.watch is None:
                return
            sent = progress[0]
            if (now := (sent.files, sent.bytes)) != reported:
                reported = now
                shown = f"{now[0]}/{sent.total_files} files, {now[1] / 1e6:.1f}/{sent.total_bytes / 1e6:.1f} MB"
                life.watch.report([("export", shown)])

        supervisor = life.supervisor
        result = supervisor.serve_during(lambda: _export(plan, export, life.node, progress.append), report)
        if supervisor.received_signal is not None:
            log.error("export: stopped by a signal; what was sent stays for the next try")
            return terminated(supervisor.received_signal).on_node(life.node)
        return result[0] if result else internal_error("the export stopped without an outcome", node=life.node)


def _export(plan: Plan, export: ExportSettings, node: str, sending) -> Outcome:
    from launcher.export import engine
    from launcher.export.manifest import manifest
    from launcher.export.tree import list_tree

    shown = plan.uri.shown + (f"/{plan.subpath}" if plan.subpath else "")
    try:
        files = list_tree(plan.path, log.warning, plan.path_from)
        target = _target(plan, export)
        total = sum(f.size for f in files)
        log.info(f"export: {plan.path} -> {target.shown}: {len(files)} files, {total / 1e6:.1f} MB")
        summary = engine.export(
            target,
            files,
            export.export_concurrency,
            log.info,
            lambda listed, digests: manifest(listed, digests, node, plan.path),
            sending,
        )
    except LauncherError as error:
        return _failed(error, shown, plan.path)
    except OSError as error:
        from launcher.initializers.errors import LocalIOError

        return _failed(LocalIOError(error, plan.path), shown, plan.path)
    except Exception as error:  # noqa: BLE001 - the launcher's own bug, never the program's failure
        return internal_error(error, node=node)
    rate = summary.bytes_sent / max(summary.seconds, 1e-6) / 1e6
    said = (
        f"exported {summary.files} files to {target.shown} ({summary.sent} sent, {summary.bytes_sent / 1e6:.1f} MB "
        f"at {rate:.1f} MB/s, {summary.skipped} already there) in {summary.seconds:.1f}s"
    )
    return Outcome.of(Reasons.SUCCEEDED, said, extra={"exportUri": target.shown, "exportFiles": summary.files})


def _target(plan: Plan, export: ExportSettings):
    if plan.uri.scheme == "s3":
        from launcher.export.s3 import S3Target

        return S3Target(plan.uri, export, plan.subpath, export.export_concurrency)
    if plan.uri.scheme == "hf":
        from launcher.export.hf import HubTarget

        return HubTarget(plan.uri, export, plan.subpath)
    from launcher.export.file import FileTarget

    return FileTarget(plan.uri, plan.subpath, export.export_concurrency)


def _failed(error: LauncherError, shown: str, path: str) -> Outcome:
    """ExportFailed (138) where another try may succeed, ExportRejected (2) where none will; the
    storage's own reason in exportCause."""
    cause = getattr(error, "reason", Reasons.LAUNCHER_ERROR)
    permanent = error.exit_code == Reasons.CONFIG_ERROR.code
    reason = Reasons.EXPORT_REJECTED if permanent else Reasons.EXPORT_FAILED
    kept = f"; the output is still in {path}" if os.path.isdir(path) else ""
    return Outcome.of(
        reason, f"the export to {shown} failed: {error}{kept}", extra={"exportCause": cause, "exportUri": shown}
    )
