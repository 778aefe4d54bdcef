"""The initializers' knobs: LAUNCHER_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

# The initializers' own knobs (trainer-launcher init dataset|model); the upstream variables
# (STORAGE_URI, IGNORE_PATTERNS, ACCESS_TOKEN, ENDPOINT, ...) keep their names and have no flags.
INIT_KNOBS: dict[str, Knob] = {
    "output_path": Knob(
        "LAUNCHER_INIT_OUTPUT",
        "--output",
        "target directory; default OUTPUT_PATH, else /workspace/dataset or /workspace/model",
    ),
    "revision": Knob("LAUNCHER_INIT_REVISION", "--revision", "hf: the branch, tag or commit to fetch (default main)"),
    "concurrency": Knob("LAUNCHER_INIT_CONCURRENCY", "--concurrency", "parallel transfers (default 8)"),
    "chunk_size": Knob("LAUNCHER_INIT_CHUNK_SIZE", "--chunk-size", "bytes per read (default 8 MiB)"),
    "retries": Knob(
        "LAUNCHER_INIT_RETRIES", "--retries", "attempts per file after the first, with backoff (default 6)"
    ),
    "ranged_min": Knob(
        "LAUNCHER_INIT_RANGED_MIN",
        "--ranged-min",
        "files this big (bytes) are fetched by segments, resumable, and split into parallel byte ranges "
        "while one more stream raises the rate (default 64 MiB)",
    ),
    "extract": Knob("LAUNCHER_INIT_EXTRACT", "--extract", "https: extract a .tar.gz/.tgz/.zip into the target (1/0)"),
    "lease_ttl": Knob(
        "LAUNCHER_INIT_LEASE_TTL",
        "--lease-ttl",
        "one initializer writes a target at a time, holding a lease in it that it renews every "
        "TTL/3; another takes it over once it goes unrenewed this long (default 60s)",
    ),
    "lease_wait": Knob(
        "LAUNCHER_INIT_LEASE_WAIT",
        "--lease-wait",
        "how long to wait for another initializer's live lease on the target before exiting "
        "retryably (138); default 2h, 0: no limit",
    ),
}
