"""The storage backends behind the engine's small interface: list() and read(file, start)."""

from __future__ import annotations

import os
import re
from typing import Iterator
from urllib.parse import quote

from launcher.initializers.engine import CorruptDataError, PermanentError, RemoteFile, TransientError, permanent_os_error
from launcher.initializers.http import get_range, open_url
from launcher.initializers.uri import StorageUri


class FileSource:
    """file:///path: a directory (every file below it) or one file, e.g. from a mounted PVC."""

    supports_range = True

    def __init__(self, uri: StorageUri):
        self.root = uri.path

    def list(self) -> list[RemoteFile]:
        if os.path.isfile(self.root):
            return [self._file(self.root, os.path.basename(self.root))]
        if not os.path.isdir(self.root):
            raise PermanentError(f"{self.root} does not exist", "NotFound")
        found = []
        for directory, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    found.append(self._file(path, os.path.relpath(path, self.root).replace(os.sep, "/")))
        return found

    @staticmethod
    def _file(path: str, relative: str) -> RemoteFile:
        stat = os.stat(path)
        return RemoteFile(relative, stat.st_size, None, f"{stat.st_mtime_ns}:{stat.st_size}", path)

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[bytes]:
        try:
            with open(file.key, "rb") as handle:
                handle.seek(start)
                left = None if end is None else end - start
                while chunk := handle.read(chunk_size if left is None else min(chunk_size, left)):
                    if left is not None:
                        left -= len(chunk)
                    yield chunk
        except FileNotFoundError:
            raise PermanentError(f"{file.key} disappeared", "NotFound") from None
        except OSError as error:
            if reason := permanent_os_error(error):
                raise PermanentError(f"{file.key}: {error.strerror}", reason) from None
            raise TransientError(f"{file.key}: {error.strerror}") from None


class HttpsSource:
    """https://host/path/file: one file; Range when the server accepts it."""

    def __init__(self, uri: StorageUri, shown: str):
        self.url, self.shown = uri.raw, shown
        self.supports_range = False

    def list(self) -> list[RemoteFile]:
        response = open_url(self.url, {}, method="HEAD", what=self.shown)
        response.close()
        length = response.headers.get("Content-Length")
        self.supports_range = response.headers.get("Accept-Ranges", "").lower() == "bytes"
        name = self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "download"
        version = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
        return [RemoteFile(name, int(length) if length and length.isdigit() else None, None, version, self.url)]

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[bytes]:
        return get_range(self.url, {}, start, chunk_size, self.shown, end=end)


# S3 error codes that no retry fixes, and the reason each becomes (any other 4xx but 429 is a
# permanent StorageError; 429, 5xx and codes without a status are transient).
S3_PERMANENT_CODES: dict[str, str] = {
    **dict.fromkeys(("NoSuchBucket", "NoSuchKey", "404", "NotFound"), "NotFound"),
    **dict.fromkeys(("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "401",
                     "ExpiredToken", "InvalidToken"), "AuthFailed"),
}
# botocore's own errors (raised before any request) that mean the configuration is wrong: a retry
# finds the same environment. The rest (EndpointConnectionError, timeouts, ...) are transient.
BOTOCORE_PERMANENT: dict[str, str] = {
    "NoCredentialsError": "NoCredentials",
    "PartialCredentialsError": "NoCredentials",
    "ProfileNotFound": "NoCredentials",
    "InvalidConfigError": "ConfigError",
    "NoRegionError": "ConfigError",
    "InvalidRegionError": "ConfigError",
    "ParamValidationError": "ConfigError",
}
_NO_CREDENTIALS = "no credentials found: set ACCESS_KEY_ID and SECRET_ACCESS_KEY (or ROLE_ARN)"


class S3Source:
    """s3://bucket/prefix: every object under the prefix, relative paths kept; any S3 endpoint."""

    supports_range = True

    def __init__(self, uri: StorageUri, settings):
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = uri.authority, uri.path
        session_args = {}
        if settings.access_key_id and settings.secret_access_key:
            session_args = {"aws_access_key_id": settings.access_key_id,
                            "aws_secret_access_key": settings.secret_access_key}
        region = None if settings.region in (None, "", "auto") else settings.region
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=64,
                        connect_timeout=10, read_timeout=60)
        session = boto3.session.Session(region_name=region or "us-east-1", **session_args)
        if settings.role_arn:
            sts = session.client("sts", endpoint_url=settings.endpoint, config=config)
            creds = self._call(lambda: sts.assume_role(RoleArn=settings.role_arn, RoleSessionName="trainer-launcher"),
                               "assume role")["Credentials"]
            session = boto3.session.Session(aws_access_key_id=creds["AccessKeyId"],
                                            aws_secret_access_key=creds["SecretAccessKey"],
                                            aws_session_token=creds["SessionToken"], region_name=region or "us-east-1")
        self.client = session.client("s3", endpoint_url=settings.endpoint, config=config)

    @staticmethod
    def _call(function, what: str):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return function()
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code == "InvalidRange":
                raise CorruptDataError(f"{what}: the partial file is longer than the object") from None
            if code in S3_PERMANENT_CODES:
                raise PermanentError(f"{what}: {code}", S3_PERMANENT_CODES[code]) from None
            if status in (401, 403):
                raise PermanentError(f"{what}: {code}", "AuthFailed") from None
            if status and status < 500 and status != 429:
                raise PermanentError(f"{what}: {code or status}", "StorageError") from None
            raise TransientError(f"{what}: {code or status}") from None
        except BotoCoreError as error:
            name = type(error).__name__
            if reason := BOTOCORE_PERMANENT.get(name):
                said = _NO_CREDENTIALS if name == "NoCredentialsError" else f"{name}: {' '.join(str(error).split())}"
                raise PermanentError(f"{what}: {said}", reason) from None
            raise TransientError(f"{what}: {name}") from None

    def list(self) -> list[RemoteFile]:
        def page_through() -> list[dict]:
            paginator = self.client.get_paginator("list_objects_v2")
            return [o for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix) for o in page.get("Contents", [])]

        objects = self._call(page_through, f"list s3://{self.bucket}/{self.prefix}")
        base = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        files = []
        for obj in objects:
            key = obj["Key"]
            if key.endswith("/"):
                continue  # a "directory" marker
            if key == self.prefix:
                relative = key.rsplit("/", 1)[-1]  # the prefix names one object
            elif key.startswith(base):
                relative = key[len(base):]
            else:
                continue  # s3://b/data also matches data2/...: not below the prefix
            etag = obj.get("ETag", "").strip('"')
            if etag and "-" not in etag and len(etag) == 32:
                checksum = ("md5", etag)
            else:
                checksum = self._multipart_checksum(key, etag)
            files.append(RemoteFile(relative, obj["Size"], checksum, etag, key))
        if not files:
            raise PermanentError(f"no objects under s3://{self.bucket}/{self.prefix}", "NotFound")
        return files

    def _multipart_checksum(self, key: str, etag: str) -> tuple[str, str] | None:
        """A multipart ETag is the md5 of the parts' md5s: with the part size (HEAD of part 1) we
        can recompute it from the bytes we received."""
        if not re.fullmatch(r"[0-9a-f]{32}-\d+", etag):
            return None
        try:
            head = self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1), f"head {key}")
        except (TransientError, PermanentError):
            return None
        part_size = head.get("ContentLength")
        return (f"s3-multipart:{part_size}", etag) if part_size else None

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError

        extra = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
        response = self._call(lambda: self.client.get_object(Bucket=self.bucket, Key=file.key, **extra),
                              f"get {file.key}")
        body = response["Body"]
        try:
            while True:
                try:
                    chunk = body.read(chunk_size)
                except (BotoCoreError, OSError) as error:
                    if "Checksum" in type(error).__name__:
                        raise CorruptDataError(f"{file.key}: the response failed its checksum") from None
                    raise TransientError(f"{file.key}: connection lost mid-body ({type(error).__name__})") from None
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()


class HubSource:
    """hf://owner/name[/subfolder]: a model or dataset repo at one commit, via huggingface_hub."""

    supports_range = True

    def __init__(self, uri: StorageUri, repo_type: str, token: str | None, revision: str | None):
        owner, _, rest = f"{uri.authority}/{uri.path}".partition("/")
        name, _, self.subfolder = rest.partition("/")
        self.repo_id, self.repo_type, self.token, self.revision = f"{owner}/{name}", repo_type, token, revision

    def _hub(self, function, what: str):
        from huggingface_hub.errors import (
            EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError,
        )

        try:
            return function()
        except GatedRepoError:
            raise PermanentError(f"{what}: gated repository (set ACCESS_TOKEN)", "AuthFailed") from None
        except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as error:
            raise PermanentError(f"{what}: {type(error).__name__}", "NotFound") from None
        except HfHubHTTPError as error:
            status = getattr(error.response, "status_code", 0) or 0
            if status in (401, 403):
                raise PermanentError(f"{what}: HTTP {status}", "AuthFailed") from None
            if 400 <= status < 500 and status != 429:
                raise PermanentError(f"{what}: HTTP {status}", "StorageError") from None
            raise TransientError(f"{what}: HTTP {status}") from None
        except (OSError, ConnectionError, TimeoutError) as error:
            raise TransientError(f"{what}: {type(error).__name__}") from None

    def list(self) -> list[RemoteFile]:
        from huggingface_hub import HfApi

        api = HfApi(token=self.token or False)
        what = f"hf://{self.repo_id}"
        info = self._hub(lambda: api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision),
                         what)
        self.commit = info.sha
        entries = self._hub(lambda: list(api.list_repo_tree(self.repo_id, path_in_repo=self.subfolder or None,
                                                            recursive=True, repo_type=self.repo_type,
                                                            revision=self.commit)), what)
        base = f"{self.subfolder.rstrip('/')}/" if self.subfolder else ""
        files = []
        for entry in entries:
            if not hasattr(entry, "size") or getattr(entry, "blob_id", None) is None:
                continue  # a folder
            lfs = getattr(entry, "lfs", None)
            checksum = ("sha256", lfs.sha256) if lfs else ("git-sha1", entry.blob_id)
            relative = entry.path[len(base):] if entry.path.startswith(base) else entry.path
            files.append(RemoteFile(relative, entry.size, checksum, self.commit, entry.path))
        if not files:
            raise PermanentError(f"{what}: no files{' under ' + self.subfolder if self.subfolder else ''}", "NotFound")
        return files

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[bytes]:
        from huggingface_hub import constants

        prefix = "datasets/" if self.repo_type == "dataset" else ""
        url = f"{constants.ENDPOINT}/{prefix}{self.repo_id}/resolve/{self.commit}/{quote(file.key)}"
        credentials = {"Authorization": f"Bearer {self.token}"} if self.token else None
        return get_range(url, {}, start, chunk_size, f"hf://{self.repo_id}/{file.key}", credentials, end)
