"""Smoke tests: the local storage servers work with the real clients (boto3, huggingface_hub, urllib)."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

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


# ------------------------------------------------------------------------------------------------ Hub uploads
@pytest.fixture
def hub_api(hub_server, monkeypatch):
    """HfApi with the token, on huggingface_hub's HTTP/LFS upload path: the Xet flag is read at import, so the
    environment variable alone comes too late in this process."""
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    return HfApi(endpoint=hub_server.endpoint, token=hub_server.token)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_tree(root, files: dict[str, bytes]):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def commits_to(hub_server, repo_id: str) -> list:
    return [c for c in hub_server.commits_made if c.repo_id == repo_id]


def lfs_puts(hub_server, repo_id: str) -> list[str]:
    """LFS bytes sent: the PUTs to the signed upload hrefs."""
    return [p for m, p, _ in hub_server.requests if m == "PUT" and f"/{repo_id}/" in p]


CHECKPOINT = {"config.json": b'{"step": 1}', "weights/model.safetensors": blob(MB + 1, 9)}


def test_hub_create_repo_exist_ok_model_and_private_dataset(hub_server, hub_api):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    for _ in range(2):
        url = hub_api.create_repo("up/created", exist_ok=True)
        assert (url.repo_type, url.repo_id) == ("model", "up/created") and url == f"{hub_server.endpoint}/up/created"
    with pytest.raises(HfHubHTTPError) as caught:
        hub_api.create_repo("up/created")
    assert caught.value.response.status_code == 409

    for _ in range(2):
        url = hub_api.create_repo("up/secret", repo_type="dataset", private=True, exist_ok=True)
        assert (url.repo_type, url.repo_id) == ("dataset", "up/secret")
    info = hub_api.dataset_info("up/secret")
    assert info.private and info.sha == hub_server.repos[("dataset", "up/secret")].head and len(info.sha) == 40
    assert list(hub_api.list_repo_tree("up/secret", repo_type="dataset")) == []  # empty, but it has a commit
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub_server.endpoint, token=False).dataset_info("up/secret")
    assert hub_api.create_repo("bare", exist_ok=True).repo_id == f"{hub_server.user}/bare"


def test_hub_upload_folder_lfs_and_regular_round_trip(hub_server, hub_api, monkeypatch, tmp_path):
    from huggingface_hub import hf_hub_download, snapshot_download

    monkeypatch.setattr(hub_server, "lfs_threshold", MB)  # the Hub's is 10 MiB: a small LFS file is enough here
    folder = write_tree(tmp_path / "out", CHECKPOINT)
    hub_api.create_repo("up/model", exist_ok=True)
    info = hub_api.upload_folder(repo_id="up/model", folder_path=folder, path_in_repo="ckpt/step-1")

    expected = {f"ckpt/step-1/{name}": data for name, data in CHECKPOINT.items()}
    [commit] = commits_to(hub_server, "up/model")
    assert sorted(commit.added) == sorted(expected) and commit.deleted == [] and commit.revision == "main"
    assert info.oid == commit.oid == hub_api.model_info("up/model").sha != commit.parent
    assert len(lfs_puts(hub_server, "up/model")) == 1  # the LFS file; the small one rides in the commit

    snapshot_download("up/model", local_dir=tmp_path / "m", cache_dir=tmp_path / "c", endpoint=hub_server.endpoint,
                      token=hub_server.token)
    assert read_tree(tmp_path / "m") == expected
    one = hf_hub_download("up/model", "ckpt/step-1/weights/model.safetensors", cache_dir=tmp_path / "c2",
                          endpoint=hub_server.endpoint, token=False)
    assert Path(one).read_bytes() == CHECKPOINT["weights/model.safetensors"]

    tree = {f.path: f for f in hub_api.list_repo_tree("up/model", recursive=True)}
    assert set(tree) == set(expected) | {"ckpt", "ckpt/step-1", "ckpt/step-1/weights"}
    big, small = tree["ckpt/step-1/weights/model.safetensors"], tree["ckpt/step-1/config.json"]
    assert big.lfs.sha256 == hashlib.sha256(CHECKPOINT["weights/model.safetensors"]).hexdigest()
    assert big.lfs.size == big.size == MB + 1
    assert small.lfs is None and small.blob_id == git_blob_sha1(CHECKPOINT["config.json"])


def test_hub_upload_again_sends_no_lfs_bytes(hub_server, hub_api, monkeypatch, tmp_path):
    monkeypatch.setattr(hub_server, "lfs_threshold", MB)
    folder = write_tree(tmp_path / "out", CHECKPOINT)
    hub_api.create_repo("up/again", exist_ok=True)
    first = hub_api.upload_folder(repo_id="up/again", folder_path=folder, path_in_repo="step-1")
    assert len(lfs_puts(hub_server, "up/again")) == 1

    def batches() -> int:
        return sum(m == "POST" and p == "/up/again.git/info/lfs/objects/batch" for m, p, _ in hub_server.requests)

    assert batches() == 1

    # the same files elsewhere in the repo: one commit; the batch answers "stored" (no upload action)
    second = hub_api.upload_folder(repo_id="up/again", folder_path=folder, path_in_repo="step-2")
    commits = commits_to(hub_server, "up/again")
    assert len(commits) == 2 and commits[1].parent == first.oid and second.oid == commits[1].oid
    assert sorted(commits[1].added) == ["step-2/config.json", "step-2/weights/model.safetensors"]
    assert batches() == 2 and len(lfs_puts(hub_server, "up/again")) == 1

    # the very same upload again: preupload's oids tell huggingface_hub nothing changed, so it commits nothing
    third = hub_api.upload_folder(repo_id="up/again", folder_path=folder, path_in_repo="step-2")
    assert third.oid == second.oid and len(commits_to(hub_server, "up/again")) == 2
    assert batches() == 3 and len(lfs_puts(hub_server, "up/again")) == 1


def test_hub_upload_dataset_from_a_subprocess_with_env(hub_server, monkeypatch, tmp_path):
    from huggingface_hub import snapshot_download

    monkeypatch.setattr(hub_server, "lfs_threshold", MB)
    files = {"train/part-0.parquet": blob(MB, 11), "notes.txt": b"a small file"}
    code = ("import sys; from huggingface_hub import HfApi; api = HfApi(); "
            "api.create_repo('up/data', repo_type='dataset', exist_ok=True); "
            "api.upload_folder(repo_id='up/data', repo_type='dataset', folder_path=sys.argv[1])")
    env = hub_server.env(tmp_path / "hf_home") | {"HF_TOKEN": hub_server.token}  # HF_HUB_DISABLE_XET=1 in there
    subprocess.run([sys.executable, "-c", code, str(write_tree(tmp_path / "out", files))], env=env, check=True,
                   timeout=60)
    [commit] = commits_to(hub_server, "up/data")
    assert commit.repo_type == "dataset" and sorted(commit.added) == sorted(files)
    [put] = lfs_puts(hub_server, "up/data")
    assert put.startswith("/_lfs/datasets/up/data/")  # the dataset batch route (/datasets/up/data.git/...) was used
    snapshot_download("up/data", repo_type="dataset", local_dir=tmp_path / "d", cache_dir=tmp_path / "c",
                      endpoint=hub_server.endpoint, token=False)
    assert read_tree(tmp_path / "d") == files


def test_hub_writes_need_the_token(hub_server, hub_api):
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    hub_api.create_repo("up/guarded", exist_ok=True)
    for token in (False, "hf_wrong"):
        api = HfApi(endpoint=hub_server.endpoint, token=token)
        with pytest.raises(HfHubHTTPError) as caught:
            api.create_commit("up/guarded", [CommitOperationAdd("a.txt", b"x")], commit_message="no token")
        assert caught.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError) as caught:
            api.create_repo("up/not-created")
        assert caught.value.response.status_code == 401
    assert commits_to(hub_server, "up/guarded") == [] and ("model", "up/not-created") not in hub_server.repos
    assert HfApi(endpoint=hub_server.endpoint, token=False).model_info("up/guarded").sha  # reads stay open


def test_hub_injected_failures_and_stale_parent(hub_server, hub_api, monkeypatch):
    from huggingface_hub import CommitOperationAdd
    from huggingface_hub.errors import HfHubHTTPError

    hub_api.create_repo("up/flaky", exist_ok=True)

    def add(data: bytes) -> list:  # a fresh operation each time: huggingface_hub refuses to reuse one
        return [CommitOperationAdd("a.bin", data)]

    first = hub_api.create_commit("up/flaky", add(b"one"), commit_message="one")

    fault = hub_server.fail_next("/api/models/up/flaky/commit/*", 500)
    with pytest.raises(HfHubHTTPError) as caught:  # huggingface_hub does not retry a commit
        hub_api.create_commit("up/flaky", add(b"two"), commit_message="two")
    assert caught.value.response.status_code == 500 and fault.fired == 1
    assert hub_server.repos[("model", "up/flaky")].head == first.oid and len(commits_to(hub_server, "up/flaky")) == 1

    second = hub_api.create_commit("up/flaky", add(b"two"), commit_message="two", parent_commit=first.oid)
    with pytest.raises(HfHubHTTPError) as caught:
        hub_api.create_commit("up/flaky", add(b"three"), commit_message="three", parent_commit=first.oid)
    assert caught.value.response.status_code == 412 and hub_api.model_info("up/flaky").sha == second.oid

    monkeypatch.setattr(hub_server, "lfs_threshold", 1)  # every file LFS: the batch route is used
    fault = hub_server.fail_next("*.git/info/lfs/objects/batch", 403)  # a 4xx: not retried
    with pytest.raises(HfHubHTTPError) as caught:
        hub_api.create_commit("up/flaky", add(b"four"), commit_message="four")
    assert caught.value.response.status_code == 403 and fault.fired == 1
    hub_api.create_commit("up/flaky", add(b"four"), commit_message="four")
    [entry] = hub_api.list_repo_tree("up/flaky")
    assert entry.lfs.sha256 == hashlib.sha256(b"four").hexdigest()


def test_hub_raw_lfs_protocol_checks(hub_server, hub_api):
    hub_api.create_repo("up/raw", exist_ok=True)
    data = blob(1000, 12)
    oid = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {hub_server.token}"}

    def post(path: str, body: bytes, **headers):
        request = urllib.request.Request(hub_server.endpoint + path, data=body, method="POST", headers=auth | headers)
        return urllib.request.urlopen(request)

    def commit(oid: str):
        lines = [{"key": "header", "value": {"summary": "raw", "description": ""}},
                 {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": len(data)}}]
        return post("/api/models/up/raw/commit/main", b"".join(json.dumps(x).encode() + b"\n" for x in lines),
                    **{"Content-Type": "application/x-ndjson"})

    with pytest.raises(urllib.error.HTTPError) as caught:  # a pointer to LFS bytes never uploaded
        commit(oid)
    assert caught.value.code == 400 and "LFS pointer" in caught.value.headers["X-Error-Message"]

    batch = {"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": len(data)}]}
    with post("/up/raw.git/info/lfs/objects/batch", json.dumps(batch).encode()) as r:
        [obj] = json.load(r)["objects"]
    upload, verify = obj["actions"]["upload"]["href"], obj["actions"]["verify"]["href"]
    for url, body, code in ((upload, data[::-1], 400), (upload.split("?")[0], data, 403)):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"))
        assert caught.value.code == code
    with urllib.request.urlopen(urllib.request.Request(upload, data=data, method="PUT")) as r:  # no token: signed
        assert r.status == 200
    with urllib.request.urlopen(urllib.request.Request(
            verify, data=json.dumps({"oid": oid, "size": len(data)}).encode(), method="POST", headers=auth)) as r:
        assert r.status == 200
    with commit(oid) as r:
        sha = json.load(r)["commitOid"]
    with urllib.request.urlopen(f"{hub_server.endpoint}/up/raw/resolve/main/w.bin") as r:
        assert r.read() == data and r.headers["X-Repo-Commit"] == sha


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
