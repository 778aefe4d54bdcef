"""``trainer-launcher init dataset|model``: STORAGE_URI -> the target directory, then an outcome.

The pod's life is core's (launcher/core/lifecycle.py): this launcher validates, takes the target's
lease (waiting for another initializer that holds it), then runs the download as a process of its
own, supervised like any framework's: a SIGTERM reaches it at once and leaves its partial files
to be resumed, nothing half-written under a final name; a lease lost to another node (this one
looked dead) stops it the same way, so that only one writes. Either way this launcher releases
what it holds and delivers the outcome; the download hands its own over (exit code, message).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tarfile
import zipfile

from launcher.core import lifecycle, log, settings, workspace
from launcher.core.exec_job import CommandPod, node_name
from launcher.core.knobs import KNOBS
from launcher.core.outcome import ConfigError, LauncherError, Outcome, Reasons
from launcher.core.report import run_command
from launcher.core.settings import Override
from launcher.initializers import lease
from launcher.initializers.engine import Engine, Summary
from launcher.initializers.errors import LocalIOError, PermanentError, TransientError
from launcher.initializers.knobs import INIT_KNOBS
from launcher.initializers.listing import outside_the_data, safe_destination, select
from launcher.initializers.settings import InitSettings
from launcher.initializers.state import STATE_DIR
from launcher.initializers.uri import StorageUri, parse_storage_uri

TARGETS = {"dataset": "/workspace/dataset", "model": "/workspace/model"}
# Upstream's model initializer skips these weight formats unless IGNORE_PATTERNS says otherwise.
MODEL_DEFAULT_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
FETCH = "fetch"  # the download's role (settings.CHILD_ROLE)


def run_init(kind: str, launcher_overrides: dict[str, Override], init_overrides: dict[str, Override]) -> int:
    if settings.child_role() == FETCH:
        return run_command(launcher_overrides, lambda launcher: fetch(kind, init_overrides))
    return lifecycle.live(InitPod(kind, launcher_overrides, init_overrides), launcher_overrides)


class InitPod(CommandPod):
    """Validate, take the target's lease, run the download (this command in the fetch role)."""

    name = "init"

    def __init__(self, kind: str, launcher_overrides: dict[str, Override], init_overrides: dict[str, Override]):
        super().__init__([])
        self.kind, self.launcher_overrides, self.init_overrides = kind, launcher_overrides, init_overrides
        self.lease: lease.Lease | None = None
        self.lost: str | None = None  # why the lease was lost, from its heartbeat thread

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        self.init = init = settings.load(InitSettings, self.init_overrides)
        if not init.storage_uri:
            raise ConfigError(
                "STORAGE_URI",
                None,
                "where to download from: hf://OWNER/NAME, s3://BUCKET/PREFIX, file:///PATH or https://HOST/FILE",
            )
        self.uri = parse_storage_uri(init.storage_uri)
        self.target = os.path.abspath(init.output_path or TARGETS[self.kind])
        self.command = [sys.executable, "-m", "launcher", "init", self.kind]
        # The flags as their variables, the target as planned, and the role: the download reads them.
        given = {KNOBS[name].env: str(value.value) for name, value in self.launcher_overrides.items()}
        given.update({INIT_KNOBS[name].env: str(value.value) for name, value in self.init_overrides.items()})
        self.env = {
            **settings.environ(),
            **given,
            INIT_KNOBS["output_path"].env: self.target,
            settings.CHILD_ROLE: FETCH,
        }
        return lifecycle.Planned(None, node_name(), "")

    def check_workspace(self, life: lifecycle.Life) -> None:
        workspace.warn_if_unwritable(self.target)

    def wait(self, life: lifecycle.Life) -> None:
        """The target's lease: one writer at a time (a second one then finds the files complete)."""
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
        return failure_outcome(error, self.uri, self.target)

    def _on_lost(self, why: str) -> None:
        """In the lease's heartbeat thread: hand the loop why, nothing more."""
        with contextlib.suppress(OSError):  # the run is over
            os.write(self.tell_lost, why.encode()[:4096])

    def _lease_lost(self, data: bytes) -> None:
        if data and self.lost is None:
            self.lost = data.decode(errors="replace")
            self.life.supervisor.begin_teardown()

    def judge(self, life: lifecycle.Life) -> Outcome:
        if self.lost is not None:
            return Outcome.of(Reasons.LEASE_LOST, self.lost)
        return super().judge(life)

    def conclude(self, life: lifecycle.Life, own: Outcome) -> Outcome:
        """The lease goes before the outcome is told: a waiting initializer goes on at once."""
        if self.lease is not None:
            self.lease.release()
        return own


def fetch(kind: str, init_overrides: dict[str, Override]) -> Outcome:
    """The download itself, under the lease its parent holds."""
    init = settings.load(InitSettings, init_overrides)
    uri = parse_storage_uri(init.storage_uri)
    target = os.path.abspath(init.output_path or TARGETS[kind])
    ignore = (
        init.ignore_patterns
        if init.ignore_patterns is not None
        else (MODEL_DEFAULT_IGNORE if kind == "model" else None)
    )
    try:
        summary = _download(kind, uri, target, init, ignore)
    except (PermanentError, TransientError, OSError) as error:
        return failure_outcome(error, uri, target)
    return Outcome.of(Reasons.SUCCEEDED, _said(summary, uri, target), extra={"uri": uri.shown})


def _source(kind: str, uri: StorageUri, init: InitSettings):
    from launcher.initializers import sources

    if uri.scheme == "file":
        return sources.FileSource(uri, log.info)
    if uri.scheme in ("https", "http"):
        return sources.HttpsSource(uri, uri.shown)
    if uri.scheme == "s3":
        from launcher.initializers.s3 import S3Source

        return S3Source(uri, init)
    return sources.HubSource(uri, "dataset" if kind == "dataset" else "model", init.access_token, init.revision)


def _download(kind: str, uri: StorageUri, target: str, init: InitSettings, ignore) -> Summary:
    """Under the target's lease: one writer at a time (a second one finds the files complete)."""
    source = _source(kind, uri, init)
    listed = source.list()
    files = select(listed, init.allow_patterns, ignore)
    said = (
        f"init {kind}: {uri.shown} -> {target}: {len(files)} of {len(listed)} files, "
        f"{sum(f.size or 0 for f in files) / 1e6:.1f} MB"
    )
    if len(files) < len(listed):
        rules = [f"ALLOW_PATTERNS={','.join(init.allow_patterns)}"] if init.allow_patterns else []
        if ignore:
            default = " (a model's default)" if init.ignore_patterns is None else ""
            rules.append(f"IGNORE_PATTERNS={','.join(ignore)}{default}")
        said += f"; {len(listed) - len(files)} skipped by {' and '.join(rules)}"
    (log.info if files or not listed else log.warning)(said)
    summary = Engine(
        source, target, init.concurrency, init.chunk_size, init.retries, log.info, ranged_min=init.ranged_min
    ).run(files)
    if init.extract and uri.scheme in ("https", "http") and files and files[0].path.endswith(ARCHIVES):
        extract(os.path.join(target, files[0].path), target)
    return summary


def failure_outcome(error: LauncherError | OSError, uri: StorageUri, target: str) -> Outcome:
    """The row of the table of reasons for a failed initialization: what no retry fixes (a
    permanent storage error, a target the pod may not write or that is full) exits 2, the rest
    138. Retryable follows from the code, at delivery."""
    if isinstance(error, OSError):
        return LocalIOError(error, target).outcome().with_extra(uri=uri.shown)
    if isinstance(error, LocalIOError):
        return error.outcome().with_extra(uri=uri.shown)
    return error.outcome(f"{uri.shown}: {error}").with_extra(uri=uri.shown)


def _said(summary: Summary, uri: StorageUri, target: str) -> str:
    rate = summary.bytes_fetched / max(summary.seconds, 1e-6) / 1e6
    resumed = f", resumed {summary.resumed_bytes / 1e6:.1f} MB" if summary.resumed_bytes else ""
    return (
        f"{uri.shown} -> {target}: {summary.files} files, fetched {summary.fetched} "
        f"({summary.bytes_fetched / 1e6:.1f} MB at {rate:.1f} MB/s{resumed}), "
        f"{summary.skipped} already complete, in {summary.seconds:.1f}s"
    )


def extract(archive: str, target: str) -> None:
    """Extract into ``target``, refusing members that are absolute, climb out with '..', are
    devices, or reach outside the target or into its state directory by any path: their own name,
    a link already in the target, or the archive's own links (``state -> .trainer-launcher`` then
    ``state/manifest.json``). Members are checked before the first is written; tar members once
    more as each is extracted, against what is on the disk by then."""
    name = os.path.basename(archive)
    try:
        (_extract_zip if archive.endswith(".zip") else _extract_tar)(archive, target, _name_checker(target))
    except _FILTER_ERRORS as error:
        raise PermanentError(f"refusing archive member: {error}", Reasons.UNSAFE_PATH) from None
    except (tarfile.TarError, zipfile.BadZipFile) as error:
        raise PermanentError(f"{name}: not a readable archive ({error})", Reasons.BAD_ARCHIVE) from None
    except RecursionError:  # tarfile retries a link it cannot make through its target, and so on
        raise PermanentError(
            f"{name}: not a readable archive (links that lead in a circle)", Reasons.BAD_ARCHIVE
        ) from None
    except OSError as error:
        if error.errno not in _NOT_A_TREE:
            raise  # the disk's (full, read-only): the initializer sorts those
        where = os.path.relpath(error.filename, target) if isinstance(error.filename, str) else "?"
        raise PermanentError(
            f"{name}: its members do not make one tree ({where!r}: {error.strerror})", Reasons.BAD_ARCHIVE
        ) from None
    except KeyError as error:  # tarfile's word for a hard link to a member the archive lacks
        raise PermanentError(
            f"{name}: not a readable archive (a hard link whose target is not in it: "
            f"{error.args[0] if error.args else error})",
            Reasons.BAD_ARCHIVE,
        ) from None


def _extract_zip(archive: str, target: str, check_name) -> None:
    with zipfile.ZipFile(archive) as bundle:
        for member in bundle.infolist():
            if (member.external_attr >> 16) & 0o170000 == 0o120000:
                raise PermanentError(f"refusing the symlink member {member.filename!r}", Reasons.UNSAFE_PATH)
            check_name(member.filename, member.is_dir())
        bundle.extractall(target)


def _extract_tar(archive: str, target: str, check_name) -> None:
    with tarfile.open(archive) as bundle:
        members = bundle.getmembers()
        for member in members:
            check_name(member.name, member.isdir())
        refuse_links_into_state(members)
        check = _data_outside_state(target)
        if HAS_FILTERS:
            bundle.extractall(target, filter=check)
        else:  # each member checked against the disk as the ones before it left it, as the filter does
            for member in members:
                bundle.extract(check(member, target), target)


# A member that cannot be made where the members before it put something else: a file under a
# file, a file over a directory, a file through a dangling link, a name too long.
_NOT_A_TREE = frozenset((errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ELOOP, errno.ENAMETOOLONG, errno.ENOENT))


def _name_checker(target: str):
    """A check of one member's name: safe, and not already leading, through a link on the disk,
    outside the data (zip and tar open a file member's name following a link found there)."""
    root = os.path.realpath(target)
    checked: dict[str, str] = {}

    def check(name: str, directory: bool = True) -> None:
        relative = (name[2:] if name.startswith("./") else name).rstrip("/")
        if not directory and relative in ("", "."):  # a file or link named "/" or ".": the target itself
            raise PermanentError(
                f"refusing the archive member {name!r}: it names the target directory", Reasons.UNSAFE_PATH
            )
        if relative and relative != ".":
            destination = safe_destination(target, relative, checked)
            if why := outside_the_data(root, os.path.realpath(destination)):
                raise PermanentError(f"refusing the archive member {name!r}: {why}", Reasons.UNSAFE_PATH)

    return check


# The kernel's limit on links followed in one lookup (MAXSYMLINKS): more means a loop.
_MAX_HOPS = 40


def refuse_links_into_state(members: list[tarfile.TarInfo]) -> None:
    """Refuse a tar whose own links lead a member into the state directory. Pure: it follows the
    archive's symlinks by name, as extraction would create them, before anything is written."""
    links = {_joined(_parts(m.name)): m.linkname for m in members if m.issym()}
    for member in members:
        reached = [_through_links(_parts(member.name), links, follow_last=not (member.issym() or member.islnk()))]
        if member.issym():
            reached.append(_through_links(_parts(member.name)[:-1] + _parts(member.linkname), links))
        elif member.islnk():
            reached.append(_through_links(_parts(member.linkname), links))
        if any(parts and parts[0] == STATE_DIR for parts in reached):
            raise PermanentError(
                f"refusing the archive member {member.name!r}: through the archive's links it "
                f"reaches the initializer's own {STATE_DIR} directory",
                Reasons.UNSAFE_PATH,
            )


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _joined(parts: list[str]) -> str:
    return "/".join(parts)


def _through_links(pending: list[str], links: dict[str, str], follow_last: bool = True) -> list[str] | None:
    """Where a path (as parts under the target) lands once the archive's symlinks in it are
    followed; None where it climbs out of the target or loops (the data filter refuses those)."""
    resolved: list[str] = []
    pending, hops = list(pending), 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        here = _joined([*resolved, part])
        if here in links and (pending or follow_last):
            hops += 1
            if hops > _MAX_HOPS or links[here].startswith("/"):
                return None
            pending = _parts(links[here]) + pending  # relative to the link's directory: ``resolved``
            continue
        resolved.append(part)
    return resolved


# tarfile's extraction filters came with Python 3.11.4 (and 3.12); Debian bookworm's 3.11.2 has
# none, so there the launcher applies the part of the 'data' filter it relies on itself.
HAS_FILTERS = hasattr(tarfile, "data_filter")
_FILTER_ERRORS = (tarfile.FilterError,) if HAS_FILTERS else ()  # an except clause names it only where it exists


def _basic_data_filter(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo:
    """What the launcher needs of the 'data' filter where tarfile has none: no devices or pipes,
    no absolute link targets, no setuid/setgid/sticky bits or group/other write (the rest, paths
    and links leaving the target, is checked by _data_outside_state either way)."""
    if member.ischr() or member.isblk() or member.isfifo():
        raise PermanentError(f"refusing archive member: {member.name!r} is a special file", Reasons.UNSAFE_PATH)
    if (member.issym() or member.islnk()) and member.linkname.startswith("/"):
        raise PermanentError(
            f"refusing archive member: {member.name!r} links to the absolute path {member.linkname!r}",
            Reasons.UNSAFE_PATH,
        )
    member.mode &= 0o755
    return member


def _data_outside_state(target: str):
    """tarfile's 'data' filter, then one more refusal: a member whose path, or whose link's
    target, resolves outside the data on the disk as it is when that member is extracted (links
    extracted before it included)."""
    root = os.path.realpath(target)

    def check(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo:
        member = (tarfile.data_filter if HAS_FILTERS else _basic_data_filter)(member, destination)
        reached = [os.path.join(destination, member.name)]
        if member.issym():
            reached.append(os.path.join(destination, os.path.dirname(member.name), member.linkname))
        elif member.islnk():
            reached.append(os.path.join(destination, member.linkname))
        for path in reached:
            if why := outside_the_data(root, os.path.realpath(path)):
                raise PermanentError(f"refusing archive member: {member.name!r}: {why}", Reasons.UNSAFE_PATH)
        return member

    return check
