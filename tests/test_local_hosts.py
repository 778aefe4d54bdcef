"""`trainer-launcher local` on a host without what a chroot or a minimal VM lacks: no /etc/hosts,
and a / that is not a mount point (so unshare cannot make its propagation private).

A real chroot, built as root inside a private mount namespace: a fresh directory with bind mounts
of the system, the repository and its Python, /proc, /dev and /tmp, and a minimal /etc (passwd,
group, resolv.conf) with or without a hosts file. ``auto`` must fall back to running without
namespaces and say why in one line; ``--isolation namespaces`` and ``local --mpi`` must fail in
one line. Never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RANKS, REPO, clean_env, launcher, rank_reports

# $0 the new root, then the directories to bind into it, "--", then the command to run inside.
_BUILD_AND_ENTER = r'''
set -e
root=$0
while [ "$1" != "--" ]; do
    mkdir -p "$root$1"
    mount --bind "$1" "$root$1"
    shift
done
shift
for link in bin lib lib64 sbin; do
    if [ -L "/$link" ]; then ln -s "$(readlink "/$link")" "$root/$link"; fi
done
mkdir -p "$root/etc"
grep '^root:' /etc/passwd > "$root/etc/passwd"
grep '^root:' /etc/group > "$root/etc/group"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || : > "$root/etc/resolv.conf"
if [ -n "$WITH_HOSTS" ]; then printf '127.0.0.1 localhost\n' > "$root/etc/hosts"; fi
exec chroot "$root" sh -c 'cd "$0" && exec "$@"' "$@"
'''


def _binds() -> list[str]:
    """What the chroot needs from the host: the system, the repository, its venv and the Python
    the venv was made from; /bin, /lib... as real directories where they are not symlinks."""
    wanted = ["/usr", "/opt", "/proc", "/dev", "/tmp", str(REPO), sys.prefix, sys.base_prefix]
    wanted += [f"/{d}" for d in ("bin", "lib", "lib64", "sbin") if os.path.isdir(f"/{d}") and not os.path.islink(f"/{d}")]
    real = sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)})
    # Drop what an earlier entry already brings in.
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


@pytest.fixture
def chroot_run(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: building a chroot takes bind mounts in a private mount namespace, and chroot(2)")
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}(1) to build the chroot")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this host cannot make a private mount namespace to build the chroot in: {probe.stderr.strip()}")

    def run(*args: str, with_hosts: bool = False, timeout: float = 300) -> tuple[subprocess.CompletedProcess, Path]:
        root = tmp_path / "root"
        root.mkdir()
        log = tmp_path / "termination.json"  # under /tmp: the same path inside the chroot
        env = clean_env(LAUNCHER_TERMINATION_LOG=str(log), REPORT_DIR=str(tmp_path / "ranks"),
                        WITH_HOSTS="1" if with_hosts else "")
        (tmp_path / "ranks").mkdir()
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _BUILD_AND_ENTER, str(root),
                *_binds(), "--", str(REPO), *launcher(*args)]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        assert "Traceback" not in result.stdout + result.stderr, result.stderr
        return result, log

    return run


def _local_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("trainer-launcher: local:")]


def test_without_etc_hosts_auto_runs_without_namespaces_and_says_why_once(chroot_run, tmp_path):
    result, log = chroot_run("local", "--nnodes", "2", "--nproc-per-node", "1", "--", RANKS)
    assert result.returncode == 0, result.stderr
    (line,) = _local_lines(result.stderr)
    assert "master 127.0.0.1:" in line
    assert "(no per-node namespaces: there is no /etc/hosts to bind each node's private one over)" in line
    reports = rank_reports(tmp_path / "ranks")
    assert sorted(reports) == [0, 1] and {r["allreduce"] for r in reports.values()} == {3.0}
    assert json.loads(log.read_text())["exitCode"] == 0


def test_when_root_is_not_a_mount_point_auto_runs_without_namespaces_and_says_why_once(chroot_run, tmp_path):
    result, _ = chroot_run("local", "--nnodes", "2", "--nproc-per-node", "1", "--", RANKS, with_hosts=True)
    assert result.returncode == 0, result.stderr
    (line,) = _local_lines(result.stderr)
    assert "master 127.0.0.1:" in line
    assert "no per-node namespaces: unshare: cannot change root filesystem propagation" in line
    assert "(/ is not a mount point, as in a chroot)" in line
    assert sorted(rank_reports(tmp_path / "ranks")) == [0, 1]


def _one_error_line(result: subprocess.CompletedProcess, log: Path, names: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert names in lines[0]
    message = json.loads(log.read_text())
    assert (message["exitCode"], message["retryable"], message["reason"]) == (2, False, "ConfigError")
    return lines[0]


@pytest.mark.parametrize("with_hosts, why", [
    (False, "there is no /etc/hosts to bind each node's private one over"),
    (True, "cannot change root filesystem propagation"),
], ids=["no-etc-hosts", "root-not-a-mount-point"])
def test_namespaces_asked_for_explicitly_fail_in_one_line(chroot_run, with_hosts, why):
    result, log = chroot_run("local", "--isolation", "namespaces", "--nnodes", "2", "--", RANKS, with_hosts=with_hosts)
    line = _one_error_line(result, log, "--isolation='namespaces'")
    assert why in line and "--isolation auto or none" in line


@pytest.mark.parametrize("with_hosts, why", [
    (False, "there is no /etc/hosts to bind each node's private one over"),
    (True, "cannot change root filesystem propagation"),
], ids=["no-etc-hosts", "root-not-a-mount-point"])
def test_local_mpi_which_needs_namespaces_fails_in_one_line(chroot_run, with_hosts, why):
    result, log = chroot_run("local", "--mpi", "openmpi", "--nnodes", "2", "--", "true", with_hosts=with_hosts)
    line = _one_error_line(result, log, "--mpi='openmpi'")
    assert why in line
