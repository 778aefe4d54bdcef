"""The engine's file:// path: kernel copies (copy_file_range, sendfile, pread/pwrite), verification
by the source's identity, batched durability, resume after kill -9, the real CLI. Real files on
real file systems (ext4 under the test's tmp_path, tmpfs at /dev/shm) and real processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, clean_env, launcher, wait_for
from launcher.initializers import commit
from launcher.initializers.engine import Engine
from launcher.initializers.errors import TransientError
from launcher.initializers.sources import FileSource
from launcher.initializers.uri import parse_storage_uri

MiB = 1 << 20


def make_tree(root: Path) -> dict[str, bytes]:
    tree = {
        "config.json": b"{}",
        "empty.txt": b"",
        "nested/deep/shard-0.bin": os.urandom(3 * MiB + 17),
        "nested/small.bin": os.urandom(70_000),
        "ünïcode name.txt": "ü".encode(),
    }
    tree.update({f"many/{i:03d}.bin": os.urandom(4096) for i in range(40)})
    for relative, data in tree.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tree


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".trainer-launcher" not in p.parts}


def copy(source: Path, out: Path, **kwargs):
    file_source = FileSource(parse_storage_uri(f"file://{source}"))
    logged: list[str] = []
    engine = Engine(file_source, str(out), concurrency=4, chunk_size=MiB, log=logged.append,
                    sleep=lambda _: None, **kwargs)
    return engine.run(file_source.list()), engine, logged


@pytest.fixture
def count_calls(monkeypatch):
    """Counts calls of os.copy_file_range / os.sendfile / os.pread (the engine calls them through
    os, so this wraps exactly what it uses; the calls still go to the kernel)."""
    calls = {"copy_file_range": 0, "sendfile": 0, "pread": 0}
    for name in calls:
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(os, name, counted)
    return calls


def test_the_kernel_copies_a_tree_byte_identical_and_a_rerun_copies_nothing(tmp_path, count_calls):
    source, out = tmp_path / "pvc", tmp_path / "out"
    tree = make_tree(source)
    summary, _, _ = copy(source, out)
    assert files_under(out) == tree
    assert count_calls["copy_file_range"] >= len([d for d in tree.values() if d])  # one per non-empty file at least
    assert count_calls["pread"] == 0  # Python never held the bytes
    manifest = json.loads((out / ".trainer-launcher" / "manifest.json").read_text())["files"]
    assert set(manifest) == set(tree) and manifest["nested/deep/shard-0.bin"]["size"] == len(tree["nested/deep/shard-0.bin"])
    assert not list((out / ".trainer-launcher" / "parts").iterdir())  # no part or resume record left behind
    assert summary.fetched == len(tree)

    count_calls.update(dict.fromkeys(count_calls, 0))
    again, _, _ = copy(source, out)
    assert (again.fetched, again.skipped, again.bytes_fetched) == (0, len(tree), 0)
    assert sum(count_calls.values()) == 0


@pytest.mark.parametrize("direction", ["tmpfs->ext4", "ext4->tmpfs"])
def test_across_file_systems_the_copy_works_whichever_way_the_kernel_allows(tmp_path, direction):
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        shm_dir = Path(shm)
        source, out = (shm_dir / "src", tmp_path / "out") if direction == "tmpfs->ext4" else (tmp_path / "src", shm_dir / "out")
        tree = make_tree(source)
        summary, engine, _ = copy(source, out)
        assert files_under(out) == tree
        assert summary.fetched == len(tree)
        # Linux 6.x declines copy_file_range between different file system types (EXDEV): sendfile then.
        devices = (os.stat(source).st_dev, os.stat(out).st_dev)
        assert engine._copy_method.get(devices, 0) in (0, 1)  # the kernel copied: copy_file_range or sendfile


def test_when_the_kernel_declines_both_copies_the_bytes_go_through_pread_pwrite(tmp_path, monkeypatch, count_calls):
    def declined(code):
        def call(*_args):
            raise OSError(code, os.strerror(code))
        return call

    monkeypatch.setattr(os, "copy_file_range", declined(errno.EXDEV))
    monkeypatch.setattr(os, "sendfile", declined(errno.EINVAL))
    source, out = tmp_path / "pvc", tmp_path / "out"
    tree = make_tree(source)
    _, engine, _ = copy(source, out)
    assert files_under(out) == tree
    assert count_calls["pread"] >= 4  # the 3 MiB file alone takes 4 chunks of 1 MiB
    assert set(engine._copy_method.values()) == {2}  # learned once per pair of file systems


def rewrite(path: Path, generation: int) -> None:
    """New bytes, same size, and an mtime of its own (so the change is visible whatever the
    file system's timestamp granularity)."""
    path.write_bytes(os.urandom(path.stat().st_size))
    stamp = 1_000_000_000_000_000_000 + generation
    os.utime(path, ns=(stamp, stamp))


def test_a_source_rewritten_during_the_copy_is_copied_again(tmp_path, monkeypatch):
    source, out = tmp_path / "pvc", tmp_path / "out"
    tree = make_tree(source)
    shard = source / "nested/deep/shard-0.bin"
    os.utime(shard, ns=(10**18 - 1, 10**18 - 1))
    real = os.copy_file_range
    rewritten = []

    def copy_then_rewrite(src, dst, count, *offsets):
        copied = real(src, dst, count, *offsets)
        if not rewritten and os.fstat(src).st_ino == shard.stat().st_ino:
            rewrite(shard, 1)  # after the first MiB landed: the copy holds old and new bytes
            rewritten.append(True)
        return copied

    monkeypatch.setattr(os, "copy_file_range", copy_then_rewrite)
    summary, _, logged = copy(source, out)
    assert rewritten
    assert any("changed while it was copied" in line for line in logged), logged
    assert (out / "nested/deep/shard-0.bin").read_bytes() == shard.read_bytes()  # the new bytes, whole
    assert summary.fetched == len(tree)


def test_a_source_that_keeps_changing_is_never_committed(tmp_path, monkeypatch):
    source, out = tmp_path / "pvc", tmp_path / "out"
    make_tree(source)
    shard = source / "nested/deep/shard-0.bin"
    real = os.copy_file_range
    generation = [0]

    def copy_then_rewrite(src, dst, count, *offsets):
        copied = real(src, dst, count, *offsets)
        if os.fstat(src).st_ino == shard.stat().st_ino:
            generation[0] += 1
            rewrite(shard, generation[0])
        return copied

    monkeypatch.setattr(os, "copy_file_range", copy_then_rewrite)
    with pytest.raises(TransientError, match="changed"):
        copy(source, out, retries=2)
    assert not (out / "nested/deep/shard-0.bin").exists()  # nothing partial under its final name
    manifest = json.loads((out / ".trainer-launcher" / "manifest.json").read_text())["files"]
    assert "nested/deep/shard-0.bin" not in manifest
    assert "config.json" in manifest  # what finished before the failure is kept


def test_a_journal_line_is_written_only_after_the_file_is_durable_under_its_name(tmp_path, monkeypatch):
    """The order a node crash depends on: sync, then rename (bytes durable first), sync, then
    the journal line (rename durable first). Observed at each sync of a real run."""
    source, out = tmp_path / "pvc", tmp_path / "out"
    tree = make_tree(source)
    journal = out / ".trainer-launcher" / "manifest.journal"
    seen: list[tuple[set, set]] = []
    real = commit._syncfs

    def observed(fd):
        journaled = {json.loads(line)["path"] for line in journal.read_text().splitlines()} if journal.exists() else set()
        seen.append((set(files_under(out)), journaled))
        real(fd)

    monkeypatch.setattr(commit, "_syncfs", observed)
    copy(source, out)
    assert len(seen) >= 2
    assert seen[0] == (set(), set())  # nothing under a final name before a sync made its bytes durable
    for index in range(1, len(seen)):
        # a line names only files that were in place at the sync before the one preceding the line
        assert seen[index][1] <= seen[index - 1][0]
    assert files_under(out) == tree
    assert set(json.loads((out / ".trainer-launcher" / "manifest.json").read_text())["files"]) == set(tree)


KILLABLE = textwrap.dedent("""
    import os, sys, threading
    from launcher.initializers.engine import Engine
    from launcher.initializers.sources import FileSource
    from launcher.initializers.uri import parse_storage_uri

    source, out, marker = sys.argv[1:4]
    real = os.copy_file_range
    def copy_then_hang(*args):
        copied = real(*args)
        open(marker, "w").close()  # one chunk is in the part: the parent kills us here
        threading.Event().wait()
    os.copy_file_range = copy_then_hang
    file_source = FileSource(parse_storage_uri("file://" + source))
    Engine(file_source, out, concurrency=1, chunk_size=1 << 20, log=lambda _: None).run(file_source.list())
""")


def test_kill_9_mid_copy_then_a_rerun_resumes_from_the_part(tmp_path):
    source, out, marker = tmp_path / "pvc", tmp_path / "out", tmp_path / "one-chunk-copied"
    big = os.urandom(6 * MiB + 5)
    source.mkdir()
    (source / "big.bin").write_bytes(big)
    child = subprocess.Popen([sys.executable, "-c", KILLABLE, str(source), str(out), str(marker)],
                             env=clean_env(), cwd=REPO)
    try:
        wait_for(marker.exists, timeout=60, what="the first chunk copied")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert not (out / "big.bin").exists()  # never a partial file under its final name
    parts = list((out / ".trainer-launcher" / "parts").glob("*.part"))
    assert [p.stat().st_size for p in parts] == [1 << 20]

    result = subprocess.run(launcher("init", "dataset", "--output", str(out)), cwd=REPO, capture_output=True, text=True,
                            env=clean_env(STORAGE_URI=f"file://{source}", LAUNCHER_INIT_CHUNK_SIZE=str(1 << 20)), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "resumed 1.0 MB" in result.stderr, result.stderr
    assert (out / "big.bin").read_bytes() == big


def test_file_uri_through_the_real_cli(tmp_path):
    source, out = tmp_path / "pvc", tmp_path / "out"
    tree = make_tree(source)
    env = clean_env(STORAGE_URI=f"file://{source}")
    first = subprocess.run(launcher("init", "dataset", "--output", str(out)), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert files_under(out) == tree
    assert set(json.loads((out / ".trainer-launcher" / "manifest.json").read_text())["files"]) == set(tree)
    stamps = {p: (out / p).stat().st_mtime_ns for p in tree}
    again = subprocess.run(launcher("init", "dataset", "--output", str(out)), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"fetched 0" in again.stderr and f"{len(tree)} already complete" in again.stderr, again.stderr
    assert {p: (out / p).stat().st_mtime_ns for p in tree} == stamps  # nothing rewritten
