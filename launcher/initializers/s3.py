"""The s3:// source: every object under a prefix, from any S3 endpoint."""

from __future__ import annotations

import re
from typing import Iterator

from launcher.initializers.engine import CorruptDataError, PermanentError, RemoteFile, TransientError

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
