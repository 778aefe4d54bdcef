"""What the property-based tests (tests/test_fuzz_*.py) share: their two profiles, and the
strategies for the text a hostile or careless world hands the launcher.

Profiles (hypothesis's own mechanism, chosen by ``LAUNCHER_FUZZ``):
- ``ci`` (the default): a bounded number of cases per property, so every fuzzer together stays
  within a few minutes of the README's test command;
- ``long``: fifty times as many, for a night or a release:
  ``LAUNCHER_FUZZ=long .venv/bin/python -m pytest -m fuzz --timeout 0 --hypothesis-show-statistics``.

No example database is written (a run finds its cases afresh; a failure prints the case to paste
into an ``@example``), so a run leaves nothing in the checkout.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings, strategies as st

_SHARED = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                      HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=150, **_SHARED)
settings.register_profile("long", max_examples=7500, **_SHARED)
settings.load_profile(os.environ.get("LAUNCHER_FUZZ", "ci"))

# Text an environment variable can hold: anything but NUL (and lone surrogates, which no
# environment can carry).
ENV_CHARACTERS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")

# Values that sit on the edges of what the launcher's parsers accept, mixed with anything at all.
EDGE_VALUES = st.sampled_from([
    "", " ", "0", "1", "-1", "2", "8", "65535", "65536", "99999999999999999999", "1e3", "nan", "inf",
    "2.5", "1:2", "3:2", "1:", ":4", "auto", "gpu", "cpu", "true", "false", "yes", "off", "on",
    "tj-node-0-0.tj", "tj-node-0-0.tj:29500", "127.0.0.1", "[::1]:29500", "::1", "localhost:0",
    "a..b", "-host", "http://x", "https://127.0.0.1:1/x", "s3://b/../k", "hf://o/n", "file:///etc",
    "130,137,138", "130,,", "999", "(", "[a-", ".*", "10s", "5m", "-5s", "1h30m", "0x10",
    "/dev/null", "/nonexistent/dir/file", "../../etc/passwd", "a" * 300, "é", "\n", "x\ny",
    "${HOME}", "$(id)", "`id`", "'", '"', "\\",
])
ENV_VALUES = st.one_of(EDGE_VALUES, st.text(ENV_CHARACTERS, max_size=40),
                       st.integers(-(2 ** 70), 2 ** 70).map(str))


def hostile_bytes(max_size: int = 256) -> st.SearchStrategy[bytes]:
    """Bytes a peer may send in place of a protocol's line: random, JSON-shaped, deeply nested,
    unterminated, or a valid-looking line with the wrong types."""
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12)
    import json

    return st.one_of(
        st.binary(max_size=max_size),
        json_values.map(lambda value: json.dumps(value).encode() + b"\n"),
        st.integers(1, 5000).map(lambda depth: b"[" * depth + b"\n"),
        st.integers(1, 5000).map(lambda depth: b'{"a":' * depth + b"\n"),
        st.text(max_size=max_size).map(lambda text: text.encode("utf-8", "surrogatepass")),
    )
