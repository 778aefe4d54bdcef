"""Storage listings and archive members, fuzzed: a real S3 server (moto's, tests/storage_servers.py)
holding keys a bucket's other writers might choose (``..``, runs of ``/``, unicode, names that
differ in case, one key the prefix of another), and real tar and zip archives with any members
(links among them). The initializer's engine runs in-process on them.

The property: one permanent line (UnsafePath, PathClash, BadArchive), or exactly the listed bytes
under the target; never a write outside the target or into its state directory, never a link left
where a file should be, never another exception.
"""

from __future__ import annotations

import io
import itertools
import os
import tarfile
import zipfile
from types import SimpleNamespace

import pytest
from hypothesis import example, given, strategies as st

from launcher.initializers.engine import Engine
from launcher.initializers.errors import PermanentError
from launcher.initializers.state import STATE_DIR
from launcher.initializers import archive as archive_module
from launcher.initializers.archive import extract
from launcher.initializers.s3 import S3Source
from launcher.initializers.uri import parse_storage_uri

pytestmark = pytest.mark.fuzz

SEGMENT = st.one_of(st.sampled_from(["a", "A", "b", "x", "..", ".", "", "data", STATE_DIR, "é", "e\u0301", "ﬁ", " "]),
                    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FFF, blacklist_characters="/\\"),
                            min_size=1, max_size=6))
RELATIVE_KEY = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join)
_cases = itertools.count()


@pytest.fixture(scope="module")
def bucket(s3_server):
    return s3_server.make_bucket("fuzz-listings")


def snapshot(root: str) -> dict[str, bytes | str]:
    """Every path under ``root``: a file's bytes, a link's target, a directory's mark."""
    found: dict[str, bytes | str] = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                found[relative] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                found[relative] = "dir"
            else:
                with open(path, "rb") as handle:
                    found[relative] = handle.read()
    return found


def one_permanent_line(error: PermanentError) -> None:
    assert error.reason in ("UnsafePath", "PathClash", "BadArchive", "NotFound"), error.reason
    assert "\n" not in str(error) and str(error).strip()


@given(st.lists(RELATIVE_KEY, min_size=1, max_size=5), st.sampled_from(["", "data", "data/", "data/x"]))
@example(["x", "x/x"], "data/x")  # issue 22 row 3: two objects, one relative path
@example(["A", "a"], "data/")  # a case clash: two files on a case-sensitive disk
@example(["x/../../escape"], "data/")
def test_any_listing_lands_exactly_under_the_target_or_is_refused_in_one_line(s3_server, bucket, tmp_path_factory,
                                                                             keys, prefix):
    case = f"case-{next(_cases)}"
    base = f"{case}/{prefix}" if prefix else f"{case}/"
    objects: dict[str, bytes] = {}
    for relative in keys:
        key = base + relative if prefix.endswith("/") or not prefix else f"{base}/{relative}"
        if len(key.encode()) > 1024:
            continue
        objects[key] = key.encode() * 3
        s3_server.put(bucket, key, objects[key])
    if not objects:
        return
    root = tmp_path_factory.mktemp("listing")
    target, beside = root / "dataset", root / "beside"
    beside.mkdir()
    (beside / "keep").write_bytes(b"not the initializer's")
    uri = parse_storage_uri(f"s3://{bucket}/{base.rstrip('/')}" if prefix and not prefix.endswith("/")
                            else f"s3://{bucket}/{base}")
    settings = SimpleNamespace(access_key_id=s3_server.access_key_id, secret_access_key=s3_server.secret_access_key,
                               region="us-east-1", role_arn=None, endpoint=s3_server.endpoint, ca_bundle=None)
    try:
        source = S3Source(uri, settings)
        files = source.list()
        Engine(source, str(target), concurrency=4, retries=0, log=lambda line: None).run(files)
    except PermanentError as error:
        one_permanent_line(error)
        landed = {}
    else:
        landed = {file.path: objects[file.key] for file in files}
    assert snapshot(str(beside)) == {"keep": b"not the initializer's"}
    assert sorted(os.listdir(root)) == sorted(["beside", *(["dataset"] if target.exists() else [])])
    if target.exists():
        data = {path: content for path, content in snapshot(str(target)).items()
                if path.split(os.sep)[0] != STATE_DIR and content != "dir"}
        assert data == landed


MEMBER = st.tuples(
    st.sampled_from(["file", "dir", "symlink", "hardlink"]),
    st.lists(st.sampled_from(["a", "b", "state", "..", ".", STATE_DIR, "manifest.json", "/", ""]), min_size=1,
             max_size=3).map("/".join),
    st.lists(st.sampled_from(["a", "b", "state", "..", ".", STATE_DIR, "manifest.json", "/etc", ""]), min_size=1,
             max_size=3).map("/".join),
)


def tar_bytes(members) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for kind, name, link in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = f"bytes of {name}".encode()
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = link
            bundle.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(members) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for kind, name, link in members:
            if kind == "symlink":
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o120777 << 16)
                bundle.writestr(info, link)
            elif name and not name.endswith("/"):
                bundle.writestr(name, f"bytes of {name}")
    return buffer.getvalue()


@given(st.lists(MEMBER, min_size=1, max_size=5), st.sampled_from(["data.tar.gz", "data.zip"]))
@example([("symlink", "state", STATE_DIR), ("file", "state/manifest.json", "")], "data.tar.gz")  # row 7
@example([("symlink", "up", ".."), ("file", "up/escaped", "")], "data.tar.gz")
@example([("symlink", "state", "b/a"), ("file", "state", "")], "data.tar.gz")  # a file through a dangling link
@example([("file", "a", ""), ("symlink", "a/a", "a")], "data.tar.gz")  # tarfile's own recursion
@example([("file", ".", "")], "data.zip")
@pytest.mark.parametrize("filters", [True, False], ids=["tarfile-filters", "no-filters"])
def test_any_archive_extracts_inside_the_data_or_is_refused_in_one_line(tmp_path_factory, monkeypatch, filters,
                                                                        members, name):
    """Also as on a Python without tarfile's extraction filters (before 3.11.4: Debian bookworm's
    3.11.2, which tests/test_images.py runs for real)."""
    monkeypatch.setattr(archive_module, "HAS_FILTERS", filters and archive_module.HAS_FILTERS)
    root = tmp_path_factory.mktemp("archive")
    target, beside = root / "dataset", root / "beside"
    (target / STATE_DIR).mkdir(parents=True)
    (target / STATE_DIR / "manifest.json").write_text('{"the": "initializer\'s own"}')
    beside.mkdir()
    (beside / "keep").write_bytes(b"not the initializer's")
    archive = target / name
    archive.write_bytes(tar_bytes(members) if name.endswith(".tar.gz") else zip_bytes(members))
    state_before = snapshot(str(target / STATE_DIR))
    try:
        extract(str(archive), str(target))
    except PermanentError as error:
        one_permanent_line(error)
    assert snapshot(str(target / STATE_DIR)) == state_before
    assert snapshot(str(beside)) == {"keep": b"not the initializer's"}
    assert sorted(os.listdir(root)) == ["beside", "dataset"]
    for path in snapshot(str(target)):  # whatever was extracted resolves inside the target
        real = os.path.realpath(target / path)
        assert os.path.commonpath([real, str(target)]) == str(target) or os.path.islink(target / path), path
