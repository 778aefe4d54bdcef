"""`trainer-launcher init` against real servers: a moto S3 server process, a local Hub, an HTTP
proxy that injects faults between them and the initializer."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tarfile
import io
from pathlib import Path

import pytest

from conftest import REPO, clean_env, launcher, wait_for

BIG = os.urandom(11 * 1024 * 1024)  # multipart (ETag with '-') and big enough to cut in the middle
SINGLE = os.urandom(3 * 1024 * 1024)  # single part: ETag is its MD5


def init(kind: str, env: dict, out: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    full = clean_env(LAUNCHER_TERMINATION_LOG=str(out.parent / f"{out.name}.termination.json"), **env)
    return subprocess.run(launcher("init", kind, "--output", str(out), *args), env=full, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def termination(out: Path) -> dict:
    return json.loads((out.parent / f"{out.name}.termination.json").read_text())


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".trainer-launcher" not in p.parts}


@pytest.fixture(scope="module")
def bucket(s3_server):
    name = s3_server.make_bucket("datasets")
    objects = {
        "imagenet/train/a.jpg": os.urandom(1000),
        "imagenet/train/deep/b.jpg": os.urandom(2000),
        "imagenet/empty.txt": b"",
        "imagenet/with space/ünïcode name.txt": "ü".encode(),
        "imagenet/labels.csv": b"a,b\n",
        "imagenet/skip.tmp": b"ignored",
        "imagenet/single.bin": SINGLE,
        "imagenet2/not-below-the-prefix.txt": b"x",
    }
    for key, data in objects.items():
        s3_server.put(name, key, data)
    s3_server.put(name, "imagenet/train/", b"")  # a "directory" marker
    s3_server.put_multipart(name, "imagenet/big.bin", BIG)
    objects["imagenet/big.bin"] = BIG
    return name, objects


def s3_env(server, endpoint=None, **extra):
    return {"STORAGE_URI": "s3://datasets/imagenet", "ENDPOINT": endpoint or server.endpoint,
            "ACCESS_KEY_ID": server.access_key_id, "SECRET_ACCESS_KEY": server.secret_access_key, **extra}


def expected_s3(objects, ignore=()) -> dict[str, bytes]:
    return {k.removeprefix("imagenet/"): v for k, v in objects.items()
            if k.startswith("imagenet/") and not any(k.endswith(i) for i in ignore)}


def test_s3_prefix_downloads_byte_identical_with_nested_empty_unicode_and_multipart(s3_server, bucket, tmp_path):
    _, objects = bucket
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, IGNORE_PATTERNS="*.tmp"), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects, ignore=(".tmp",))
    assert not (out / "train").is_file()  # the marker object is a directory, not a file
    manifest = json.loads((out / ".trainer-launcher" / "manifest.json").read_text())["files"]
    assert manifest["single.bin"]["checksum"] == "md5:" + hashlib.md5(SINGLE).hexdigest()
    assert manifest["big.bin"]["checksum"].startswith("s3-multipart:5242880:")  # verified like S3 computes it


def test_a_rerun_after_success_transfers_no_file_bodies(s3_server, bucket, fault_proxy, tmp_path):
    proxy = fault_proxy(s3_server.endpoint)
    out = tmp_path / "dataset"
    assert init("dataset", s3_env(s3_server, proxy.endpoint), out).returncode == 0
    before = len(proxy.requests)
    again = init("dataset", s3_env(s3_server, proxy.endpoint), out)
    assert again.returncode == 0 and "fetched 0" in again.stderr
    gets = [path for method, path, _ in proxy.requests[before:] if method == "GET" and "list-type" not in path]
    assert gets == []


@pytest.mark.parametrize(("kind", "params"), [
    ("fail", {"status": 503}), ("fail", {"status": 500}), ("drop_after", {"n_bytes": 4 * 1024 * 1024}),
    ("truncate", {"n_bytes": 1024 * 1024}), ("corrupt", {}),
])
def test_faults_between_client_and_server_still_give_byte_identical_files(s3_server, bucket, fault_proxy, tmp_path, kind, params):
    _, objects = bucket
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/single.bin", kind, times=2, **params)
    proxy.inject("*/big.bin", kind, times=2, **params)
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects)


def test_a_file_that_stays_corrupt_fails_retryably_with_nothing_under_its_name(s3_server, bucket, fault_proxy, tmp_path):
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/single.bin", "corrupt", times=None)
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, proxy.endpoint, LAUNCHER_INIT_RETRIES="2"), out)
    assert result.returncode == 138, result.stderr
    assert not (out / "single.bin").exists()
    assert "checksum" in termination(out)["message"] or "mismatch" in termination(out)["message"]


def test_kill_9_mid_download_then_rerun_fetches_only_the_rest(s3_server, bucket, fault_proxy, tmp_path):
    _, objects = bucket
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/big.bin", "slow", times=1, bytes_per_second=2 * 1024 * 1024)
    out = tmp_path / "dataset"
    env = clean_env(**s3_env(s3_server, proxy.endpoint, LAUNCHER_INIT_CHUNK_SIZE="65536"))
    first = subprocess.Popen(launcher("init", "dataset", "--output", str(out)), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / ".trainer-launcher" / "parts"

    def big_part_size() -> int:
        """How much of big.bin its partial file holds (single.bin, 3 MiB, has a partial file too)."""
        for meta in parts.glob("*.part.json") if parts.exists() else ():
            try:
                if json.loads(meta.read_text()).get("path") == "big.bin":
                    return meta.with_suffix("").stat().st_size
            except (OSError, ValueError):
                pass
        return 0

    wait_for(lambda: big_part_size() > 2 * 1024 * 1024, timeout=60, what="a partial big.bin")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert not (out / "big.bin").exists()  # never a partial file under its final name
    before = len(proxy.requests)
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects)
    ranges = [r for method, path, r in proxy.requests[before:] if path.endswith("big.bin") and method == "GET"]
    assert ranges and all(r and not r.startswith("bytes=0-") for r in ranges), ranges
    assert "resumed" in result.stderr


def test_wrong_credentials_are_permanent_and_never_printed(s3_server_auth, tmp_path):
    s3_server_auth.make_bucket("private")
    s3_server_auth.put("private", "data/x.txt", b"x")
    out = tmp_path / "dataset"
    secret = "WrongSecretKeyValue123"
    result = init("dataset", {"STORAGE_URI": "s3://private/data", "ENDPOINT": s3_server_auth.endpoint,
                              "ACCESS_KEY_ID": "AKIAWRONGKEYID", "SECRET_ACCESS_KEY": secret}, out)
    assert result.returncode == 2, result.stderr
    message = termination(out)
    assert message["reason"] == "AuthFailed" and message["retryable"] is False
    everything = result.stdout + result.stderr + json.dumps(message)
    assert secret not in everything and "AKIAWRONGKEYID" not in everything


def test_a_missing_bucket_is_permanent(s3_server, tmp_path):
    out = tmp_path / "dataset"
    result = init("dataset", {**s3_env(s3_server), "STORAGE_URI": "s3://no-such-bucket/x"}, out)
    assert result.returncode == 2
    assert termination(out)["reason"] == "NotFound"


# --- hf:// ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub_repos(hub_server):
    model = {"config.json": b'{"hidden": 8}', "model.safetensors": os.urandom(2 * 1024 * 1024),
             "tokenizer/tokenizer.model": os.urandom(5000), "pytorch_model.bin": b"old format"}
    sha = hub_server.add_repo("acme/tiny-model", model, lfs_paths={"model.safetensors", "tokenizer/tokenizer.model"})
    dataset = {"data/train.parquet": os.urandom(300_000), "data/test.parquet": os.urandom(1000), "README.md": b"# d"}
    hub_server.add_repo("acme/tiny-data", dataset, repo_type="dataset", lfs_paths={"data/train.parquet"})
    gated = {"weights.safetensors": os.urandom(10_000)}
    hub_server.add_repo("acme/gated", gated, gated=True, lfs_paths={"weights.safetensors"}, redirect_lfs=True)
    return {"model": model, "dataset": dataset, "gated": gated, "sha": sha}


def hub_env(hub_server, tmp_path, uri, **extra):
    return {**{k: v for k, v in hub_server.env(tmp_path / "hf-home").items() if k.startswith("HF_")},
            "STORAGE_URI": uri, **extra}


def test_hf_model_with_lfs_files_is_verified_and_keeps_the_default_ignore_list(hub_server, hub_repos, tmp_path):
    out = tmp_path / "model"
    result = init("model", hub_env(hub_server, tmp_path, "hf://acme/tiny-model"), out)
    assert result.returncode == 0, result.stderr
    expected = {k: v for k, v in hub_repos["model"].items() if not k.endswith(".bin")}
    assert files_under(out) == expected
    manifest = json.loads((out / ".trainer-launcher" / "manifest.json").read_text())
    lfs = manifest["files"]["model.safetensors"]["checksum"]
    assert lfs == "sha256:" + hashlib.sha256(hub_repos["model"]["model.safetensors"]).hexdigest()
    before = len(hub_server.body_gets())
    assert init("model", hub_env(hub_server, tmp_path, "hf://acme/tiny-model"), out).returncode == 0
    assert len(hub_server.body_gets()) == before  # the rerun fetched no file body


def test_hf_dataset_subfolder(hub_server, hub_repos, tmp_path):
    out = tmp_path / "dataset"
    result = init("dataset", hub_env(hub_server, tmp_path, "hf://acme/tiny-data/data"), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {k.removeprefix("data/"): v for k, v in hub_repos["dataset"].items() if k.startswith("data/")}


def test_a_gated_repo_needs_the_token_which_never_leaks(hub_server, hub_repos, tmp_path):
    out = tmp_path / "model"
    denied = init("model", hub_env(hub_server, tmp_path, "hf://acme/gated"), out)
    assert denied.returncode == 2 and termination(out)["reason"] == "AuthFailed"
    allowed = init("model", hub_env(hub_server, tmp_path, "hf://acme/gated", ACCESS_TOKEN=hub_server.token), out)
    assert allowed.returncode == 0, allowed.stderr
    assert files_under(out) == hub_repos["gated"]
    assert hub_server.token not in allowed.stdout + allowed.stderr + json.dumps(termination(out))
    cdn = [entry for entry in hub_server.log if entry.get("cdn")]
    assert cdn and not any("Authorization" in entry.get("headers", {}) for entry in cdn)


def test_a_missing_repo_is_permanent(hub_server, hub_repos, tmp_path):
    out = tmp_path / "model"
    result = init("model", hub_env(hub_server, tmp_path, "hf://acme/no-such-model"), out)
    assert result.returncode == 2 and termination(out)["reason"] == "NotFound"


# --- https:// ------------------------------------------------------------------------------------

def test_https_single_file_and_archive_extraction(hub_server, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        data = b"x,y\n1,2\n"
        info = tarfile.TarInfo("csv/part-0.csv")
        info.size = len(data)
        bundle.addfile(info, io.BytesIO(data))
    hub_server.add_repo("acme/archives", {"data.tar.gz": buffer.getvalue()}, repo_type="dataset")
    url = f"{hub_server.endpoint}/datasets/acme/archives/resolve/main/data.tar.gz"
    out = tmp_path / "dataset"
    result = init("dataset", {"STORAGE_URI": url}, out, "--extract", "1")
    assert result.returncode == 0, result.stderr
    assert (out / "csv" / "part-0.csv").read_bytes() == b"x,y\n1,2\n"


def test_https_archive_with_a_hostile_member_is_refused(hub_server, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 4
        bundle.addfile(info, io.BytesIO(b"evil"))
    hub_server.add_repo("acme/evil", {"evil.tgz": buffer.getvalue()}, repo_type="dataset")
    url = f"{hub_server.endpoint}/datasets/acme/evil/resolve/main/evil.tgz"
    out = tmp_path / "a" / "b" / "dataset"
    out.parent.mkdir(parents=True)
    result = init("dataset", {"STORAGE_URI": url}, out, "--extract", "1")
    assert result.returncode == 2 and termination(out)["reason"] == "UnsafePath"
    assert not (tmp_path / "a" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_a_model_whose_files_the_default_patterns_skip_says_which_patterns_skipped_them(hub_server, tmp_path):
    # Upstream's model initializer skips *.bin (and four other weight formats) unless IGNORE_PATTERNS
    # says otherwise: a model URL of a .bin alone fetches nothing, and the warning says why.
    hub_server.add_repo("acme/old-weights", {"pytorch_model.bin": b"w" * 100}, repo_type="model")
    url = f"{hub_server.endpoint}/acme/old-weights/resolve/main/pytorch_model.bin"
    out = tmp_path / "model"
    result = init("model", {"STORAGE_URI": url}, out)
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "0 of 1 files, 0.0 MB; 1 skipped by IGNORE_PATTERNS=*.msgpack,*.h5,*.bin," \
        "*.pt,*.pth (a model's default)" in result.stderr, result.stderr
    result = init("model", {"STORAGE_URI": url, "IGNORE_PATTERNS": "*.h5"}, out)
    assert result.returncode == 0 and files_under(out) == {"pytorch_model.bin": b"w" * 100}, result.stderr


RANGED = ("--ranged-min", str(4 * 1024 * 1024), "--chunk-size", str(1024 * 1024))


@pytest.mark.parametrize(("kind", "params"), [("drop_after", {"n_bytes": 500_000}), ("corrupt", {}), ("fail", {"status": 503})])
def test_a_large_object_fetched_by_segments_survives_faults(s3_server, bucket, fault_proxy, tmp_path, kind, params):
    _, objects = bucket
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/big.bin", kind, times=2, method="GET", **params)
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out, *RANGED)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects)
    gets = [r for method, path, r in proxy.requests if method == "GET" and path.endswith("big.bin")]
    assert len(gets) >= 3 and gets[0] is None, gets  # a plain GET first; both faults met, and retried


def _large_object_through(s3_server, fault_proxy, tmp_path, kind: str, mib_per_second: int) -> list[str | None]:
    """A 48 MiB single-part object (its ETag an md5: 1.5 MiB segments under RANGED), fetched on 4
    lanes through a proxy that throttles its bodies (``kind``: slow, each body at the rate; capped,
    all of them together); verified whole. The GETs' Range headers, in order."""
    bucket = s3_server.make_bucket(f"throttled-{kind}")
    data = os.urandom(48 * 1024 * 1024)
    s3_server.put(bucket, "data/large.bin", data)
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/large.bin", kind, times=None, method="GET", bytes_per_second=mib_per_second * 1024 * 1024)
    env = {**s3_env(s3_server, proxy.endpoint), "STORAGE_URI": f"s3://{bucket}/data"}
    result = init("dataset", env, tmp_path / "out", *RANGED, "--concurrency", "4")
    assert result.returncode == 0, result.stderr
    assert files_under(tmp_path / "out") == {"large.bin": data}
    return [r for method, path, r in proxy.requests if method == "GET" and path.endswith("large.bin")]


def test_a_large_object_gets_more_streams_while_each_stream_is_limited(s3_server, fault_proxy, tmp_path):
    """A server that serves each stream at a fixed rate (a real S3 endpoint, per connection): the
    object starts as one plain GET, and the lanes that would idle take over parts of it, because each
    new stream raises the rate."""
    gets = _large_object_through(s3_server, fault_proxy, tmp_path, "slow", 8)
    assert gets[0] is None and len(gets) >= 3, gets
    assert all(r.startswith("bytes=") for r in gets[1:]), gets


def test_a_large_object_stays_one_stream_when_the_server_gives_no_more_to_more_streams(
        s3_server, fault_proxy, tmp_path):
    """A server whose total rate is fixed (one busy process, like moto, or a saturated link): one
    trial stream shows that a second stream brings nothing, and no more are started. A server that
    must read the whole object to serve a range pays for every range, so this matters."""
    gets = _large_object_through(s3_server, fault_proxy, tmp_path, "capped", 16)
    assert gets[0] is None and len(gets) <= 2, gets  # the plain GET, and at most the one trial


def test_no_lane_is_free_so_each_large_object_comes_in_one_plain_get(s3_server, fault_proxy, tmp_path):
    """--concurrency is the number of transfers, ranges included: two large objects on two lanes
    leave no lane free, so each comes in one plain GET (no Range: the request every server serves
    at its lowest cost), even from a server that limits each stream. Each is still verified
    against its multipart ETag."""
    name = s3_server.make_bucket("lanes")
    objects = {f"data/big{i}.bin": os.urandom(11 * 1024 * 1024) for i in range(2)}
    for key, data in objects.items():
        s3_server.put_multipart(name, key, data)
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/big?.bin", "slow", times=None, method="GET", bytes_per_second=8 * 1024 * 1024)
    out = tmp_path / "dataset"
    env = {**s3_env(s3_server, proxy.endpoint), "STORAGE_URI": f"s3://{name}/data"}
    result = init("dataset", env, out, *RANGED, "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {k.removeprefix("data/"): v for k, v in objects.items()}
    for key in objects:
        gets = [r for method, path, r in proxy.requests if method == "GET" and path.endswith(key)]
        assert gets == [None], (key, gets)


def _covers(range_header: str | None, offset: int) -> bool:
    """Whether a GET with this Range header (None: the whole object) fetched the byte at ``offset``."""
    if range_header is None:
        return True
    first, _, last = range_header.removeprefix("bytes=").partition("-")
    return int(first) <= offset and (not last or offset <= int(last))


def _killed_with_ranges_done(s3_server, fault_proxy, out: Path):
    """A download of big.bin in ranges, slowed, SIGKILLed once some ranges are recorded as done:
    (the proxy, the path of big.bin's resume record)."""
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/big.bin", "slow", times=1, method="GET", bytes_per_second=2 * 1024 * 1024)
    env = clean_env(**s3_env(s3_server, proxy.endpoint))
    first = subprocess.Popen(launcher("init", "dataset", "--output", str(out), *RANGED), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = lambda: list((out / ".trainer-launcher" / "parts").glob("*.part.json")) \
        if (out / ".trainer-launcher" / "parts").exists() else []
    wait_for(lambda: any(json.loads(p.read_text()).get("segments") for p in records()), timeout=60,
             what="some finished ranges of big.bin")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert not (out / "big.bin").exists()
    [record] = [p for p in records() if json.loads(p.read_text()).get("segments")]
    return proxy, record


def test_kill_9_during_ranged_download_then_rerun_fetches_only_missing_ranges(s3_server, bucket, fault_proxy, tmp_path):
    _, objects = bucket
    out = tmp_path / "dataset"
    proxy, record = _killed_with_ranges_done(s3_server, fault_proxy, out)
    finished = set(json.loads(record.read_text())["segments"])
    before = len(proxy.requests)
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out, *RANGED)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects)
    refetched = [r for method, path, r in proxy.requests[before:] if method == "GET" and path.endswith("big.bin")]
    assert not any(r.startswith(f"bytes={o}-") for r in refetched for o in finished)  # done ranges not fetched again


@pytest.mark.parametrize("tampered", ["digests-missing", "digests-wrong"])
def test_a_resume_record_whose_part_digests_are_missing_or_wrong_still_ends_verified(
        s3_server, bucket, fault_proxy, tmp_path, tampered):
    """A multipart object's ranges are hashed as they arrive, and a done range keeps its parts'
    md5s in the resume record. A record without them (an older launcher's) has those ranges
    fetched again; one with wrong ones fails the file's check once, and the file comes again."""
    _, objects = bucket
    out = tmp_path / "dataset"
    proxy, record = _killed_with_ranges_done(s3_server, fault_proxy, out)
    kept = json.loads(record.read_text())
    finished = set(kept["segments"])
    if tampered == "digests-missing":
        del kept["digests"]
    else:
        kept["digests"] = {offset: ["0" * 32] * len(parts) for offset, parts in kept["digests"].items()}
    record.write_text(json.dumps(kept))
    before = len(proxy.requests)
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out, *RANGED)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == expected_s3(objects)
    refetched = [r for method, path, r in proxy.requests[before:] if method == "GET" and path.endswith("big.bin")]
    assert all(any(_covers(r, o) for r in refetched) for o in finished), (finished, refetched)
    assert ("mismatch" in result.stderr) == (tampered == "digests-wrong"), result.stderr


def test_a_long_download_logs_progress_every_few_seconds(s3_server, bucket, fault_proxy, tmp_path):
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/big.bin", "slow", times=1, method="GET", bytes_per_second=1536 * 1024)
    out = tmp_path / "dataset"
    result = init("dataset", s3_env(s3_server, proxy.endpoint), out)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if " MB/s" in line and "files," in line]
    assert progress, result.stderr  # e.g. "7/8 files, 10.2/14.7 MB, 1.9 MB/s, ETA 2s"
