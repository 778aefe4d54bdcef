"""The manifest a reader trusts: written last, after every file it lists is in place and verified,
and removed first when a new export begins. Where it is, the export under it is complete."""

from __future__ import annotations

import json
import time

from launcher.export.tree import LocalFile

FORMAT = "trainer-launcher-export/1"


def manifest(files: list[LocalFile], digests: dict[str, dict[str, str]], node: str, source: str) -> bytes:
    """``digests``: each file's checksums by path, as the destination verified them."""
    return (
        json.dumps(
            {
                "format": FORMAT,
                "node": node,
                "source": source,
                "exportedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": [{"path": f.path, "size": f.size, **digests.get(f.path, {})} for f in files],
                "totalBytes": sum(f.size for f in files),
            },
            indent=1,
        ).encode()
        + b"\n"
    )
