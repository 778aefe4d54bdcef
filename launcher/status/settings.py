"""Where to report the job's status: the Trainer status server contract (``KUBEFLOW_TRAINER_SERVER_*``).

Upstream's TrainJobStatus plugin injects three variables into every trainer container: the
endpoint's URL, the path of the server's CA certificate and the path of a projected service
account token (rotated by the kubelet, so it is a path, re-read before each send).

A bad value here never fails the job: reporting is a side channel, so :func:`status_env` turns
it into one warning line and reporting stays off.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic_settings import NoDecode

from launcher.core.outcome import ConfigError
from launcher.core.settings import Invalid, Settings, field, load, parse_host, parsed, raw_value

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"

_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


def parse_status_url(raw: Any) -> str:
    expected = "an https://HOST[:PORT]/PATH URL (the TrainJob's status endpoint)"
    text = str(raw).strip()
    if any(c.isspace() for c in text):
        raise Invalid(expected)
    try:
        parts = urlsplit(text)
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError:
        raise Invalid(expected) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise Invalid(expected)
    if parts.scheme == "http" and not _loopback(parts.hostname):
        # The bearer token goes with every request: over plain HTTP it would cross the pod network.
        raise Invalid("an https:// URL: the token must not travel in clear (plain http only on loopback)")
    if port == 0 or not parts.path.startswith("/") or parts.path == "/" or parts.fragment:
        raise Invalid(expected)
    parse_host(f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname)
    return text


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_readable_file(raw: Any) -> str:
    text = str(raw).strip()
    try:
        with open(text, "rb"):
            pass
    except OSError:
        raise Invalid("the path of a readable file") from None
    if not os.path.isfile(text):
        raise Invalid("the path of a readable file")
    return text


class StatusEnv(Settings):
    """Upstream's status server contract; all optional (no URL: no reporting)."""

    url: Annotated[str | None, NoDecode, parsed(parse_status_url)] = field(
        URL_ENV, None, "the TrainJob's status endpoint"
    )
    ca_cert: Annotated[str | None, NoDecode, parsed(parse_readable_file)] = field(
        CA_CERT_ENV, None, "the status server's CA certificate (a file)"
    )
    token: Annotated[str | None, NoDecode, parsed(parse_readable_file)] = field(
        TOKEN_ENV, None, "the projected service account token (a file, re-read before each send)"
    )


def _looks_like_path(value: str) -> bool:
    """A token pasted where its path belongs must not reach the logs: show only what is clearly a
    path on this machine (absolute, its first directory exists), never anything shaped like a JWT."""
    if not value.startswith("/") or _JWT.match(value) or any(c.isspace() for c in value):
        return False
    first = value.lstrip("/").split("/", 1)[0]
    return bool(first) and os.path.isdir("/" + first)


def _warning(error: ConfigError) -> str:
    if error.name == TOKEN_ENV and isinstance(error.value, str) and not _looks_like_path(error.value):
        error = ConfigError(error.name, error.value, error.expected, secret=True)
    return f"{error}; the job runs without reporting its status to the TrainJob"


def status_env() -> tuple[StatusEnv | None, str | None]:
    """(None, None): not asked to report. (env, None): report. (None, warning): asked, but the
    contract is broken; the warning is one line naming the variable, its value and the expectation."""
    if raw_value(StatusEnv, "url") is None:
        return None, None
    try:
        env = load(StatusEnv)
    except ConfigError as error:
        return None, _warning(error)
    if env.token is None:
        # Upstream's server authorizes every request by this token; without it each send is a 403.
        return None, _warning(ConfigError(TOKEN_ENV, None, "the path of the token file that goes with " + URL_ENV))
    return env, None
