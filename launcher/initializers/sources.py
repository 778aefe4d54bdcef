"""The storage backends behind the engine's small interface: list() and read(file, start)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from urllib.parse import quote

from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError, TransientError, local_source_error
from launcher.initializers.listing import Chunk, RemoteFile
from launcher.initializers.uri import StorageUri


class FileSource:
    """file:///path: a directory (every file below it) or one file, e.g. from a mounted PVC.

    The path given is trusted as it is, links included. Below it, a symbolic link is followed only
    to a file inside the source: that file's bytes are copied under the link's name (datasets
    share files this way). A link that leaves the source is skipped with one line naming the link,
    never its target: the source is a volume others write, and a link to, say, the pod's
    service-account token would otherwise be copied into the dataset. A link to a directory is
    skipped with one line too, wherever it points: descending would copy a tree twice, or forever
    around a loop; the tree it names, where it lies inside the source, is copied from there.
    Anything but files and directories (FIFOs, sockets, devices) is skipped: nothing to copy."""

    supports_range = True

    def __init__(self, uri: StorageUri, log: Callable[[str], None] = print):
        self.root, self.log = uri.path, log

    def list(self) -> list[RemoteFile]:
        if os.path.isfile(self.root):
            return [self._file(os.path.realpath(self.root), os.path.basename(self.root), os.stat(self.root))]
        if not os.path.isdir(self.root):
            raise PermanentError(f"{self.root} does not exist", Reasons.NOT_FOUND)
        real_root = os.path.realpath(self.root)
        found = []
        for directory, subdirectories, names in os.walk(self.root):
            for name in subdirectories:
                path = os.path.join(directory, name)
                if os.path.islink(path):  # os.walk lists links to directories here, and does not enter them
                    self._skip(path, "a symbolic link to a directory")
            for name in names:
                path = os.path.join(directory, name)
                info: os.stat_result | None
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue  # removed since the directory was read
                if stat.S_ISLNK(info.st_mode):
                    path, info = self._resolve(path, real_root)
                if info is not None and stat.S_ISREG(info.st_mode):
                    found.append(self._file(path, self._relative(os.path.join(directory, name)), info))
        return found

    def _resolve(self, link: str, real_root: str) -> tuple[str, os.stat_result | None]:
        """Where a link below the root leads, if it is a file inside the source: (its real path,
        its stat); else (link, None), said once."""
        resolved = os.path.realpath(link)
        if os.path.commonpath([real_root, resolved]) != real_root:
            self._skip(link, "a symbolic link that leaves the source")
            return link, None
        try:
            info = os.stat(resolved)
        except OSError:
            self._skip(link, "a symbolic link to nothing")
            return link, None
        if not stat.S_ISREG(info.st_mode):
            self._skip(link, "a symbolic link to something that is not a file")
            return link, None
        return resolved, info

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def _skip(self, link: str, why: str) -> None:
        self.log(f"file://{self.root}: {self._relative(link)!r}: skipped, {why}")

    @staticmethod
    def _file(path: str, relative: str, info: os.stat_result) -> RemoteFile:
        return RemoteFile(relative, info.st_size, None, f"{info.st_mtime_ns}:{info.st_size}", path)

    def local_path(self, file: RemoteFile) -> str | None:
        """The engine copies it with the kernel (copy_file_range/sendfile), not through read()."""
        return file.key

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[Chunk]:
        try:
            with os.fdopen(os.open(file.key, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                handle.seek(start)
                left = None if end is None else end - start
                while chunk := handle.read(chunk_size if left is None else min(chunk_size, left)):
                    if left is not None:
                        left -= len(chunk)
                    yield chunk
        except OSError as error:
            raise local_source_error(file.key, error) from None


class HttpsSource:
    """https://host/path/file: one file; Range when the server accepts it."""

    def __init__(self, uri: StorageUri, shown: str):
        self.url, self.shown = uri.raw, shown
        self.supports_range = False

    def list(self) -> list[RemoteFile]:
        from launcher.initializers.http import open_url  # http.client, ssl: not for file://

        response = open_url(self.url, {}, method="HEAD", what=self.shown)
        response.close()
        length = response.headers.get("Content-Length")
        self.supports_range = response.headers.get("Accept-Ranges", "").lower() == "bytes"
        name = self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "download"
        version = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
        return [RemoteFile(name, int(length) if length and length.isdigit() else None, None, version, self.url)]

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[Chunk]:
        from launcher.initializers.http import get_range

        return get_range(self.url, {}, start, chunk_size, self.shown, end=end)


class HubSource:
    """hf://owner/name[/subfolder]: a model or dataset repo at one commit, via huggingface_hub."""

    supports_range = True

    def __init__(self, uri: StorageUri, repo_type: str, token: str | None, revision: str | None):
        owner, _, rest = f"{uri.authority}/{uri.path}".partition("/")
        name, _, self.subfolder = rest.partition("/")
        self.repo_id, self.repo_type, self.token, self.revision = f"{owner}/{name}", repo_type, token, revision

    def call(self, function, what: str):
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            return function()
        except GatedRepoError:
            raise PermanentError(f"{what}: gated repository (set ACCESS_TOKEN)", Reasons.AUTH_FAILED) from None
        except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as error:
            raise PermanentError(f"{what}: {type(error).__name__}", Reasons.NOT_FOUND) from None
        except HfHubHTTPError as error:
            status = getattr(error.response, "status_code", 0) or 0
            if status in (401, 403):
                raise PermanentError(f"{what}: HTTP {status}", Reasons.AUTH_FAILED) from None
            if 400 <= status < 500 and status != 429:
                raise PermanentError(f"{what}: HTTP {status}", Reasons.STORAGE_ERROR) from None
            raise TransientError(f"{what}: HTTP {status}") from None
        except (OSError, ConnectionError, TimeoutError) as error:
            raise TransientError(f"{what}: {type(error).__name__}") from None

    def list(self) -> list[RemoteFile]:
        from huggingface_hub import HfApi

        api = HfApi(token=self.token or False)
        what = f"hf://{self.repo_id}"
        info = self.call(lambda: api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision), what)
        self.commit = info.sha
        entries = self.call(
            lambda: list(
                api.list_repo_tree(
                    self.repo_id,
                    path_in_repo=self.subfolder or None,
                    recursive=True,
                    repo_type=self.repo_type,
                    revision=self.commit,
                )
            ),
            what,
        )
        base = f"{self.subfolder.rstrip('/')}/" if self.subfolder else ""
        files = []
        for entry in entries:
            if not hasattr(entry, "size") or getattr(entry, "blob_id", None) is None:
                continue  # a folder
            lfs = getattr(entry, "lfs", None)
            checksum = ("sha256", lfs.sha256) if lfs else ("git-sha1", entry.blob_id)
            relative = entry.path[len(base) :] if entry.path.startswith(base) else entry.path
            files.append(RemoteFile(relative, entry.size, checksum, self.commit, entry.path))
        if not files:
            raise PermanentError(
                f"{what}: no files{' under ' + self.subfolder if self.subfolder else ''}", Reasons.NOT_FOUND
            )
        return files

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[Chunk]:
        from huggingface_hub import constants

        from launcher.initializers.http import get_range

        prefix = "datasets/" if self.repo_type == "dataset" else ""
        url = f"{constants.ENDPOINT}/{prefix}{self.repo_id}/resolve/{self.commit}/{quote(file.key)}"
        credentials = {"Authorization": f"Bearer {self.token}"} if self.token else None
        return get_range(url, {}, start, chunk_size, f"hf://{self.repo_id}/{file.key}", credentials, end)
