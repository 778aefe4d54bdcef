"""The torch image's first step when it is started as root: `run-as UID COMMAND...`.

Docker and podman start it as root unless told otherwise, and the Kubeflow SDK's container
backend tells them nothing: it bind-mounts the job's directory at /workspace, created root-owned
0755, and offers no way to choose a user. So the image starts as root, gives a root-owned
/workspace (the directory itself, not what is in it) to UID, drops to UID (its group, no other
group, its home as HOME where HOME was root's) and runs COMMAND. Kubernetes runs the image as the
runtimes' runAsUser, so this never runs there. Standard library only, started with -I -S."""

import os
import pwd
import sys

WORKSPACE = "/workspace"


def main(uid: int, command: list[str]) -> None:
    try:
        user = pwd.getpwuid(uid)
        gid, home = user.pw_gid, user.pw_dir
    except KeyError:  # a uid the image does not know: its own group, HOME as it is
        gid, home = uid, None
    try:
        if os.stat(WORKSPACE).st_uid == 0:
            os.chown(WORKSPACE, uid, gid)
    except FileNotFoundError:
        pass
    except OSError as error:  # a read-only mount, say: the job's own check names it at start
        print(f"trainer-launcher: {WORKSPACE} stays root's: {error.strerror}", file=sys.stderr)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if home and os.environ.get("HOME", "/root") == "/root":
        os.environ["HOME"] = home
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
