"""hf://OWNER/NAME[/SUBFOLDER]: the files as one commit to a model repo, through the Hub's own API.

One commit is what makes it atomic: readers see the repo before it or after it. The repo is made
(private) when it is not there, as ``hf upload`` does. Files the repo holds already, byte for byte
(the LFS sha256, or git's blob sha1 for a regular file), are left out of the commit; with nothing
left, there is no commit. After it, the commit's tree is read back and every file compared. The
token is ACCESS_TOKEN (the initializers' name) or HF_TOKEN; HF_ENDPOINT is huggingface_hub's own."""

from __future__ import annotations

from launcher.core.outcome import Reasons
from launcher.export.checksum import digest
from launcher.export.engine import backoff
from launcher.export.tree import LocalFile
from launcher.initializers.errors import PermanentError, TransientError
from launcher.initializers.progress import Progress
from launcher.initializers.uri import StorageUri

ATTEMPTS = 4


class HubTarget:
    def __init__(self, uri: StorageUri, settings, subpath: str):
        from huggingface_hub import HfApi

        from launcher.initializers.sources import HubSource

        self.hub = HubSource(uri, "model", settings.access_token, None)
        self.repo_id = self.hub.repo_id
        self.folder = "/".join(p for p in (self.hub.subfolder.strip("/"), subpath) if p)
        self.shown = f"hf://{self.repo_id}" + (f"/{self.folder}" if self.folder else "")
        self.api = HfApi(token=settings.access_token or None)
        self.commit: str | None = None  # the commit the files are verified in

    def in_repo(self, path: str) -> str:
        return f"{self.folder}/{path}" if self.folder else path

    def forms(self, file: LocalFile, there: dict) -> tuple[tuple[str, ...], int]:
        return ("sha256",) if "sha256" in there else ("git-sha1",), 0

    def existing(self) -> dict[str, dict]:
        self.hub.call(lambda: self.api.create_repo(self.repo_id, private=True, exist_ok=True), f"create {self.shown}")
        self.commit = self.hub.call(lambda: self.api.repo_info(self.repo_id).sha, self.shown)
        return self._tree(self.commit)

    def _tree(self, revision: str | None) -> dict[str, dict]:
        from huggingface_hub.errors import EntryNotFoundError

        def listed() -> list:
            try:
                return list(
                    self.api.list_repo_tree(
                        self.repo_id, path_in_repo=self.folder or None, recursive=True, revision=revision
                    )
                )
            except EntryNotFoundError:
                return []  # the folder is not there yet

        base = f"{self.folder}/" if self.folder else ""
        found = {}
        for entry in self.hub.call(listed, self.shown):
            if getattr(entry, "blob_id", None) is None or not hasattr(entry, "size"):
                continue  # a folder
            digests = {"sha256": entry.lfs.sha256} if getattr(entry, "lfs", None) else {"git-sha1": entry.blob_id}
            found[entry.path[len(base) :]] = {"size": entry.size, **digests}
        return found

    def same(self, there: dict, file: LocalFile, digests: dict[str, str]) -> bool:
        form = "sha256" if "sha256" in there else "git-sha1"
        return there["size"] == file.size and there[form] == digests[form]

    def begin(self, existing: dict[str, dict]) -> None:
        """Nothing to take back: readers see the repo's commits, and this one is not made yet."""

    def send(self, files: list[LocalFile], digests: dict[str, dict[str, str]], progress: Progress) -> None:
        from huggingface_hub import CommitOperationAdd

        if not files:
            return
        message = f"trainer-launcher export: {len(files)} files"
        for attempt in range(ATTEMPTS):
            # Made anew each try: an operation remembers its upload, and a failed one must go again.
            operations = [CommitOperationAdd(path_in_repo=self.in_repo(f.path), path_or_fileobj=f.real) for f in files]
            try:
                info = self.hub.call(
                    lambda ops=operations: self.api.create_commit(self.repo_id, ops, commit_message=message),
                    f"commit to {self.shown}",
                )
                break
            except TransientError:
                if attempt == ATTEMPTS - 1:
                    raise
                backoff(attempt, first=0.5)
        self.commit = info.oid
        for file, operation in zip(files, operations, strict=True):  # huggingface_hub hashed each file (on 8 threads)
            digests[file.path] = {"sha256": operation.upload_info.sha256.hex()}
        progress.add(sum(f.size for f in files), len(files))

    def finish(self, files: list[LocalFile], digests: dict[str, dict[str, str]], manifest: bytes) -> None:
        """The commit's tree, read back: every file there, with its bytes' digest."""
        there = self._tree(self.commit)
        at = f"{self.shown}@{self.commit[:12]}" if self.commit else self.shown
        for file in files:
            entry = there.get(file.path)
            if entry is None:
                raise PermanentError(f"{at}: {file.path} is not in the commit", Reasons.STORAGE_ERROR)
            known = digests.setdefault(file.path, {})
            if "sha256" not in entry and "git-sha1" not in known:  # a regular file: small, hashed now
                known.update(digest(file.real, file.size, ("git-sha1",)))
            if not self.same(entry, file, known):
                raise TransientError(f"{at}: {file.path} differs from the file sent")
