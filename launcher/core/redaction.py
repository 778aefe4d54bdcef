"""Secrets out of everything the launcher prints: the values of variables whose names say they
are secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY, *_PASSWORD, ...), wherever they appear, in every log
line, in plan's JSON and in the termination message. A user who passes such a value on the
command line as well (``--hub_token hf_...``) sees *** there too.

Stdlib only: the log module uses it on every line, before pydantic is loaded.
"""

from __future__ import annotations

import os
import re

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY")


def secret_values() -> list[str]:
    """Values of variables whose names say they are secret, longest first."""
    return sorted(
        # Real secrets are long; redacting a 4-letter value like "test" would only mangle paths.
        (v for k, v in os.environ.items() if SECRET_NAME.search(k.upper()) and len(v) >= 8),
        key=len,
        reverse=True,
    )


def redact(text: str, secrets: list[str] | None = None) -> str:
    for secret in secret_values() if secrets is None else secrets:
        text = text.replace(secret, "***")
    return text
