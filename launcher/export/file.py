"""file:///PATH: a directory, on a volume of this pod (another file system is fine).

The export is built beside it, in ``.NAME.trainer-launcher-export``, and takes the directory's place
in one rename once every file is copied (by the kernel), checked against its source's md5 and made
durable, with the manifest in it: a reader sees the old directory or the new one, never a mix.
Where an earlier export is there, the two are exchanged atomically (renameat2's RENAME_EXCHANGE)
and the old one removed; its unchanged files are hard-linked, not copied. A staging directory left
by a killed export is resumed: what it holds that was verified (its journal says so, and the size
agrees) is kept. A directory that is there and is not an export (no manifest) is refused, never
replaced; so is a mount point, which no rename can move: export to a directory below it."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil

from launcher.core.outcome import Reasons
from launcher.export.checksum import digest
from launcher.export.engine import each
from launcher.export.tree import MANIFEST, LocalFile
from launcher.initializers.errors import LocalIOError, PermanentError, TransientError
from launcher.initializers.progress import Progress
from launcher.initializers.state import STATE_DIR
from launcher.initializers.uri import StorageUri

JOURNAL = f"{STATE_DIR}/export.journal"  # in the staging directory: each verified file, a JSON line
_RENAME_EXCHANGE = 2


class FileTarget:
    def __init__(self, uri: StorageUri, subpath: str, concurrency: int):
        self.target = os.path.normpath(os.path.join(uri.path, subpath) if subpath else uri.path)
        parent, name = os.path.split(self.target)
        self.staging = os.path.join(parent, f".{name}.trainer-launcher-export")
        self.shown, self.lanes = f"file://{self.target}", concurrency

    def forms(self, file: LocalFile, there: dict) -> tuple[tuple[str, ...], int]:
        return ("md5",), 0

    def existing(self) -> dict[str, dict]:
        try:
            return self._existing()
        except OSError as error:
            raise LocalIOError(error, self.target) from None

    def _existing(self) -> dict[str, dict]:
        found: dict[str, dict] = {}  # the export in the target now, by path
        if os.path.lexists(self.target):
            if os.path.islink(self.target) or not os.path.isdir(self.target):
                raise PermanentError(f"{self.shown} is not a directory", Reasons.BAD_PATH)
            if os.path.ismount(self.target):
                raise PermanentError(
                    f"{self.shown} is a mount point, which a rename cannot replace: "
                    f"export to a directory below it, e.g. {self.shown}/output",
                    Reasons.BAD_PATH,
                )
            manifest = os.path.join(self.target, MANIFEST)
            if os.path.isfile(manifest):
                earlier = _read_manifest(manifest)
                if earlier is None:
                    raise PermanentError(
                        f"{self.shown}/{MANIFEST} is not an export's manifest: choose another path, or empty it",
                        Reasons.PATH_CLASH,
                    )
                found = earlier
            elif os.listdir(self.target):
                raise PermanentError(
                    f"{self.shown} holds files and is not an export (no {MANIFEST}): choose another path, or empty it",
                    Reasons.PATH_CLASH,
                )
        return {**found, **self._journal()}  # a verified file of the staging directory wins

    def _journal(self) -> dict[str, dict]:
        """The files of an interrupted export's staging directory that were verified, and are there still."""
        kept = {}
        try:
            with open(os.path.join(self.staging, JOURNAL)) as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                        path = os.path.join(self.staging, entry["path"])
                        if os.path.getsize(path) == entry["size"]:
                            kept[entry["path"]] = entry
                    except (ValueError, KeyError, TypeError, OSError):
                        continue  # a torn last line, or a file gone since
        except FileNotFoundError:
            pass
        return kept

    def same(self, there: dict, file: LocalFile, digests: dict[str, str]) -> bool:
        return there.get("size") == file.size and there.get("md5") == digests["md5"]

    def begin(self, existing: dict[str, dict]) -> None:
        try:
            os.makedirs(os.path.join(self.staging, STATE_DIR), exist_ok=True)
        except OSError as error:
            raise LocalIOError(error, self.staging) from None
        # Open from begin() to the end of send(), which closes it: each copy appends its line.
        self._journal_handle = open(os.path.join(self.staging, JOURNAL), "a")  # noqa: SIM115

    def send(self, files: list[LocalFile], digests: dict[str, dict[str, str]], progress: Progress) -> None:
        try:
            each(files, lambda f: self._copy(f, digests), self.lanes, progress)
        except OSError as error:
            raise LocalIOError(error, self.staging) from None
        finally:
            self._journal_handle.close()

    def _copy(self, file: LocalFile, digests: dict[str, dict[str, str]]) -> None:
        expected = digest(file.real, file.size, ("md5",))["md5"]
        destination = os.path.join(self.staging, *file.path.split("/"))
        temporary = f"{destination}.tmp"
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        if os.path.isdir(destination) and not os.path.islink(destination):
            shutil.rmtree(destination)  # a directory of an earlier attempt where a file goes now
        shutil.copyfile(file.real, temporary)  # sendfile(2): the kernel moves the bytes
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        copied = digest(temporary, file.size, ("md5",))["md5"]
        if copied != expected:
            os.unlink(temporary)
            raise TransientError(f"{file.path}: the copy's md5 is {copied}, the file's {expected}")
        os.replace(temporary, destination)
        digests[file.path] = {"md5": expected}
        self._journal_handle.write(json.dumps({"path": file.path, "size": file.size, "md5": expected}) + "\n")
        self._journal_handle.flush()

    def finish(self, files: list[LocalFile], digests: dict[str, dict[str, str]], manifest: bytes) -> None:
        try:
            self._finish(files, manifest)
        except OSError as error:
            raise LocalIOError(error, self.target) from None

    def _finish(self, files: list[LocalFile], manifest: bytes) -> None:
        wanted = {f.path for f in files}
        journal = self._journal()
        for file in files:  # unchanged since the export in place: a hard link, not a copy
            if file.path in journal:
                continue
            destination = os.path.join(self.staging, *file.path.split("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            source = os.path.join(self.target, *file.path.split("/"))
            try:
                os.link(source, destination)
            except FileExistsError:
                os.unlink(destination)
                os.link(source, destination)
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                shutil.copyfile(source, destination)
        shutil.rmtree(os.path.join(self.staging, STATE_DIR))
        for directory, _, names in os.walk(self.staging, topdown=False):  # what the tree no longer has
            for name in names:
                path = os.path.join(directory, name)
                if os.path.relpath(path, self.staging).replace(os.sep, "/") not in wanted:
                    os.unlink(path)
            if directory != self.staging and not os.listdir(directory):
                os.rmdir(directory)
        with open(os.path.join(self.staging, MANIFEST), "wb") as handle:
            handle.write(manifest)
            os.fsync(handle.fileno())
        os.sync()  # every copy and link durable before the rename makes them the export
        if not os.path.exists(self.target):
            os.rename(self.staging, self.target)
        else:
            _exchange(self.staging, self.target)
            shutil.rmtree(self.staging)  # the earlier export, now under the staging name
        _fsync_directory(os.path.dirname(self.target))


def _read_manifest(path: str) -> dict[str, dict] | None:
    """An earlier export's files by path, from its manifest; None when it is none of ours."""
    try:
        with open(path) as handle:
            listed = json.load(handle)["files"]
        return {f["path"]: f for f in listed if isinstance(f.get("path"), str)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _exchange(a: str, b: str) -> None:
    """Swap two directories in one step (Linux 3.15+); where the file system cannot, two renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None and renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), _RENAME_EXCHANGE) == 0:
        return
    error = ctypes.get_errno() if renameat2 is not None else errno.ENOSYS
    if error not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(error, os.strerror(error), b)
    aside = f"{a}.old"
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
