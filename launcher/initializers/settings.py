"""The initializer contract (upstream's variable names) and the initializers' own knobs."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import (
    Invalid,
    Settings,
    field,
    int_in,
    knob_field,
    parse_bool,
    parse_duration,
    parse_url,
    parsed,
)
from launcher.initializers.knobs import INIT_KNOBS

_init_knob = functools.partial(knob_field, INIT_KNOBS)


def parse_patterns(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, tuple):
        return raw
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


def duration_in(low: float, high: float) -> Any:
    expected = f"a duration from {low:g}s to {high:g}s, like 60, 90s, 10m or 2h"

    def parse(raw: Any) -> float:
        try:
            value = parse_duration(raw)
        except Invalid:
            raise Invalid(expected) from None
        if not low <= value <= high:
            raise Invalid(expected)
        return value

    return parse


class S3Settings(Settings):
    """Where an S3 store is and who we are to it: upstream's initializer names, which the export
    (launcher.export) reads too, so that one Secret serves both ways."""

    endpoint: Annotated[str | None, NoDecode, parsed(parse_url)] = field("ENDPOINT", None, "s3: endpoint URL")
    access_key_id: str | None = field("ACCESS_KEY_ID", None, "s3: access key id", secret=True)
    secret_access_key: str | None = field("SECRET_ACCESS_KEY", None, "s3: secret access key", secret=True)
    region: str = field("REGION", "auto", "s3: region")
    role_arn: str | None = field("ROLE_ARN", None, "s3: role to assume")
    # boto3 reads it itself; the S3 bodies' client (obstore) is handed its content.
    ca_bundle: str | None = field("AWS_CA_BUNDLE", None, "s3: a PEM bundle of CAs to trust besides the system's")


class InitSettings(S3Settings):
    """The initializer contract (upstream names, an empty string means unset) and our extras."""

    storage_uri: str | None = field("STORAGE_URI", None, "where to download from")
    ignore_patterns: Annotated[tuple[str, ...] | None, NoDecode, parsed(parse_patterns)] = field(
        "IGNORE_PATTERNS", None, "comma-separated globs to skip"
    )
    allow_patterns: Annotated[tuple[str, ...] | None, NoDecode, parsed(parse_patterns)] = field(
        "ALLOW_PATTERNS", None, "comma-separated globs to fetch (all when unset)"
    )
    access_token: str | None = field("ACCESS_TOKEN", None, "hf: token", secret=True)
    output_path: str | None = _init_knob("output_path", None, "OUTPUT_PATH")
    revision: str | None = _init_knob("revision", None)
    concurrency: Annotated[int, NoDecode, parsed(int_in(1, 256, "a number of parallel transfers"))] = _init_knob(
        "concurrency", 8
    )
    chunk_size: Annotated[int, NoDecode, parsed(int_in(65536, 1 << 30, "a chunk size in bytes"))] = _init_knob(
        "chunk_size", 8 << 20
    )
    retries: Annotated[int, NoDecode, parsed(int_in(0, 100, "a retry count"))] = _init_knob("retries", 6)
    ranged_min: Annotated[int, NoDecode, parsed(int_in(1 << 20, 1 << 50, "a size in bytes"))] = _init_knob(
        "ranged_min", 64 << 20
    )
    extract: Annotated[bool, NoDecode, parsed(parse_bool)] = _init_knob("extract", False)
    # A missed heartbeat or two (a slow volume, a starved node) must not hand the target to a
    # second writer; a crashed holder on another node costs its successor this long.
    lease_ttl: Annotated[float, NoDecode, parsed(duration_in(1, 3600))] = _init_knob("lease_ttl", 60.0)
    # Longer than a healthy slow download (140 GB at 25 MB/s is ~95 min): the timeout is for a
    # holder that keeps renewing but never finishes, and each retryable exit spends one of the
    # initializer's backoffLimit retries.
    lease_wait: Annotated[float, NoDecode, parsed(duration_in(0, 7 * 24 * 3600))] = _init_knob("lease_wait", 7200.0)
