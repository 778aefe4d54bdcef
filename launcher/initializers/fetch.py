"""The download, as the process the initializer's launcher (launcher.initializers.job) runs under
the target's lease: ``python -m launcher.initializers.fetch --go-fd N``.

It is started before the launcher validates anything, and waits for its go word on fd N: the
order (launcher.initializers.order), the log format, the retryable exit codes and where to hand
its outcome. End of file without a word (the launcher found bad input, or lost the wait for the
lease): it leaves at once, quietly. It loads no pydantic and no settings: the word carries what
the launcher validated, so its start (an interpreter and the engine's imports) runs beside the
launcher's own instead of after it.

A SIGTERM ends it where it is (the default action): what it wrote is parts under the state
directory, resumed by the next run, and nothing half-written under a final name.
"""

from __future__ import annotations

import json
import os
import sys

from launcher.core import log
from launcher.core.outcome import Outcome, Reasons, internal_error
from launcher.core.report import hand_over
from launcher.initializers import archive
from launcher.initializers.engine import Engine, Summary
from launcher.initializers.errors import PermanentError, TransientError, failure_outcome
from launcher.initializers.listing import select
from launcher.initializers.order import Order
from launcher.initializers.uri import StorageUri, parse_storage_uri

# Upstream's model initializer skips these weight formats unless IGNORE_PATTERNS says otherwise.
MODEL_DEFAULT_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--go-fd" or not argv[1].isdigit():
        print(f"usage: python -m launcher.initializers.fetch --go-fd N (got {' '.join(argv)!r})", file=sys.stderr)
        return 2
    _load_ahead(os.environ.get("STORAGE_URI", ""))
    word = _read_word(int(argv[1]))
    if not word:
        return 0
    said = json.loads(word)
    log.configure(said["log_format"])
    try:
        outcome = fetch(Order.from_json(said["order"]))
    except Exception as error:  # noqa: BLE001 - the launcher's own bug: 70, as launcher.cli reports one
        import traceback

        traceback.print_exc()
        outcome = internal_error(error)
    return hand_over(outcome, frozenset(said["codes"]), said["handoff"])


def _load_ahead(storage_uri: str) -> None:
    """Load what the download of ``storage_uri`` (the variable as it is, not yet validated) will
    need, while the launcher validates: for S3, obstore, and boto3 with botocore's model of S3
    unless the keys are given (about 0.7 s here, which would otherwise come after the go word).
    Only a head start: the go word alone says what is fetched, and what fails here fails again
    where it is used, and is reported there."""
    scheme = storage_uri.strip().lower().partition("://")[0]
    try:
        if scheme == "s3":
            from launcher.initializers import s3

            names = ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "ROLE_ARN")
            s3.warm(s3.given_keys(*(os.environ.get(name) for name in names)))
        elif scheme in ("hf", "https", "http"):
            import importlib

            for module in ("huggingface_hub",) * (scheme == "hf") + ("launcher.initializers.http",):
                importlib.import_module(module)
    except Exception:  # noqa: BLE001 - reported where the download meets it
        pass


def _read_word(fd: int) -> bytes:
    """Everything the launcher writes before it closes its end."""
    chunks = []
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def fetch(order: Order) -> Outcome:
    """The download itself, under the lease the launcher holds."""
    uri = parse_storage_uri(order.storage_uri)
    try:
        summary = _download(order, uri)
    except (PermanentError, TransientError, OSError) as error:
        return failure_outcome(error, uri.shown, order.target)
    return Outcome.of(Reasons.SUCCEEDED, _said(summary, uri, order.target), extra={"uri": uri.shown})


def _source(order: Order, uri: StorageUri):
    from launcher.initializers import sources

    if uri.scheme == "file":
        return sources.FileSource(uri, log.info)
    if uri.scheme in ("https", "http"):
        return sources.HttpsSource(uri, uri.shown)
    if uri.scheme == "s3":
        from launcher.initializers.s3 import S3Source

        return S3Source(uri, order)
    return sources.HubSource(uri, order.kind, order.access_token, order.revision)


def _download(order: Order, uri: StorageUri) -> Summary:
    source = _source(order, uri)
    listed = source.list()
    ignore = order.ignore_patterns
    if ignore is None and order.kind == "model":
        ignore = MODEL_DEFAULT_IGNORE
    files = select(listed, order.allow_patterns, ignore)
    said = (
        f"init {order.kind}: {uri.shown} -> {order.target}: {len(files)} of {len(listed)} files, "
        f"{sum(f.size or 0 for f in files) / 1e6:.1f} MB"
    )
    if len(files) < len(listed):
        rules = [f"ALLOW_PATTERNS={','.join(order.allow_patterns)}"] if order.allow_patterns else []
        if ignore:
            default = " (a model's default)" if order.ignore_patterns is None else ""
            rules.append(f"IGNORE_PATTERNS={','.join(ignore)}{default}")
        said += f"; {len(listed) - len(files)} skipped by {' and '.join(rules)}"
    (log.info if files or not listed else log.warning)(said)
    summary = Engine(
        source, order.target, order.concurrency, order.chunk_size, order.retries, log.info, ranged_min=order.ranged_min
    ).run(files)
    if order.extract and uri.scheme in ("https", "http") and files and files[0].path.endswith(archive.SUFFIXES):
        archive.extract(os.path.join(order.target, files[0].path), order.target)
    return summary


def _said(summary: Summary, uri: StorageUri, target: str) -> str:
    rate = summary.bytes_fetched / max(summary.seconds, 1e-6) / 1e6
    resumed = f", resumed {summary.resumed_bytes / 1e6:.1f} MB" if summary.resumed_bytes else ""
    return (
        f"{uri.shown} -> {target}: {summary.files} files, fetched {summary.fetched} "
        f"({summary.bytes_fetched / 1e6:.1f} MB at {rate:.1f} MB/s{resumed}), "
        f"{summary.skipped} already complete, in {summary.seconds:.1f}s"
    )


if __name__ == "__main__":
    from launcher.core.process_exit import exit_now

    exit_now(main(sys.argv[1:]))
