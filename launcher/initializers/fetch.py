"""The download, as the process the initializer's launcher (launcher.initializers.job) runs under
the target's lease: ``python -m launcher.initializers.fetch --go-fd N``.

It is started before the launcher validates anything, and waits for its go word on fd N: the
order (launcher.initializers.order), the log format, the retryable exit codes and where to hand
its outcome. End of file without a word (the launcher found bad input, or lost the wait for the
lease): it leaves at once, quietly. It loads no pydantic and no settings: the word carries what
the launcher validated, so its start (an interpreter, the engine's imports, and the source's
listing where the word confirms it: launcher.initializers.ahead) runs beside the launcher's own
instead of after it.

A SIGTERM ends it where it is (the default action): what it wrote is parts under the state
directory, resumed by the next run, and nothing half-written under a final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.core import log
from launcher.initializers.ahead import Ahead
from launcher.initializers.order import Order

if TYPE_CHECKING:  # loaded after the listing ahead has begun: its request goes out first
    from launcher.core.outcome import Outcome
    from launcher.initializers.engine import Summary
    from launcher.initializers.uri import StorageUri

# Upstream's model initializer skips these weight formats unless IGNORE_PATTERNS says otherwise.
MODEL_DEFAULT_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--go-fd" or not argv[1].isdigit():
        print(f"usage: python -m launcher.initializers.fetch --go-fd N (got {' '.join(argv)!r})", file=sys.stderr)
        return 2
    ahead = Ahead(os.environ, _source)
    _load_the_download()  # beside the listing's requests, while the launcher validates
    word = _read_word(int(argv[1]))
    if not word:
        return 0
    said = json.loads(word)
    log.configure(said["log_format"])
    from launcher.core.outcome import internal_error
    from launcher.core.report import hand_over

    try:
        outcome = fetch(Order.from_json(said["order"]), ahead)
    except Exception as error:  # noqa: BLE001 - the launcher's own bug: 70, as launcher.cli reports one
        import traceback

        traceback.print_exc()
        outcome = internal_error(error)
    return hand_over(outcome, frozenset(said["codes"]), said["handoff"])


def _load_the_download() -> None:
    """The download's own modules, loaded before its word: only a head start, since each is
    imported again where it is used (an import the listing's thread holds up is simply left)."""
    with contextlib.suppress(Exception):
        import launcher.core.outcome
        import launcher.core.report
        import launcher.initializers.archive
        import launcher.initializers.engine  # noqa: F401


def _read_word(fd: int) -> bytes:
    """Everything the launcher writes before it closes its end."""
    chunks = []
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def fetch(order: Order, ahead: Ahead) -> Outcome:
    """The download itself, under the lease the launcher holds."""
    from launcher.core.outcome import Outcome, Reasons
    from launcher.initializers.errors import PermanentError, TransientError, failure_outcome
    from launcher.initializers.uri import parse_storage_uri

    uri = parse_storage_uri(order.storage_uri)
    try:
        summary = _download(order, uri, ahead)
    except (PermanentError, TransientError, OSError) as error:
        return failure_outcome(error, uri.shown, order.target)
    return Outcome.of(Reasons.SUCCEEDED, _said(summary, uri, order.target), extra={"uri": uri.shown})


def _source(order: Order, uri: StorageUri, say: Callable[[str], None] = log.info):
    from launcher.initializers import sources

    if uri.scheme == "file":
        return sources.FileSource(uri, say)
    if uri.scheme in ("https", "http"):
        return sources.HttpsSource(uri, uri.shown)
    if uri.scheme == "s3":
        from launcher.initializers.s3 import S3Source

        return S3Source(uri, order)
    return sources.HubSource(uri, order.kind, order.access_token, order.revision)


def _download(order: Order, uri: StorageUri, ahead: Ahead) -> Summary:
    from launcher.initializers import archive
    from launcher.initializers.engine import Engine
    from launcher.initializers.listing import select

    made = ahead.take(order)
    if made is not None:
        source, listed, said = made
        for line in said:
            log.info(line)
    else:
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
