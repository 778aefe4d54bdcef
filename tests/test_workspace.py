"""launcher/workspace.py: the one line that says the job cannot write to /workspace. Checked as an
unprivileged uid (root may write anywhere), in a forked child that drops to it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from launcher.core.workspace import unwritable

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as another uid")


def unwritable_as_nobody(directory: Path | str) -> str:
    """``unwritable(directory)`` in a forked child that became uid 65534 (it cannot read this
    checkout to start a new interpreter)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write_end, str(unwritable(str(directory))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as said:
        message = said.read()
    os.waitpid(pid, 0)
    return message


@pytest.fixture
def root_owned() -> Path:
    # Not under tmp_path: pytest's base directory is 0700, so nobody could not even look.
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        workspace = Path(top) / "workspace"
        workspace.mkdir(mode=0o755)
        yield workspace


def test_a_root_owned_directory_names_its_owner_our_uid_and_the_ways_out(root_owned):
    message = unwritable_as_nobody(root_owned)
    assert message == (
        f"{root_owned} is owned by uid 0 (mode 0755) and this container runs as uid {NOBODY}: writes there will fail "
        f"with PermissionError. Give it to this uid (Kubernetes: securityContext.fsGroup: {NOBODY}, as our runtimes "
        "set; docker/podman: start the launcher's image without --user, and its entrypoint does) or run as uid 0")


def test_a_target_still_to_be_made_is_judged_by_its_nearest_existing_parent(root_owned):
    assert unwritable_as_nobody(root_owned / "dataset" / "train").startswith(f"{root_owned} is owned by uid 0")


def test_writable_or_absent_directories_say_nothing(root_owned):
    root_owned.chmod(0o777)
    assert unwritable_as_nobody(root_owned) == "None"
    assert unwritable_as_nobody(root_owned / "dataset") == "None"
    # No /workspace at all (a laptop, a cluster without the volume): / itself is never judged.
    assert unwritable_as_nobody("/no-such-workspace/dataset") == "None"
