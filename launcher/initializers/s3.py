"""The s3:// source: every object under a prefix, from any S3 endpoint."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from launcher.core.outcome import Reason, Reasons
from launcher.initializers.errors import CorruptDataError, PermanentError, TransientError, refused_certificate
from launcher.initializers.listing import Chunk, RemoteFile

if TYPE_CHECKING:
    from launcher.initializers.uri import StorageUri

# S3 error codes (S3's own words: "NotFound" among them) that no retry fixes, and the reason each
# becomes (any other 4xx but 429 is a permanent StorageError; 429, 5xx and codes without a status
# are transient).
S3_PERMANENT_CODES: dict[str, Reason] = {
    **dict.fromkeys(("NoSuchBucket", "NoSuchKey", "404", "NotFound"), Reasons.NOT_FOUND),
    **dict.fromkeys(
        ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "401", "ExpiredToken", "InvalidToken"),
        Reasons.AUTH_FAILED,
    ),
}
# botocore's own errors (raised before any request) that mean the configuration is wrong: a retry
# finds the same environment. The rest (EndpointConnectionError, timeouts, ...) are transient.
BOTOCORE_PERMANENT: dict[str, Reason] = {
    "NoCredentialsError": Reasons.NO_CREDENTIALS,
    "PartialCredentialsError": Reasons.NO_CREDENTIALS,
    "ProfileNotFound": Reasons.NO_CREDENTIALS,
    "InvalidConfigError": Reasons.CONFIG_ERROR,
    "NoRegionError": Reasons.CONFIG_ERROR,
    "InvalidRegionError": Reasons.CONFIG_ERROR,
    "ParamValidationError": Reasons.CONFIG_ERROR,
}
# obstore's errors (the body path) that no retry fixes, by class, then by HTTP status.
OBSTORE_PERMANENT: dict[str, Reason] = {
    "FileNotFoundError": Reasons.NOT_FOUND,  # obstore's NotFoundError
    "NotFoundError": Reasons.NOT_FOUND,
    "PermissionDeniedError": Reasons.AUTH_FAILED,
    "UnauthenticatedError": Reasons.AUTH_FAILED,
    "UnknownConfigurationKeyError": Reasons.CONFIG_ERROR,
}
OBSTORE_PERMANENT_STATUS: dict[int, Reason] = {
    401: Reasons.AUTH_FAILED,
    403: Reasons.AUTH_FAILED,
    404: Reasons.NOT_FOUND,
}
_NO_CREDENTIALS = "no credentials found: set ACCESS_KEY_ID and SECRET_ACCESS_KEY (or ROLE_ARN)"


_loader = None  # botocore's model loader, shared by this process's sessions


def given_keys(access_key_id: str | None, secret_access_key: str | None, role_arn: str | None) -> bool:
    """Whether the keys are given and are the credentials (no role to assume with them): then the
    listing and the HEADs go without boto3 (launcher.initializers.s3_rest)."""
    return bool(access_key_id and secret_access_key and not role_arn)


def _region(region: str | None) -> str:
    return "us-east-1" if region in (None, "", "auto") else region


def classify(status: int, code: str, what: str) -> Exception:
    """An S3 error reply (HTTP status, S3's error code) as the exit table sorts it."""
    if code == "InvalidRange":
        return CorruptDataError(f"{what}: the partial file is longer than the object")
    if code in S3_PERMANENT_CODES:
        return PermanentError(f"{what}: {code}", S3_PERMANENT_CODES[code])
    if status in (401, 403):
        return PermanentError(f"{what}: {code}", Reasons.AUTH_FAILED)
    if status and status < 500 and status != 429:
        return PermanentError(f"{what}: {code or status}", Reasons.STORAGE_ERROR)
    return TransientError(f"{what}: {code or status}")


def _session(**credentials):
    """A boto3 session of its own (its own credentials) that reads botocore's service models once
    a process: a new session otherwise parses them again, about 0.1 s each."""
    import boto3
    import botocore.session

    global _loader
    core = botocore.session.Session()
    if _loader is None:
        _loader = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=core, **credentials)


def warm(keys_given: bool) -> None:
    """Load what this process's S3 source will need: obstore, and the standard library's client
    where the keys are given; else boto3 and botocore's model of S3 and its endpoints, by making
    a client that is never used (the first client costs about 0.2 s after the imports, the next
    one 0.02 s). No request is sent."""
    import obstore.store  # noqa: F401

    if keys_given:
        import launcher.initializers.s3_rest  # noqa: F401
    else:
        _session(region_name="us-east-1", aws_access_key_id="warm", aws_secret_access_key="warm").client("s3")


class S3Source:
    """s3://bucket/prefix: every object under the prefix, relative paths kept; any S3 endpoint."""

    supports_range = True

    def __init__(self, uri: StorageUri, settings):
        self.bucket, self.prefix = uri.authority, uri.path
        self._settings = settings
        self._endpoint, self._region = settings.endpoint, _region(settings.region)
        self._ca_bundle = settings.ca_bundle
        self._store = None
        self._store_lock = threading.Lock()
        self._boto3 = None  # (session, client), made on first use
        self._boto3_lock = threading.Lock()
        self.rest = None  # the listing and HEADs without boto3, where the keys are given
        if given_keys(settings.access_key_id, settings.secret_access_key, settings.role_arn):
            from launcher.initializers.s3_rest import S3Rest

            self.rest = S3Rest(
                self.bucket,
                settings.access_key_id,
                settings.secret_access_key,
                self._region,
                self._endpoint,
                self._ca_bundle,
                classify,
            )

    @property
    def client(self):
        """boto3's client: for a role, boto3's own credential chain, the export, and the keys
        obstore cannot read. Made on first use, under the lock the engine's threads share."""
        return self._boto3_pair()[1]

    def _boto3_pair(self):
        with self._boto3_lock:
            if self._boto3 is None:
                self._boto3 = self._make_boto3()
            return self._boto3

    def _make_boto3(self):
        from botocore.config import Config

        settings, region = self._settings, self._region
        session_args = {}
        if settings.access_key_id and settings.secret_access_key:
            session_args = {
                "aws_access_key_id": settings.access_key_id,
                "aws_secret_access_key": settings.secret_access_key,
            }
        config = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=64,
            connect_timeout=10,
            read_timeout=60,
        )
        session = _session(region_name=region, **session_args)
        if settings.role_arn:
            sts = session.client("sts", endpoint_url=settings.endpoint, config=config)
            creds = self.call(
                lambda: sts.assume_role(RoleArn=settings.role_arn, RoleSessionName="trainer-launcher"), "assume role"
            )["Credentials"]
            session = _session(
                aws_access_key_id=creds["AccessKeyId"],
                aws_secret_access_key=creds["SecretAccessKey"],
                aws_session_token=creds["SessionToken"],
                region_name=region,
            )
        return session, session.client("s3", endpoint_url=settings.endpoint, config=config)

    @staticmethod
    def call(function, what: str):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return function()
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            raise classify(status, code, what) from None
        except BotoCoreError as error:
            name = type(error).__name__
            if refused := refused_certificate(error, what, "AWS_CA_BUNDLE"):
                raise refused from None
            if reason := BOTOCORE_PERMANENT.get(name):
                said = _NO_CREDENTIALS if name == "NoCredentialsError" else f"{name}: {' '.join(str(error).split())}"
                raise PermanentError(f"{what}: {said}", reason) from None
            raise TransientError(f"{what}: {name}") from None

    def _objects(self) -> list[tuple[str, int, str]]:
        """(key, size, ETag) of every object under the prefix."""
        if self.rest is not None:
            return self.rest.listing(self.prefix)

        def page_through() -> list[dict]:
            paginator = self.client.get_paginator("list_objects_v2")
            return [
                o
                for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix)
                for o in page.get("Contents", [])
            ]

        objects = self.call(page_through, f"list s3://{self.bucket}/{self.prefix}")
        return [(o["Key"], o["Size"], o.get("ETag", "").strip('"')) for o in objects]

    def list(self) -> list[RemoteFile]:
        base = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        found = []
        for key, size, etag in self._objects():
            if key.endswith("/"):
                continue  # a "directory" marker
            if key == self.prefix:
                relative = key.rsplit("/", 1)[-1]  # the prefix names one object
            elif key.startswith(base):
                relative = key[len(base) :]
            else:
                continue  # s3://b/data also matches data2/...: not below the prefix
            found.append((relative, size, etag, key))
        checksums = _checksums([(key, etag) for _, _, etag, key in found], self._multipart_checksum)
        files = [
            RemoteFile(relative, size, checksum, etag, key)
            for (relative, size, etag, key), checksum in zip(found, checksums, strict=True)
        ]
        if not files:
            raise PermanentError(f"no objects under s3://{self.bucket}/{self.prefix}", Reasons.NOT_FOUND)
        return files

    def _multipart_checksum(self, key: str, etag: str) -> tuple[str, str] | None:
        """A multipart ETag is the md5 of the parts' md5s: with the part size (HEAD of part 1) we
        can recompute it from the bytes we received."""
        if not re.fullmatch(r"[0-9a-f]{32}-\d+", etag):
            return None
        try:
            if self.rest is not None:
                part_size = self.rest.part_size(key)
            else:
                head = self.call(
                    lambda: self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1), f"head {key}"
                )
                part_size = head.get("ContentLength")
        except (TransientError, PermanentError):
            return None
        return (f"s3-multipart:{part_size}", etag) if part_size else None

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[Chunk]:
        """The bytes come through obstore (Rust): boto3's per-request and per-chunk Python cost was
        this source's limit (bench/bench_init.py: client CPU per GB, and the ratio to s5cmd)."""
        store = self.body_store()
        import obstore

        options = {"range": (start, end)} if end is not None else {"range": {"offset": start}} if start else {}
        what = f"get {file.key}"
        try:
            stream = obstore.get(store, file.key, options=options).stream(min_chunk_size=chunk_size)
        except ValueError:  # obstore refuses some keys S3 holds (control characters): boto3 reads any
            yield from self._read_with_boto3(file, start, chunk_size, end)
            return
        except Exception as error:  # noqa: BLE001 - sorted below, never re-raised as is
            raise obstore_error(error, what) from None
        while True:
            try:
                chunk = next(stream)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - a broken body: the engine retries or resumes
                raise TransientError(f"{file.key}: connection lost mid-body ({type(error).__name__})") from None
            yield chunk

    def _read_with_boto3(self, file: RemoteFile, start: int, chunk_size: int, end: int | None) -> Iterator[bytes]:
        ranged = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
        body = self.call(
            lambda: self.client.get_object(Bucket=self.bucket, Key=file.key, **ranged), f"get {file.key!r}"
        )["Body"]
        try:
            yield from body.iter_chunks(chunk_size)
        except Exception as error:  # noqa: BLE001 - a broken body: the engine retries or resumes
            raise TransientError(f"{file.key!r}: connection lost mid-body ({type(error).__name__})") from None

    def body_store(self):
        """obstore's client for the bodies, built on the first read and shared by the engine's
        threads. boto3 stays the authority for credentials (every chain it knows, and the STS
        role), the listing and the multipart part size: that is where its breadth matters and its
        cost does not."""
        with self._store_lock:
            if self._store is None:
                from obstore.store import S3Store

                options = {
                    "connect_timeout": "10s",
                    "read_timeout": "60s",
                    "timeout": "24h",
                    "allow_http": bool(self._endpoint and self._endpoint.startswith("http://")),
                    **self._as_boto3_would_connect(),
                }
                # A few quick retries inside a request; the engine's own backoff covers the rest.
                retry = {
                    "max_retries": 2,
                    "retry_timeout": timedelta(seconds=30),
                    "backoff": {
                        "init_backoff": timedelta(milliseconds=100),
                        "max_backoff": timedelta(seconds=2),
                        "base": 2,
                    },
                }
                where = {"endpoint": self._endpoint, "virtual_hosted_style_request": False} if self._endpoint else {}
                if self.rest is not None:  # the keys are given
                    signing = {
                        "access_key_id": self._settings.access_key_id,
                        "secret_access_key": self._settings.secret_access_key,
                    }
                else:
                    credentials = self._boto3_pair()[0].get_credentials()
                    signing = (
                        {"credential_provider": _Credentials(credentials)} if credentials else {"skip_signature": True}
                    )
                # Over TLS a body goes unsigned: its SHA-256 would be one more pass over every byte.
                # boto3 does the same where the body is verified otherwise (the export compares
                # each ETag); over plain HTTP, as boto3, it is signed.
                tls = not (self._endpoint or "").startswith("http://")
                self._store = S3Store(
                    self.bucket,
                    region=self.rest.region if self.rest is not None else self._region,
                    client_options=options,
                    retry_config=retry,
                    unsigned_payload=tls,
                    **where,
                    **signing,
                )
        return self._store

    def _as_boto3_would_connect(self) -> dict:
        """The environment boto3 honours for its connections: HTTP(S)_PROXY with NO_PROXY, and
        AWS_CA_BUNDLE (a private CA in front of MinIO or Ceph)."""
        from urllib.parse import urlsplit
        from urllib.request import getproxies, proxy_bypass

        where = urlsplit(self._endpoint or f"https://{self.bucket}.s3.{self._region}.amazonaws.com")
        options = {}
        proxies = getproxies()
        if proxies.get(where.scheme) and not proxy_bypass(where.hostname or ""):
            options["proxy_url"] = proxies[where.scheme]
        if self._ca_bundle:
            try:
                with open(self._ca_bundle) as handle:
                    options["root_certificate"] = handle.read()
            except OSError as error:
                raise PermanentError(
                    f"AWS_CA_BUNDLE={self._ca_bundle}: {error.strerror}", Reasons.CONFIG_ERROR
                ) from None
        return options


def _checksums(
    objects: list[tuple[str, str]], multipart_checksum: Callable[[str, str], tuple[str, str] | None]
) -> list[tuple[str, str] | None]:
    """What each (key, ETag) is checked against: the ETag itself where it is an MD5; a multipart
    one needs its part size, a HEAD each (``multipart_checksum``), sent 16 at a time (one after
    the other, 300 multipart objects cost 300 round trips before the first byte)."""
    checksums: list[tuple[str, str] | None] = [
        ("md5", etag) if etag and "-" not in etag and len(etag) == 32 else None for _, etag in objects
    ]
    multipart = [index for index, checksum in enumerate(checksums) if checksum is None]
    if len(multipart) == 1:
        checksums[multipart[0]] = multipart_checksum(*objects[multipart[0]])
    elif multipart:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(multipart)), thread_name_prefix="head") as pool:
            heads = pool.map(lambda index: multipart_checksum(*objects[index]), multipart)
            for index, found in zip(multipart, heads, strict=True):
                checksums[index] = found
    return checksums


class _Credentials:
    """boto3's credentials handed to obstore: refreshable ones (STS, web identity, instance
    metadata) are asked again every few minutes, and boto3 renews them before they expire."""

    def __init__(self, credentials):
        self._credentials = credentials

    def __call__(self) -> dict:
        frozen = self._credentials.get_frozen_credentials()
        refreshable = hasattr(self._credentials, "refresh_needed")
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + timedelta(minutes=5) if refreshable else None,
        }


def obstore_error(error: Exception, what: str) -> Exception:
    """obstore's error, sorted like boto3's: its text names the URL and the server's reply, so
    only the class and the HTTP status are kept."""
    name = type(error).__name__
    status = re.search(r"status code: ([1-5]\d\d)\b", str(error))
    code = int(status.group(1)) if status else 0
    if code == 416:
        return CorruptDataError(f"{what}: the partial file is longer than the object")
    if refused := refused_certificate(error, what, "AWS_CA_BUNDLE"):
        return refused
    if reason := OBSTORE_PERMANENT.get(name) or OBSTORE_PERMANENT_STATUS.get(code):
        return PermanentError(f"{what}: {name}{f' (HTTP {code})' if code else ''}", reason)
    if code and code < 500 and code != 429:
        return PermanentError(f"{what}: HTTP {code}", Reasons.STORAGE_ERROR)
    return TransientError(f"{what}: {name}{f' (HTTP {code})' if code else ''}")
