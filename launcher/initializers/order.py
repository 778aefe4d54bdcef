"""What the download is told to do: the initializer's settings, validated by the pod's launcher,
as plain values that travel in the download's go word (launcher.initializers.fetch), so that the
download itself never loads pydantic: it starts while its launcher validates, and its own start
costs an interpreter and the engine's imports, nothing more."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Order:
    kind: str  # dataset | model
    target: str  # the directory, absolute
    storage_uri: str
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None
    access_token: str | None = None
    revision: str | None = None
    concurrency: int = 8
    chunk_size: int = 8 << 20
    retries: int = 6
    ranged_min: int = 64 << 20
    extract: bool = False
    # S3 (launcher.initializers.s3 reads them by these names, as it does the settings')
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str = "auto"
    role_arn: str | None = None
    ca_bundle: str | None = None

    @classmethod
    def of(cls, settings: Any, kind: str, target: str) -> Order:
        """From the initializer's validated settings (launcher.initializers.settings.InitSettings),
        field by field of the same name."""
        given = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in ("kind", "target")}
        return cls(kind=kind, target=target, **given)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Order:
        lists = ("allow_patterns", "ignore_patterns")  # JSON made the tuples lists
        patterns = {name: tuple(data[name]) for name in lists if data.get(name) is not None}
        return cls(**{**data, **patterns})
