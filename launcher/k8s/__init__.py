"""The launcher as a Kubernetes client of its own pod: JobSet in-place restart (inplace.py) over a
minimal stdlib API client (api.py). Imported only when the feature is on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.k8s.inplace import InPlaceRestart


def in_place_restart(environ: Mapping[str, str]) -> InPlaceRestart | None:
    """The pod's agent of JobSet's in-place restart (launcher.core.lifecycle.InPlace): None unless
    the runtime turned it on (``JOBSET_NAME``), and nothing of this package imported then."""
    if not environ.get("JOBSET_NAME"):
        return None
    from launcher.k8s.inplace import InPlaceRestart

    return InPlaceRestart.from_env(environ)
