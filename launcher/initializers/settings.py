"""The initializer contract (upstream's variable names) and the initializers' own knobs."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import Settings, field, int_in, knob_field, parse_bool, parse_url, parsed
from launcher.initializers.knobs import INIT_KNOBS

_init_knob = functools.partial(knob_field, INIT_KNOBS)


def parse_patterns(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, tuple):
        return raw
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


class InitSettings(Settings):
    """The initializer contract (upstream names, an empty string means unset) and our extras."""

    storage_uri: str | None = field("STORAGE_URI", None, "where to download from")
    ignore_patterns: Annotated[tuple[str, ...] | None, NoDecode, parsed(parse_patterns)] = field(
        "IGNORE_PATTERNS", None, "comma-separated globs to skip")
    allow_patterns: Annotated[tuple[str, ...] | None, NoDecode, parsed(parse_patterns)] = field(
        "ALLOW_PATTERNS", None, "comma-separated globs to fetch (all when unset)")
    access_token: str | None = field("ACCESS_TOKEN", None, "hf: token", secret=True)
    endpoint: Annotated[str | None, NoDecode, parsed(parse_url)] = field("ENDPOINT", None, "s3: endpoint URL")
    access_key_id: str | None = field("ACCESS_KEY_ID", None, "s3: access key id", secret=True)
    secret_access_key: str | None = field("SECRET_ACCESS_KEY", None, "s3: secret access key", secret=True)
    region: str = field("REGION", "auto", "s3: region")
    role_arn: str | None = field("ROLE_ARN", None, "s3: role to assume")
    output_path: str | None = _init_knob("output_path", None, "OUTPUT_PATH")
    revision: str | None = _init_knob("revision", None)
    concurrency: Annotated[int, NoDecode, parsed(int_in(1, 256, "a number of parallel transfers"))] = _init_knob(
        "concurrency", 8)
    chunk_size: Annotated[int, NoDecode, parsed(int_in(65536, 1 << 30, "a chunk size in bytes"))] = _init_knob(
        "chunk_size", 8 << 20)
    retries: Annotated[int, NoDecode, parsed(int_in(0, 100, "a retry count"))] = _init_knob("retries", 6)
    ranged_min: Annotated[int, NoDecode, parsed(int_in(1 << 20, 1 << 50, "a size in bytes"))] = _init_knob(
        "ranged_min", 64 << 20)
    extract: Annotated[bool, NoDecode, parsed(parse_bool)] = _init_knob("extract", False)
