"""The directory to export, listed: every file below it, as the file:// initializer lists a volume
(a link is followed only to a file inside the tree; anything else is skipped in one line). The
launcher's own state (an initializer's ``.trainer-launcher/``, an export's manifest) stays behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError
from launcher.initializers.state import STATE_DIR

MANIFEST = ".trainer-launcher-export.json"


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, '/'-separated: where it lands under the destination
    size: int
    real: str  # the file to read (a link's target inside the tree)
    mtime_ns: int


def list_tree(root: str, log: Callable[[str], None], name: str = "EXPORT_PATH") -> list[LocalFile]:
    """``name``: where the path came from (the flag or the variable), for the one line of refusal."""
    from launcher.initializers.sources import FileSource
    from launcher.initializers.uri import StorageUri

    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist: the job wrote nothing there"
        raise PermanentError(f"{name}={root} {what}", Reasons.NOT_FOUND)
    files = []
    for found in FileSource(StorageUri("file", "", root, f"file://{root}"), log).list():
        if found.path.split("/", 1)[0] in (STATE_DIR, MANIFEST):
            continue
        mtime_ns = int(found.version.split(":", 1)[0])
        files.append(LocalFile(found.path, found.size or 0, found.key, mtime_ns))
    return sorted(files, key=lambda f: f.path)
