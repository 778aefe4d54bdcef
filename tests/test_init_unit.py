"""Initializer pieces that need no server: URIs, safe paths, patterns, archives, file:// copies."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import REPO, clean_env, launcher, wait_for
from launcher.initializers.errors import PermanentError
from launcher.initializers.listing import RemoteFile, refuse_clashes, safe_destination, select
from launcher.initializers.archive import extract, refuse_links_into_state
from launcher.initializers.uri import parse_storage_uri, redact_uri
from launcher.core.outcome import ConfigError


@pytest.mark.parametrize(("uri", "scheme", "authority", "path"), [
    ("hf://meta-llama/Llama-3.2-1B", "hf", "meta-llama", "Llama-3.2-1B"),
    ("hf://org/data/sub/folder", "hf", "org", "data/sub/folder"),
    ("s3://my-bucket/datasets/imagenet/", "s3", "my-bucket", "datasets/imagenet/"),
    ("s3://my-bucket", "s3", "my-bucket", ""),
    ("file:///mnt/pvc/data", "file", "", "/mnt/pvc/data"),
    ("https://example.com/files/data.tar.gz", "https", "example.com", "files/data.tar.gz"),
])
def test_storage_uris_parse(uri, scheme, authority, path):
    parsed = parse_storage_uri(uri)
    assert (parsed.scheme, parsed.authority, parsed.path) == (scheme, authority, path)


@pytest.mark.parametrize("uri", [
    "", "no-scheme", "ftp://host/file", "hf://only-owner", "hf://a/../b", "s3://Bad_Bucket/x",
    "file://relative/path", "https://host", "x" * 3000,
])
def test_bad_storage_uris_are_config_errors(uri):
    with pytest.raises(ConfigError) as error:
        parse_storage_uri(uri)
    assert error.value.exit_code == 2 and "STORAGE_URI" in str(error.value)


def test_signed_urls_and_credentials_are_redacted():
    assert redact_uri("https://user:pw@host/f.tgz?X-Amz-Signature=abc") == "https://host/f.tgz"


@pytest.mark.parametrize("hostile", ["../x", "/etc/x", "a/../../x", "a//b", ".trainer-launcher/manifest.json", "a\\..\\b", ""])
def test_hostile_keys_are_refused(tmp_path, hostile):
    with pytest.raises(PermanentError):
        safe_destination(str(tmp_path), hostile)


def test_a_symlinked_directory_that_leaves_the_target_is_refused(tmp_path):
    (tmp_path / "target").mkdir()
    os.symlink("/etc", tmp_path / "target" / "escape")
    with pytest.raises(PermanentError):
        safe_destination(str(tmp_path / "target"), "escape/passwd")


def test_allow_and_ignore_patterns_match_paths_and_names():
    files = [RemoteFile(p, 1) for p in ("config.json", "model.safetensors", "pytorch_model.bin", "sub/tok.model", "sub/x.pt")]
    assert [f.path for f in select(files, None, ("*.bin", "*.pt"))] == ["config.json", "model.safetensors", "sub/tok.model"]
    assert [f.path for f in select(files, ("*.json", "sub/*"), None)] == ["config.json", "sub/tok.model", "sub/x.pt"]


def _tar(path, members):
    with tarfile.open(path, "w:gz") as bundle:
        for info, data in members:
            bundle.addfile(info, io.BytesIO(data) if data is not None else None)


def test_a_tarball_extracts_into_the_target(tmp_path):
    info = tarfile.TarInfo("data/train.csv")
    info.size = 3
    _tar(tmp_path / "a.tgz", [(info, b"a,b")])
    (tmp_path / "out").mkdir()
    extract(str(tmp_path / "a.tgz"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "data" / "train.csv").read_bytes() == b"a,b"


@pytest.mark.parametrize("member", ["../escape.txt", "/tmp/escape-abs.txt", "link"])
def test_hostile_tar_members_are_refused_and_nothing_lands_outside(tmp_path, member):
    info = tarfile.TarInfo(member)
    data = b"evil"
    if member == "link":
        info.type, info.linkname, data = tarfile.SYMTYPE, "/etc/passwd", None
    else:
        info.size = 4
    _tar(tmp_path / "evil.tgz", [(info, data)])
    (tmp_path / "out").mkdir()
    with pytest.raises(PermanentError):
        extract(str(tmp_path / "evil.tgz"), str(tmp_path / "out"))
    assert not (tmp_path / "escape.txt").exists()
    assert not os.path.lexists(tmp_path / "out" / "link")


@pytest.mark.parametrize(("paths", "named"), [
    (["x", "x"], ("k0", "k1")),
    (["a", "a/b"], ("k0", "k1")),
    (["m/n/o/p", "m/n"], ("k1", "k0")),
    (["d/e", "d/f", "d/e/g"], ("k0", "k2")),
])
def test_a_listing_where_two_files_meet_on_one_path_is_refused_naming_both(paths, named):
    files = [RemoteFile(p, 1, key=f"k{i}") for i, p in enumerate(paths)]
    with pytest.raises(PermanentError) as error:
        refuse_clashes(files)
    assert error.value.reason == "PathClash" and all(repr(k) in str(error.value) for k in named)


def test_siblings_and_names_that_only_share_a_prefix_do_not_clash():
    refuse_clashes([RemoteFile(p, 1) for p in ("a", "ab", "a.b/c", "b/a", "b/c/d", "b/c/e")])


def _links(*pairs):
    members = []
    for name, link in pairs:
        info = tarfile.TarInfo(name)
        if link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, link
        members.append(info)
    return members


@pytest.mark.parametrize("pairs", [
    [("state", ".trainer-launcher")],
    [("root", "."), ("root/.trainer-launcher/manifest.json", None)],
    [("a", "b"), ("b", "./.trainer-launcher"), ("a/x", None)],
    [("d/up", ".."), ("d/up/.trainer-launcher/lease", None)],
    [("m", "sub/../.trainer-launcher/manifest.json")],
])
def test_archive_links_that_lead_into_the_state_directory_are_refused(pairs):
    with pytest.raises(PermanentError) as error:
        refuse_links_into_state(_links(*pairs))
    assert error.value.reason == "UnsafePath"


def test_archive_links_between_data_are_extracted(tmp_path):
    members = _links(("v1/", None), ("latest", "v1"), ("loop", "loop"))
    members[0].type = tarfile.DIRTYPE
    refuse_links_into_state(members)
    info = tarfile.TarInfo("v1/weights.bin")
    info.size = 2
    link = tarfile.TarInfo("latest")
    link.type, link.linkname = tarfile.SYMTYPE, "v1"
    _tar(tmp_path / "ok.tgz", [(info, b"w!"), (link, None)])
    (tmp_path / "out").mkdir()
    extract(str(tmp_path / "ok.tgz"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "latest" / "weights.bin").read_bytes() == b"w!"


def test_hostile_zip_members_are_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as bundle:
        bundle.writestr("../escape.txt", b"evil")
    (tmp_path / "out").mkdir()
    with pytest.raises(PermanentError):
        extract(str(tmp_path / "evil.zip"), str(tmp_path / "out"))
    assert not (tmp_path / "escape.txt").exists()


def run_init(kind, env, *args):
    return subprocess.run(launcher("init", kind, *args), env=clean_env(**env), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_file_uri_copies_a_directory_and_a_rerun_is_a_no_op(tmp_path):
    source = tmp_path / "pvc"
    (source / "nested").mkdir(parents=True)
    (source / "nested" / "weights.safetensors").write_bytes(os.urandom(300_000))
    (source / "config.json").write_text("{}")
    out = tmp_path / "out"
    first = run_init("model", {"STORAGE_URI": f"file://{source}"}, "--output", str(out))
    assert first.returncode == 0, first.stderr
    assert (out / "nested" / "weights.safetensors").read_bytes() == (source / "nested" / "weights.safetensors").read_bytes()
    manifest = json.loads((out / ".trainer-launcher" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"config.json", "nested/weights.safetensors"}
    again = run_init("model", {"STORAGE_URI": f"file://{source}"}, "--output", str(out))
    assert again.returncode == 0 and "fetched 0" in again.stderr and "2 already complete" in again.stderr


def _run_the_download(tmp_path, word: bytes | None, *python_flags: str) -> subprocess.CompletedProcess:
    """``python -m launcher.initializers.fetch`` as the initializer's launcher starts it: its go word
    on a pipe, written whole and closed (None: closed without a word)."""
    read, write = os.pipe()
    if word:
        os.write(write, word)
    os.close(write)
    try:
        return subprocess.run([sys.executable, *python_flags, "-m", "launcher.initializers.fetch", "--go-fd", str(read)],
                              pass_fds=(read,), env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        os.close(read)


def test_the_download_loads_neither_pydantic_nor_an_http_client_for_a_local_source(tmp_path):
    """The download starts while its launcher loads its settings: pydantic (the launcher's start-up
    floor) would cost it that floor a second time, in series; file:// needs no HTTP either."""
    from launcher.initializers.order import Order

    source = tmp_path / "pvc"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.bin").write_bytes(os.urandom(100_000))
    out, handoff = tmp_path / "out", tmp_path / "outcome.json"
    order = Order(kind="dataset", target=str(out), storage_uri=f"file://{source}")
    word = {"order": order.to_json(), "log_format": "text", "codes": [138], "handoff": str(handoff)}
    done = _run_the_download(tmp_path, json.dumps(word).encode(), "-X", "importtime")
    assert done.returncode == 0, done.stderr
    assert (out / "sub" / "a.bin").read_bytes() == (source / "sub" / "a.bin").read_bytes()
    assert json.loads(handoff.read_text())["exitCode"] == 0
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "launcher.initializers.engine" in imported  # the check sees what it imports
    assert not {"pydantic", "pydantic_settings", "launcher.core.settings", "http.client", "ssl"} & imported


def test_an_initializer_reads_no_frameworks_module(tmp_path):
    """``init`` parses its own words only: the frameworks' command modules (and the options they
    add to the command line) cost an initializer 0.1 s before its first byte."""
    source = tmp_path / "pvc"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a" * 1000)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "init", "dataset", "--output",
                           str(out)], env=clean_env(STORAGE_URI=f"file://{source}"), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "a.bin").read_bytes() == b"a" * 1000
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "launcher.initializers.job" in imported  # the check sees the launcher's imports
    frameworks = {name for name in imported if name.split(".")[:2] in (["launcher", "torch"], ["launcher", "jax"],
                                                                     ["launcher", "mpi"], ["launcher", "xgboost"])}
    assert not frameworks and "launcher.core.runner_command" not in imported, frameworks


def test_the_download_told_nothing_leaves_quietly_having_written_nothing(tmp_path):
    """Its launcher found bad input, or gave up waiting for the lease: it closes the go pipe unsaid."""
    done = _run_the_download(tmp_path, None)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("credentials", "boto3"), [
    ({"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}, True),  # boto3's own chain finds them
    ({"ACCESS_KEY_ID": "id", "SECRET_ACCESS_KEY": "secret", "ROLE_ARN": "arn:aws:iam::1:role/r"}, True),
    ({"ACCESS_KEY_ID": "id", "SECRET_ACCESS_KEY": "secret"}, False),  # the Trainer's initializer: no boto3
])
def test_for_s3_the_download_loads_its_client_and_lists_while_it_waits(s3_server, fault_proxy, tmp_path,
                                                                        credentials, boto3):
    """Before its go word, the download loads S3's client (obstore always; boto3 and botocore's
    model of S3 only where the credentials need them) and lists the source from the environment
    as it is: reads only, no body, nothing written. Told nothing, it still leaves quietly, at once."""
    bucket = s3_server.make_bucket("ahead-unsaid")
    s3_server.put(bucket, "data/a.bin", b"a" * 1000)
    proxy = fault_proxy(s3_server.endpoint)
    read, write = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "launcher.initializers.fetch", "--go-fd",
                                  str(read)], pass_fds=(read,), cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env=clean_env(STORAGE_URI=f"s3://{bucket}/data", ENDPOINT=proxy.endpoint,
                                               **credentials))
    finally:
        os.close(read)
    try:
        wait_for(lambda: proxy.requests, what="the download's first request, ahead of its word")
    finally:
        os.close(write)
    stdout, stderr = child.communicate(timeout=120)
    imported = {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert (child.returncode, stdout) == (0, "")
    assert [line for line in stderr.splitlines() if not line.startswith("import time:")] == []
    assert {"obstore.store", "launcher.initializers.s3"} <= imported
    assert ({"boto3", "botocore.session"} <= imported) is boto3, imported & {"boto3", "botocore.session"}
    assert ("launcher.initializers.s3_rest" in imported) is not boto3
    # The listing, or the role's AssumeRole before it: no object read, nothing else asked.
    assert all("list-type=2" in path or (method, path) == ("POST", "/") for method, path, _ in proxy.requests), \
        proxy.requests
    assert list(tmp_path.iterdir()) == []


def test_the_listing_ahead_reads_each_setting_from_the_variable_the_settings_read():
    """Else the word never confirms the listing made ahead, and every download lists twice."""
    from launcher.initializers.ahead import LISTED_FROM
    from launcher.initializers.settings import InitSettings

    for name, variable in LISTED_FROM.items():
        assert InitSettings.model_fields[name].json_schema_extra["env"] == (variable,), name


def test_the_model_initializer_keeps_upstreams_default_ignore_list(tmp_path):
    source = tmp_path / "repo"
    source.mkdir()
    for name in ("model.safetensors", "pytorch_model.bin", "flax.msgpack", "config.json"):
        (source / name).write_bytes(b"x")
    out = tmp_path / "out"
    assert run_init("model", {"STORAGE_URI": f"file://{source}"}, "--output", str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["config.json", "model.safetensors"]


def test_output_path_from_the_sdk_is_honoured(tmp_path):
    source = tmp_path / "one.txt"
    source.write_text("hello")
    result = run_init("dataset", {"STORAGE_URI": f"file://{source}", "OUTPUT_PATH": str(tmp_path / "sdk")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "sdk" / "one.txt").read_text() == "hello"


@pytest.mark.parametrize(("env", "names"), [
    ({}, "STORAGE_URI"),
    ({"STORAGE_URI": "ftp://host/x"}, "STORAGE_URI"),
    ({"STORAGE_URI": "file:///nonexistent/dir"}, "/nonexistent/dir"),
    ({"STORAGE_URI": "s3://bucket/x", "ENDPOINT": "not a url"}, "ENDPOINT"),
    ({"STORAGE_URI": "s3://bucket/x", "LAUNCHER_INIT_CONCURRENCY": "0"}, "LAUNCHER_INIT_CONCURRENCY"),
])
def test_bad_initializer_config_is_one_line_and_exit_2(tmp_path, env, names):
    result = run_init("dataset", env, "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and names in errors[0] and "Traceback" not in result.stderr
