"""The download's head start, made while its launcher validates and takes the target's lease: the
source's modules loaded, and its listing made from the environment as it is, not yet validated.

Only read from the source, nothing written: the target is the lease's, and nothing is written
there before the go word. The go word alone says what is fetched: the listing made ahead is used
only where the order names the same source with the same settings (``LISTED_FROM``), and only
if it ended at most ``MAX_AGE`` seconds before the word came (a launcher that waited for another
initializer's lease lists again: the source may have changed meanwhile). Where both hold, the
listing ahead is the one the download would have made, so the storage's refusal of it is the
download's, and is reported as such; anything else is dropped, and the download lists after its
word.

hf:// is not listed ahead: what its listing asks for (dataset or model, the revision) may come
from the launcher's flags, which only the word carries.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from launcher.initializers.order import Order

MAX_AGE = 10.0

# The order's fields a listing depends on, each from the variable the initializer's settings read
# it from (launcher.initializers.settings; tests/test_init_unit.py holds the two together).
LISTED_FROM = {
    "storage_uri": "STORAGE_URI",
    "endpoint": "ENDPOINT",
    "access_key_id": "ACCESS_KEY_ID",
    "secret_access_key": "SECRET_ACCESS_KEY",
    "region": "REGION",
    "role_arn": "ROLE_ARN",
    "ca_bundle": "AWS_CA_BUNDLE",
}
LISTED_AHEAD = ("s3", "file", "https", "http")


def _listed_from(order: Order) -> tuple:
    return tuple(getattr(order, name) for name in LISTED_FROM)


class Ahead:
    """On a thread of its own, so that the go word (or its absence) is read as soon as it comes.
    ``make_source(order, uri, say)``: the source, whose listing says its lines through ``say``."""

    def __init__(self, environ: Mapping[str, str], make_source: Callable):
        given: dict[str, Any] = {name: environ.get(variable) or None for name, variable in LISTED_FROM.items()}
        given["region"] = given["region"] or "auto"
        self._order = Order(kind="dataset", target="", **given)
        self._scheme = (self._order.storage_uri or "").strip().lower().partition("://")[0]
        self._make_source = make_source
        self._listed: tuple | None = None  # (source, listing, the lines its listing said)
        self._error: BaseException | None = None
        self._ended = 0.0
        self._done = threading.Event()
        threading.Thread(target=self._run, name="ahead", daemon=True).start()

    def _run(self) -> None:
        try:
            with contextlib.suppress(Exception):  # only a head start: the download meets it again, and reports it
                _load(self._scheme, self._order)
            if self._scheme in LISTED_AHEAD:
                self._list()
        except Exception:  # noqa: BLE001 - dropped: the download lists again after its word
            pass
        finally:
            self._ended = time.monotonic()
            self._done.set()

    def _list(self) -> None:
        from launcher.initializers.errors import PermanentError, TransientError
        from launcher.initializers.uri import parse_storage_uri

        said: list[str] = []
        try:
            source = self._make_source(self._order, parse_storage_uri(self._order.storage_uri), said.append)
            self._listed = (source, source.list(), said)
        except (PermanentError, TransientError, OSError) as error:  # the storage's answer: the download's own
            self._error = error

    def take(self, order: Order) -> tuple | None:
        """(source, listing, the lines its listing said) where ``order`` names what was listed
        ahead, recently; its error where that listing failed; else None. Waits for a listing
        still under way."""
        if self._scheme not in LISTED_AHEAD or _listed_from(order) != _listed_from(self._order):
            return None
        self._done.wait()
        if time.monotonic() - self._ended > MAX_AGE:
            return None
        if self._error is not None:
            raise self._error
        return self._listed


def _load(scheme: str, order: Order) -> None:
    """What the download from ``scheme`` will need: for S3, obstore, and boto3 with botocore's
    model of S3 unless the keys are given (about 0.7 s here, which would otherwise come after the
    go word)."""
    if scheme == "s3":
        from launcher.initializers import s3

        s3.warm(s3.given_keys(order.access_key_id, order.secret_access_key, order.role_arn))
    elif scheme in ("hf", "https", "http"):
        import importlib

        for module in ("huggingface_hub",) * (scheme == "hf") + ("launcher.initializers.http",):
            importlib.import_module(module)
