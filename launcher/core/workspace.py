"""Say at start, in one line, when the job cannot write to /workspace.

The Kubeflow SDK's container backend bind-mounts at /workspace a host directory it creates itself
(owned by the user running the SDK, mode 0755). The launcher's image, started as root, gives it to
uid 1000 before dropping to it; any other image that runs as another uid (or ours, told `--user`) has
its first write there fail with PermissionError, often minutes into the job. A warning names the
directory, its owner, our uid and the ways out. Not an error: a job that never writes there is fine.
"""

from __future__ import annotations

import os
import stat

from launcher.core import log, settings

WORKSPACE = "/workspace"
# Set once the line is said, so a launcher nested in the same container (the SDK's `bash -lc`
# under `exec`, then the torchrun shim's launcher) does not say it again.
_SAID = "TRAINER_LAUNCHER_WORKSPACE_CHECKED"


def unwritable(directory: str = WORKSPACE) -> str | None:
    """Why we cannot write to ``directory``, or None. A directory still to be made is judged by
    its nearest existing parent, but never by ``/`` itself: no /workspace at all is not a problem."""
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if path == "/" or os.access(path, os.W_OK):
        return None
    try:
        info = os.stat(path)
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    if read_only:
        return f"{path} is mounted read-only: writes there will fail; mount it read-write"
    owner, uid = info.st_uid, os.geteuid()
    return (
        f"{path} is owned by uid {owner} (mode {stat.S_IMODE(info.st_mode):04o}) and this container runs as "
        f"uid {uid}: writes there will fail with PermissionError. Give it to this uid (Kubernetes: "
        f"securityContext.fsGroup: {os.getegid()}, as our runtimes set; docker/podman: start the launcher's image "
        f"without --user, and its entrypoint does) or run as uid {owner}"
    )


def warn_if_unwritable(directory: str = WORKSPACE) -> None:
    """One warning line when ``directory`` is not writable, once per container."""
    if settings.environ().get(_SAID):
        return
    message = unwritable(directory)
    if message:
        log.warning(message)
        os.environ[_SAID] = "1"  # inherited by what we start: the mark is the point
