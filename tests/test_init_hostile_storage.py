"""Hostile storage (issue 22, rows 3, 4, 5 and 7), through the real CLI: a bucket whose keys clash,
links planted in the target's state directory by another pod of a shared volume, a file:// source
whose links leave it, an archive whose links reach the state directory. What a user would notice:
the exit code, the one line, the target's content, and that nothing outside the target changed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from test_init_storage import files_under, init, termination

STATE = ".trainer-launcher"
MiB = 1 << 20


def part_of(relative: str) -> str:
    """The name of the partial file the engine keeps for ``relative`` (engine._fetch)."""
    return hashlib.sha256(relative.encode()).hexdigest()[:32] + ".part"


def s3_env(server, uri: str, **extra) -> dict:
    return {"STORAGE_URI": uri, "ENDPOINT": server.endpoint, "ACCESS_KEY_ID": server.access_key_id,
            "SECRET_ACCESS_KEY": server.secret_access_key, **extra}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


# --- row 3: two keys, one destination ------------------------------------------------------------

@pytest.mark.parametrize(("bucket", "prefix", "keys", "clashing"), [
    # the prefix names an object and a "directory" holding an object of the same name
    ("clash-same", "data/x", ["data/x", "data/x/x"], ("data/x", "data/x/x")),
    # one object's path is another's parent directory
    ("clash-parent", "data", ["data/a", "data/a/b", "data/c"], ("data/a", "data/a/b")),
    ("clash-deep", "data/", ["data/m/n", "data/m/n/o/p"], ("data/m/n", "data/m/n/o/p")),
])
def test_keys_that_land_on_one_path_are_one_permanent_line_naming_both_and_nothing_is_written(
        s3_server, tmp_path, bucket, prefix, keys, clashing):
    s3_server.make_bucket(bucket)
    for key in keys:
        s3_server.put(bucket, key, key.encode() * 1000)
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, f"s3://{bucket}/{prefix}"), out)
    assert result.returncode == 2, result.stderr
    message = termination(out)
    assert (message["reason"], message["retryable"]) == ("PathClash", False), message
    assert all(key in message["message"] for key in clashing), message["message"]
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and all(key in lines[0] for key in clashing), result.stderr
    assert files_under(out) == {}  # refused while planning: not one byte landed
    parts = out / STATE / "parts"
    assert not parts.exists() or list(parts.iterdir()) == []


def test_a_clash_that_the_ignore_patterns_remove_is_no_clash(s3_server, tmp_path):
    s3_server.make_bucket("clash-ignored")
    s3_server.put("clash-ignored", "data/a", b"file a")
    s3_server.put("clash-ignored", "data/a/b.tmp", b"ignored")
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, "s3://clash-ignored/data", IGNORE_PATTERNS="*.tmp"), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {"a": b"file a"}


# --- row 4: links planted in the target's state directory ----------------------------------------

def file_source(tmp_path: Path, size: int = 3 * MiB) -> tuple[str, dict[str, bytes]]:
    source = tmp_path / "pvc"
    source.mkdir()
    data = {"a.bin": os.urandom(size), "small.txt": b"small"}
    for name, body in data.items():
        (source / name).write_bytes(body)
    return f"file://{source}", data


@pytest.fixture
def outside(tmp_path) -> dict:
    """A file and a directory beside the target (where a planted link points): they must not change."""
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_bytes(b"not the initializer's to touch\n")
    empty = tmp_path / "outside" / "dir"
    empty.mkdir()
    return {"file": victim, "dir": empty}


def plant(out: Path, what: str, outside: dict) -> None:
    state = out / STATE
    if what == ".trainer-launcher -> outside dir":
        out.mkdir()
        os.symlink(outside["dir"], state)
        return
    state.mkdir(parents=True)
    if what == "parts -> outside dir":
        os.symlink(outside["dir"], state / "parts")
        return
    (state / "parts").mkdir()
    if what == "part -> outside file":
        os.symlink(outside["file"], state / "parts" / part_of("a.bin"))
    elif what == "part hard-linked to an outside file":
        os.link(outside["file"], state / "parts" / part_of("a.bin"))
    elif what == "journal -> outside file":
        os.symlink(outside["file"], state / "manifest.journal")
    elif what == "lease -> outside file":
        os.symlink(outside["file"], state / "lease")
    else:
        raise AssertionError(what)


def assert_only_the_target_changed(out: Path, data: dict[str, bytes], outside: dict) -> None:
    assert outside["file"].read_bytes() == b"not the initializer's to touch\n"
    assert list(outside["dir"].iterdir()) == []
    for name, body in data.items():
        assert not (out / name).is_symlink() and (out / name).stat().st_nlink == 1, name
        assert (out / name).read_bytes() == body, name
    for directory in (out / STATE, out / STATE / "parts"):
        assert directory.is_dir() and not directory.is_symlink(), directory
    assert not (out / STATE / "manifest.json").is_symlink()


PLANTED = [".trainer-launcher -> outside dir", "parts -> outside dir", "part -> outside file",
           "part hard-linked to an outside file", "journal -> outside file", "lease -> outside file"]


@pytest.mark.parametrize("planted", PLANTED)
def test_links_planted_in_the_state_directory_are_replaced_never_followed_file_source(tmp_path, outside, planted):
    uri, data = file_source(tmp_path)
    out = tmp_path / "dataset"
    plant(out, planted, outside)
    # A lease that is a link is no lease: waiting for it to go stale would be waiting for nothing.
    result = init("dataset", {"STORAGE_URI": uri, "LAUNCHER_INIT_LEASE_WAIT": "3"}, out,
                  "--chunk-size", str(MiB), timeout=60)
    assert result.returncode == 0, result.stderr
    assert_only_the_target_changed(out, data, outside)


@pytest.mark.parametrize("ranged", [False, True], ids=["stream", "ranges"])
@pytest.mark.parametrize("planted", ["part -> outside file", "part hard-linked to an outside file"])
def test_a_part_planted_as_a_link_is_replaced_never_followed_s3(s3_server, tmp_path, outside, planted, ranged):
    bucket = s3_server.make_bucket("planted")
    data = {"a.bin": os.urandom(5 * MiB), "small.txt": b"small"}
    for name, body in data.items():
        s3_server.put(bucket, f"corpus/{name}", body)
    out = tmp_path / "dataset"
    plant(out, planted, outside)
    args = ("--ranged-min", str(4 * MiB), "--chunk-size", str(MiB)) if ranged else ("--chunk-size", str(MiB))
    result = init("dataset", s3_env(s3_server, "s3://planted/corpus"), out, *args)
    assert result.returncode == 0, result.stderr
    assert_only_the_target_changed(out, data, outside)


def test_a_rerun_replaces_a_final_name_that_became_a_link(tmp_path, outside):
    uri, data = file_source(tmp_path, size=len(outside["file"].read_bytes()))
    out = tmp_path / "dataset"
    assert init("dataset", {"STORAGE_URI": uri}, out).returncode == 0
    (out / "a.bin").unlink()
    os.symlink(outside["file"], out / "a.bin")  # same size: only its kind tells it is not ours
    result = init("dataset", {"STORAGE_URI": uri}, out)
    assert result.returncode == 0, result.stderr
    assert_only_the_target_changed(out, data, outside)


# --- row 5: file:// links that leave the source ----------------------------------------------------

def test_file_source_links_leaving_the_source_are_skipped_with_one_line_each(tmp_path):
    secret = tmp_path / "secrets" / "token"
    secret.parent.mkdir()
    secret.write_text("eyJhbGciOi-service-account-token")
    (tmp_path / "secrets" / "more").write_text("more secrets")
    source = tmp_path / "pvc"
    (source / "sub").mkdir(parents=True)
    (source / "data.bin").write_bytes(b"data")
    (source / "sub" / "deep.txt").write_bytes(b"deep")
    os.symlink(secret, source / "token")  # a file outside
    os.symlink("../secrets/token", source / "sub" / "relative-token")  # the same, relative
    os.symlink(secret.parent, source / "secrets-dir")  # a directory outside
    os.symlink("data.bin", source / "alias.bin")  # a file inside: copied, as before
    os.symlink("sub", source / "sub-alias")  # a directory inside: its files are copied once, under sub/
    os.symlink(tmp_path / "nowhere", source / "dangling")
    out = tmp_path / "dataset"
    result = init("dataset", {"STORAGE_URI": f"file://{source}"}, out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {"data.bin": b"data", "sub/deep.txt": b"deep", "alias.bin": b"data"}
    skipped = [line for line in result.stderr.splitlines() if "skipped" in line]
    for name in ("token", "sub/relative-token", "secrets-dir", "sub-alias", "dangling"):
        assert len([line for line in skipped if f"'{name}': skipped" in line]) == 1, (name, result.stderr)
    assert "service-account-token" not in result.stderr + result.stdout
    assert str(secret) not in result.stderr  # the link is named, not where it points


# --- row 7: archive members that reach the state directory -----------------------------------------

def tar_member(name: str, data: bytes | None = None, link: str | None = None, hard: bool = False):
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), link
        return info, None
    info.size = len(data)
    return info, io.BytesIO(data)


FORGED = b'{"files": {"forged": {"size": 0, "version": "x"}}}'

HOSTILE_ARCHIVES = {
    "through a link to the state dir": [tar_member("state", link=STATE),
                                        tar_member("state/manifest.json", FORGED)],
    "through a link to the target root": [tar_member("root", link="."),
                                          tar_member(f"root/{STATE}/manifest.json", FORGED)],
    "through a chain of links": [tar_member("a", link="b"), tar_member("b", link=STATE),
                                 tar_member("a/manifest.json", FORGED)],
    "onto a link to the manifest": [tar_member("m", link=f"./{STATE}/manifest.json"),
                                    tar_member("m", FORGED)],
    "onto a hard link to the manifest": [tar_member("h", link=f"{STATE}/manifest.json", hard=True),
                                         tar_member("h", FORGED)],
}


@pytest.mark.parametrize("layout", sorted(HOSTILE_ARCHIVES))
def test_tar_members_cannot_reach_the_state_directory_by_any_path(hub_server, tmp_path, layout):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        bundle.addfile(*tar_member("ok.txt", b"fine"))
        for info, body in HOSTILE_ARCHIVES[layout]:
            bundle.addfile(info, body)
    repo = f"acme/hostile-{hashlib.sha1(layout.encode()).hexdigest()[:8]}"
    hub_server.add_repo(repo, {"bundle.tgz": buffer.getvalue()}, repo_type="dataset")
    out = tmp_path / "dataset"
    result = init("dataset", {"STORAGE_URI": f"{hub_server.endpoint}/datasets/{repo}/resolve/main/bundle.tgz"},
                  out, "--extract", "1")
    assert result.returncode == 2, result.stderr
    assert termination(out)["reason"] == "UnsafePath"
    manifest = json.loads((out / STATE / "manifest.json").read_text())["files"]
    assert set(manifest) == {"bundle.tgz"}, manifest  # ours, as the download left it
    first = HOSTILE_ARCHIVES[layout][0][0].name
    assert not os.path.lexists(out / first)  # refused before anything was extracted
    assert not (out / "ok.txt").exists()


def test_a_zip_member_cannot_write_through_a_link_left_in_the_target(hub_server, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("notes.txt", FORGED)
    hub_server.add_repo("acme/hostile-zip", {"bundle.zip": buffer.getvalue()}, repo_type="dataset")
    out = tmp_path / "dataset"
    (out / STATE).mkdir(parents=True)
    os.symlink(f"{STATE}/manifest.json", out / "notes.txt")  # left by another pod of the volume
    url = f"{hub_server.endpoint}/datasets/acme/hostile-zip/resolve/main/bundle.zip"
    result = init("dataset", {"STORAGE_URI": url}, out, "--extract", "1")
    assert result.returncode == 2, result.stderr
    assert termination(out)["reason"] == "UnsafePath"
    assert set(json.loads((out / STATE / "manifest.json").read_text())["files"]) == {"bundle.zip"}
