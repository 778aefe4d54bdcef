"""An archive the initializer downloaded (``EXTRACT``), unpacked into the target: every member's
path checked before the first is written, and each tar member again as it is extracted, so that
nothing lands outside the data or in the initializer's own state directory."""

from __future__ import annotations

import errno
import os
import tarfile
import zipfile

from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError
from launcher.initializers.listing import outside_the_data, safe_destination
from launcher.initializers.state import STATE_DIR

SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


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
