"""Smoke tests: the local storage servers work with the real clients (boto3, huggingface_hub, urllib)."""

from __future__ import annotations

import hashlib
import http.client
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from storage_servers import multipart_etag  # the fixtures come from conftest

MB = 1024 * 1024


def blob(size: int, seed: int = 0) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]


# ------------------------------------------------------------------------------------------------ S3
def test_s3_list_get_range_and_multipart(s3_server):
    s3 = s3_server.client()
    s3_server.make_bucket("smoke")
    s3_server.make_bucket("smoke")  # idempotent
    s3_server.put("smoke", "data/a.txt", b"alpha")
    s3_server.put("smoke", "data/sub/b.bin", blob(1000))
    big = blob(11 * MB, 1)
    etag = s3_server.put_multipart("smoke", "data/big.bin", big)
    assert etag == multipart_etag(big) and etag.endswith('-3"')

    listed = s3.list_objects_v2(Bucket="smoke", Prefix="data/")["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {"data/a.txt": 5, "data/sub/b.bin": 1000, "data/big.bin": len(big)}
    assert {o["Key"]: o["ETag"] for o in listed}["data/big.bin"] == etag
    assert s3.get_object(Bucket="smoke", Key="data/a.txt")["Body"].read() == b"alpha"
    part = s3.get_object(Bucket="smoke", Key="data/big.bin", Range="bytes=100-199")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206 and part["Body"].read() == big[100:200]
    assert s3.head_object(Bucket="smoke", Key="data/big.bin")["ETag"] == etag


def test_s3_auth_enforced(s3_server_auth):
    srv = s3_server_auth
    srv.make_bucket("private")
    srv.put("private", "k", b"secret")
    assert srv.client().get_object(Bucket="private", Key="k")["Body"].read() == b"secret"

    for key, secret, code in (("test", "test", "InvalidAccessKeyId"),
                              (srv.access_key_id, "wrong", "SignatureDoesNotMatch")):
        with pytest.raises(ClientError) as caught:
            srv.client(access_key_id=key, secret_access_key=secret).get_object(Bucket="private", Key="k")
        assert caught.value.response["Error"]["Code"] == code

    creds = srv.client("sts").assume_role(RoleArn=srv.role_arn, RoleSessionName="init")["Credentials"]
    assumed = srv.client(access_key_id=creds["AccessKeyId"], secret_access_key=creds["SecretAccessKey"],
                         session_token=creds["SessionToken"])
    assert assumed.get_object(Bucket="private", Key="k")["Body"].read() == b"secret"


# ------------------------------------------------------------------------------------------------ Hub
def read_tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(root).parts}


MODEL = {"config.json": b'{"a": 1}', "model.safetensors": blob(3 * MB, 2), "sub/dir/tokenizer.json": b"{}"}


def test_hub_model_snapshot_info_tree(hub_server, tmp_path):
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    sha = hub_server.add_repo("org/model", MODEL, lfs_paths={"model.safetensors"})
    out = snapshot_download("org/model", local_dir=tmp_path / "m", cache_dir=tmp_path / "c",
                            endpoint=hub_server.endpoint, token=False)
    assert read_tree(tmp_path / "m") == MODEL

    api = HfApi(endpoint=hub_server.endpoint, token=False)
    info = api.model_info("org/model", files_metadata=True)
    assert info.sha == sha and len(sha) == 40
    lfs = {s.rfilename: s.lfs for s in info.siblings}
    assert lfs["model.safetensors"].sha256 == hashlib.sha256(MODEL["model.safetensors"]).hexdigest()
    assert lfs["config.json"] is None
    tree = {f.path: f for f in api.list_repo_tree("org/model", recursive=True)}
    assert set(tree) == {"config.json", "model.safetensors", "sub", "sub/dir", "sub/dir/tokenizer.json"}
    assert tree["model.safetensors"].lfs.size == 3 * MB
    assert [f.path for f in api.list_repo_tree("org/model", path_in_repo="sub/dir")] == ["sub/dir/tokenizer.json"]
    one = hf_hub_download("org/model", "sub/dir/tokenizer.json", cache_dir=tmp_path / "c2",
                          endpoint=hub_server.endpoint, token=False)
    assert open(one, "rb").read() == b"{}"
    assert out == str((tmp_path / "m").resolve())


def test_hub_dataset_snapshot_via_hf_endpoint_env(hub_server, tmp_path):
    files = {"train/part-0.parquet": blob(2 * MB, 3), "README.md": b"# data"}
    hub_server.add_repo("org/data", files, repo_type="dataset", lfs_paths={"train/part-0.parquet"})
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "snapshot_download('org/data', repo_type='dataset', local_dir=sys.argv[1])")
    env = hub_server.env(tmp_path / "hf_home")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], env=env, check=True, timeout=120)
    assert read_tree(tmp_path / "d") == files
    assert any(p.startswith("/api/datasets/org/data/revision/main") for _, p, _ in hub_server.requests)


def test_hub_rerun_transfers_no_bodies(hub_server, tmp_path):
    from huggingface_hub import snapshot_download

    hub_server.add_repo("org/rerun", MODEL, lfs_paths={"model.safetensors"})
    kwargs = dict(local_dir=tmp_path / "m", cache_dir=tmp_path / "c", endpoint=hub_server.endpoint, token=False)
    snapshot_download("org/rerun", **kwargs)
    assert len([p for p in hub_server.body_gets() if "org/rerun" in p]) == 3
    hub_server.requests.clear()
    snapshot_download("org/rerun", **kwargs)
    assert hub_server.requests and not hub_server.body_gets()


def test_hub_gated_private_and_bad_token(hub_server, tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    files = {"w.safetensors": blob(1000, 4)}
    hub_server.add_repo("org/gated", files, gated=True, lfs_paths={"w.safetensors"})
    hub_server.add_repo("org/private", files, private=True)
    get = lambda repo, token, d: snapshot_download(repo, local_dir=tmp_path / d, cache_dir=tmp_path / "c",  # noqa: E731
                                                   endpoint=hub_server.endpoint, token=token)
    with pytest.raises(GatedRepoError):
        get("org/gated", False, "g0")
    with pytest.raises(RepositoryNotFoundError):
        get("org/private", False, "p0")
    with pytest.raises(HfHubHTTPError) as caught:
        get("org/gated", "hf_wrong", "g1")
    assert caught.value.response.status_code == 401
    get("org/gated", hub_server.token, "g2")
    get("org/private", hub_server.token, "p2")
    assert read_tree(tmp_path / "g2") == files == read_tree(tmp_path / "p2")


def test_hub_lfs_redirect_to_cdn_drops_auth(hub_server, tmp_path):
    from huggingface_hub import snapshot_download

    hub_server.add_repo("org/cdn", MODEL, gated=True, lfs_paths={"model.safetensors"}, redirect_lfs=True)
    snapshot_download("org/cdn", local_dir=tmp_path / "m", cache_dir=tmp_path / "c",
                      endpoint=hub_server.endpoint, token=hub_server.token)
    assert read_tree(tmp_path / "m") == MODEL
    seen = [r for r in hub_server.log if "org/cdn" in r["path"] or r["cdn"]]
    cdn = [r for r in seen if r["cdn"] and r["method"] == "GET"]
    assert cdn and all("Authorization" not in r["headers"] for r in cdn)
    assert all(r["headers"]["authorization"] == f"Bearer {hub_server.token}" for r in seen if not r["cdn"])
    assert all("Authorization" in r["headers"] for r in seen if not r["cdn"])  # case-insensitive look-up


def test_hub_tree_pagination(hub_server):
    from huggingface_hub import HfApi

    files = {f"f{i:02}.txt": b"x" for i in range(7)}
    hub_server.add_repo("org/many", files)
    hub_server.tree_page_size = 3
    try:
        paths = [f.path for f in HfApi(endpoint=hub_server.endpoint, token=False).list_repo_tree("org/many")]
    finally:
        hub_server.tree_page_size = 1000
    assert paths == sorted(files)
    assert sum("/api/models/org/many/tree/" in p for _, p, _ in hub_server.requests) >= 3


def test_hub_raw_http_range_head_and_errors(hub_server):
    data = blob(5000, 5)
    sha = hub_server.add_repo("org/raw", {"w.bin": data, "c.json": b"{}"}, lfs_paths={"w.bin"})
    url = f"{hub_server.endpoint}/org/raw/resolve/main/w.bin"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=1000-1999"})) as r:
        assert r.status == 206 and r.read() == data[1000:2000]
        assert r.headers["Content-Range"] == "bytes 1000-1999/5000"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=4990-"})) as r:
        assert r.status == 206 and r.read() == data[4990:]
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as r:
        assert r.headers["X-Repo-Commit"] == sha and r.headers["Content-Length"] == "5000"
        assert r.headers["ETag"] == r.headers["X-Linked-Etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    with urllib.request.urlopen(f"{hub_server.endpoint}/org/raw/resolve/{sha}/c.json") as r:
        assert r.read() == b"{}" and r.headers["X-Linked-Etag"] is None
    for path, code in (("/org/nope/resolve/main/w.bin", "RepoNotFound"),
                       ("/org/raw/resolve/main/nope", "EntryNotFound"),
                       ("/org/raw/resolve/" + "0" * 40 + "/w.bin", "RevisionNotFound")):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(hub_server.endpoint + path)
        assert caught.value.code == 404 and caught.value.headers["X-Error-Code"] == code
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=6000-"}))
    assert caught.value.code == 416


# ------------------------------------------------------------------------------------------------ proxy
def test_proxy_s3_503_twice_is_retried(s3_server, fault_proxy):
    data = blob(200_000, 6)
    s3_server.make_bucket("flaky")
    s3_server.put("flaky", "obj", data)
    proxy = fault_proxy(s3_server.endpoint)
    fault = proxy.inject("/flaky/obj", "fail", status=503, times=2, method="GET")
    got = s3_server.client(endpoint=proxy.endpoint).get_object(Bucket="flaky", Key="obj")["Body"].read()
    assert got == data and fault.fired == 2
    assert [m for m, p, _ in proxy.requests if p.startswith("/flaky/obj")] == ["GET"] * 3


def test_proxy_keeps_sigv4_valid(s3_server_auth, fault_proxy):
    s3_server_auth.make_bucket("signed")
    proxy = fault_proxy(s3_server_auth.endpoint)
    client = s3_server_auth.client(endpoint=proxy.endpoint)
    client.put_object(Bucket="signed", Key="k", Body=b"via proxy")
    assert client.get_object(Bucket="signed", Key="k")["Body"].read() == b"via proxy"
    bad = s3_server_auth.client(endpoint=proxy.endpoint, secret_access_key="wrong")
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        bad.get_object(Bucket="signed", Key="k")


def test_proxy_drop_truncate_corrupt_slow_raw(hub_server, fault_proxy):
    data = blob(100_000, 7)
    hub_server.add_repo("org/faulty", {"w.bin": data})
    proxy = fault_proxy(hub_server.endpoint)
    url = f"{proxy.endpoint}/org/faulty/resolve/main/w.bin"

    proxy.inject("*/w.bin", "drop_after", n_bytes=10_000)
    with pytest.raises((ConnectionError, http.client.IncompleteRead)):
        urllib.request.urlopen(url).read()
    proxy.inject("*/w.bin", "truncate", n_bytes=10_000)
    with pytest.raises(http.client.IncompleteRead) as caught:
        urllib.request.urlopen(url).read()
    assert len(caught.value.partial) == 10_000
    proxy.inject("*/w.bin", "corrupt")
    corrupted = urllib.request.urlopen(url).read()
    assert len(corrupted) == len(data) and corrupted != data
    assert sum(a != b for a, b in zip(corrupted, data)) == 1
    proxy.inject("*/w.bin", "slow", bytes_per_second=200_000)
    start = time.monotonic()
    assert urllib.request.urlopen(url).read() == data
    assert time.monotonic() - start >= 0.4
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=10-19"})) as r:
        assert r.status == 206 and r.read() == data[10:20]  # faults used up: a plain pass-through again


def test_proxy_hub_truncation_is_resumed_with_range(hub_server, fault_proxy, tmp_path):
    from huggingface_hub import constants, snapshot_download

    # huggingface_hub writes (and so can resume from) whole DOWNLOAD_CHUNK_SIZE (10 MiB) chunks only
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    files = {**MODEL, "model.safetensors": blob(chunk + MB, 8)}
    hub_server.add_repo("org/resume", files, gated=True, lfs_paths={"model.safetensors"})  # token via proxy
    proxy = fault_proxy(hub_server.endpoint)
    proxy.inject("*/model.safetensors", "truncate", n_bytes=chunk + MB // 2)
    snapshot_download("org/resume", local_dir=tmp_path / "m", cache_dir=tmp_path / "c",
                      endpoint=proxy.endpoint, token=hub_server.token)
    assert read_tree(tmp_path / "m") == files
    ranges = [r for m, p, r in hub_server.requests if m == "GET" and "org/resume" in p and r]
    assert ranges == [f"bytes={chunk}-"]
