"""Export after success (`--export-uri`): the job's output uploaded before the pod exits 0, through
`trainer-launcher exec` and a real two-node torch job, to real destinations: a directory (on
another file system too), a moto S3 server process behind the fault proxy, and the Hub stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, Job, clean_env, launcher, wait_for

MANIFEST = ".trainer-launcher-export.json"
BIG = os.urandom(20 * 1024 * 1024)  # above one part (16 MiB): uploaded in two parts


def write_tree(root: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST}


def export(tmp_path: Path, uri: str, output: Path, *, command: str = "true", env: dict | None = None,
           args: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    log = tmp_path / "termination.json"
    full = clean_env(LAUNCHER_TERMINATION_LOG=str(log), **(env or {}))
    result = subprocess.run(launcher("exec", "--export-uri", uri, "--export-path", str(output), *args, "--", "sh", "-c",
                                     command), env=full, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    result.termination = json.loads(log.read_text()) if log.exists() else None
    return result


@pytest.fixture
def output(tmp_path: Path) -> Path:
    path = tmp_path / "output"
    write_tree(path, {"config.json": b'{"hidden": 8}', "weights/model.bin": os.urandom(300_000), "empty.txt": b""})
    return path


# --------------------------------------------------------------------------------------- file://
def test_a_successful_job_exports_its_output_then_exits_0_with_a_manifest_listing_every_file(tmp_path, output):
    destination = tmp_path / "models" / "run-1"
    result = export(tmp_path, f"file://{destination}", output)
    assert result.returncode == 0, result.stderr
    assert tree_of(destination) == tree_of(output)
    manifest = json.loads((destination / MANIFEST).read_text())
    assert {f["path"]: (f["size"], f["md5"]) for f in manifest["files"]} == {
        path: (len(data), hashlib.md5(data).hexdigest()) for path, data in tree_of(output).items()}
    assert f"exported 3 files to file://{destination}" in result.stderr
    assert result.termination["exportUri"] == f"file://{destination}" and result.termination["exportFiles"] == 3
    assert not list(destination.parent.glob(".*trainer-launcher-export*")), "the staging directory is gone"


def test_a_rerun_copies_only_what_changed_and_swaps_the_whole_directory(tmp_path, output):
    destination = tmp_path / "run"
    assert export(tmp_path, f"file://{destination}", output).returncode == 0
    before = (destination / "weights" / "model.bin").stat().st_ino
    (output / "config.json").write_bytes(b'{"hidden": 16}')
    (output / "empty.txt").unlink()
    result = export(tmp_path, f"file://{destination}", output)
    assert result.returncode == 0, result.stderr
    assert "1 of 2 files to send" in result.stderr, result.stderr
    assert tree_of(destination) == tree_of(output)  # the removed file is gone from the export too
    assert (destination / "weights" / "model.bin").stat().st_ino == before  # linked into the new one, not copied


def test_across_file_systems_the_export_is_byte_identical(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system other than the test's directory")
    source = Path(os.environ.get("TMPDIR_SHM", shm)) / f"export-{os.getpid()}-{tmp_path.name}"
    try:
        files = write_tree(source, {"a.bin": os.urandom(2_000_000), "nested/b.txt": b"b"})
        result = export(tmp_path, f"file://{tmp_path / 'out'}", source)
        assert result.returncode == 0, result.stderr
        assert tree_of(tmp_path / "out") == files
    finally:
        subprocess.run(["rm", "-rf", str(source)], check=False)


def test_a_failed_job_exports_nothing_and_keeps_its_exit_code(tmp_path, output):
    destination = tmp_path / "run"
    result = export(tmp_path, f"file://{destination}", output, command="exit 3")
    assert result.returncode == 3, result.stderr
    assert not destination.exists()
    assert "export: skipped, the job failed" in result.stderr


def test_export_on_failure_exports_the_checkpoints_and_the_job_still_fails_with_its_code(tmp_path, output):
    destination = tmp_path / "run"
    result = export(tmp_path, f"file://{destination}", output, command="exit 3", args=("--export-on-failure", "1"))
    assert result.returncode == 3, result.stderr
    assert tree_of(destination) == tree_of(output)
    assert result.termination["reason"] == "Failed" and result.termination["exportFiles"] == 3


def test_a_directory_that_is_not_an_export_is_refused_and_left_as_it_was(tmp_path, output):
    destination = tmp_path / "someone-elses"
    write_tree(destination, {"keep.txt": b"mine"})
    result = export(tmp_path, f"file://{destination}", output)
    assert result.returncode == 2, result.stderr
    assert result.termination["reason"] == "ExportRejected" and result.termination["exportCause"] == "PathClash"
    assert f"is not an export (no {MANIFEST})" in result.stderr
    assert tree_of(destination) == {"keep.txt": b"mine"}


@pytest.mark.parametrize("manifest", [b"not json", b'{"files": "nope"}', b"[1, 2]"], ids=["text", "bad-files", "list"])
def test_a_directory_whose_manifest_is_not_ours_is_refused_and_left_as_it_was(tmp_path, output, manifest):
    destination = tmp_path / "claims-to-be-an-export"
    write_tree(destination, {MANIFEST: manifest, "keep.txt": b"mine"})
    result = export(tmp_path, f"file://{destination}", output)
    assert result.returncode == 2, result.stderr
    assert (result.termination["reason"], result.termination["exportCause"]) == ("ExportRejected", "PathClash")
    assert "Traceback" not in result.stderr
    assert (destination / "keep.txt").read_bytes() == b"mine" and (destination / MANIFEST).read_bytes() == manifest


def test_a_missing_output_directory_is_one_line_naming_the_flag_and_exit_2(tmp_path):
    result = export(tmp_path, f"file://{tmp_path / 'run'}", tmp_path / "nowhere")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"--export-path={tmp_path / 'nowhere'} does not exist" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_export_uri_fails_before_the_job_starts(tmp_path, output):
    marker = tmp_path / "ran"
    result = export(tmp_path, "ftp://host/x", output, command=f"touch {marker}")
    assert result.returncode == 2
    assert "--export-uri='ftp://host/x': expected one of the schemes s3://, hf://, file://" in result.stderr
    assert not marker.exists(), "the job must not run when its export cannot"


# ------------------------------------------------------------------------------------------ s3://
def s3_env(server, endpoint: str | None = None) -> dict[str, str]:
    return {"ENDPOINT": endpoint or server.endpoint, "ACCESS_KEY_ID": server.access_key_id,
            "SECRET_ACCESS_KEY": server.secret_access_key}


def objects(server, bucket: str, prefix: str) -> dict[str, bytes]:
    client = server.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_s3_gets_every_file_verified_then_the_manifest_last(s3_server, fault_proxy, tmp_path, output):
    bucket = s3_server.make_bucket("exports")
    write_tree(output, {"shard.bin": BIG})
    proxy = fault_proxy(s3_server.endpoint)
    result = export(tmp_path, "s3://exports/runs/1", output, env=s3_env(s3_server, proxy.endpoint))
    assert result.returncode == 0, result.stderr
    stored = objects(s3_server, bucket, "runs/1/")
    manifest = json.loads(stored.pop(MANIFEST))
    assert stored == tree_of(output)
    assert {f["path"]: f["s3-etag"] for f in manifest["files"]}["shard.bin"].endswith("-2")  # two parts, verified
    writes = [(method, path) for method, path, _ in proxy.requests if method in ("PUT", "POST", "DELETE")]
    assert writes[-1] == ("PUT", f"/exports/runs/1/{MANIFEST}"), writes  # after every file's last write


def test_s3_rerun_sends_only_what_changed_and_takes_the_old_manifest_back_first(s3_server, fault_proxy, tmp_path,
                                                                                output):
    s3_server.make_bucket("exports")
    env = s3_env(s3_server)
    assert export(tmp_path, "s3://exports/runs/2", output, env=env).returncode == 0
    (output / "config.json").write_bytes(b'{"hidden": 32}')
    proxy = fault_proxy(s3_server.endpoint)
    result = export(tmp_path, "s3://exports/runs/2", output, env=s3_env(s3_server, proxy.endpoint))
    assert result.returncode == 0, result.stderr
    writes = [(method, path.split("?")[0]) for method, path, _ in proxy.requests if method in ("PUT", "DELETE")]
    assert writes == [("DELETE", f"/exports/runs/2/{MANIFEST}"), ("PUT", "/exports/runs/2/config.json"),
                      ("PUT", f"/exports/runs/2/{MANIFEST}")], writes
    assert objects(s3_server, "exports", "runs/2/")["config.json"] == b'{"hidden": 32}'


def test_s3_server_errors_and_resets_are_retried(s3_server, fault_proxy, tmp_path, output):
    s3_server.make_bucket("exports")
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("/exports/runs/3/config.json", "fail", times=2, method="PUT", status=503)
    proxy.inject("/exports/runs/3/weights/model.bin", "drop_after", times=1, method="PUT", n_bytes=0)
    result = export(tmp_path, "s3://exports/runs/3", output, env=s3_env(s3_server, proxy.endpoint))
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in objects(s3_server, "exports", "runs/3/").items() if k != MANIFEST} == tree_of(output)


def test_s3_a_bucket_that_is_not_there_is_export_rejected_exit_2(s3_server, tmp_path, output):
    result = export(tmp_path, "s3://no-such-bucket-here/x", output, env=s3_env(s3_server))
    assert result.returncode == 2, result.stderr
    assert (result.termination["reason"], result.termination["exportCause"]) == ("ExportRejected", "NotFound")
    assert f"the output is still in {output}" in result.termination["message"]


def test_s3_refused_credentials_are_export_rejected_and_the_secret_is_never_shown(s3_server_auth, tmp_path, output):
    s3_server_auth.make_bucket("exports")
    env = {**s3_env(s3_server_auth), "SECRET_ACCESS_KEY": "not-the-secret-1234"}
    result = export(tmp_path, "s3://exports/x", output, env=env)
    assert result.returncode == 2, result.stderr
    assert (result.termination["reason"], result.termination["exportCause"]) == ("ExportRejected", "AuthFailed")
    assert "not-the-secret-1234" not in result.stdout + result.stderr + json.dumps(result.termination)


def test_s3_a_pod_killed_mid_export_resumes_and_sends_only_what_is_missing(s3_server, fault_proxy, tmp_path, output):
    s3_server.make_bucket("exports")
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("/exports/runs/4/weights/model.bin", "stall", times=1, method="PUT", seconds=120)
    log = tmp_path / "killed.json"
    job = Job(launcher("exec", "--export-uri", "s3://exports/runs/4", "--export-path", str(output), "--", "true"),
              clean_env(LAUNCHER_TERMINATION_LOG=str(log), **s3_env(s3_server, proxy.endpoint)), tmp_path, "killed")
    try:
        wait_for(lambda: set(objects(s3_server, "exports", "runs/4/")) == {"config.json", "empty.txt"}
                 and any(p.startswith("/exports/runs/4/weights/model.bin") for _, p, _ in proxy.requests),
                 what="two files stored and the third one's upload stalled")
    finally:
        job.signal(signal.SIGKILL)  # the pod's container killed: no word, no clean-up
        job.wait()
    assert MANIFEST not in objects(s3_server, "exports", "runs/4/")  # readers know it is not complete
    result = export(tmp_path, "s3://exports/runs/4", output, env=s3_env(s3_server))
    assert result.returncode == 0, result.stderr
    assert "1 of 3 files to send" in result.stderr, result.stderr
    assert MANIFEST in objects(s3_server, "exports", "runs/4/")


def test_s3_a_sigterm_mid_export_ends_the_pod_as_terminated_without_a_manifest(s3_server, fault_proxy, tmp_path,
                                                                              output):
    s3_server.make_bucket("exports")
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("/exports/runs/5/weights/model.bin", "stall", times=1, method="PUT", seconds=120)
    job = Job(launcher("exec", "--export-uri", "s3://exports/runs/5", "--export-path", str(output), "--", "true"),
              clean_env(**s3_env(s3_server, proxy.endpoint)), tmp_path, "stopped")
    wait_for(lambda: any(p.startswith("/exports/runs/5/weights/model.bin") for _, p, _ in proxy.requests),
             what="the upload of weights/model.bin under way")
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143, job.stderr
    assert job.termination()["reason"] == "Terminated"
    assert "export: stopped by a signal" in job.stderr
    assert MANIFEST not in objects(s3_server, "exports", "runs/5/")


# ------------------------------------------------------------------------------- where it runs
WRITE_OUTPUT = str(REPO / "tests" / "programs" / "write_output.py")


def test_on_a_two_node_torch_job_each_node_exports_its_own_directory_with_export_per_node(tmp_path):
    destination, shared = tmp_path / "exports", tmp_path / "output"
    env = clean_env(EXPORT_URI=f"file://{destination}", EXPORT_PATH=str(shared), EXPORT_PER_NODE="1")
    job = Job(launcher("local", "--nnodes", "2", "--nproc-per-node", "1", "--", WRITE_OUTPUT), env, tmp_path)
    assert job.wait(180) == 0, job.stderr
    # Both nodes wrote into one directory here (one machine): each exported what it found, under its index.
    assert tree_of(destination / "node-0") == tree_of(destination / "node-1") == tree_of(shared)
    assert set(tree_of(shared)) == {"rank-0.txt", "rank-1.txt"}


def test_by_default_only_node_0_exports(tmp_path, output):
    result = export(tmp_path, f"file://{tmp_path / 'run'}", output, env={"JOB_COMPLETION_INDEX": "1"})
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "run").exists() and "export" not in result.termination
    result = export(tmp_path, f"file://{tmp_path / 'run'}", output, env={"JOB_COMPLETION_INDEX": "0"})
    assert result.returncode == 0 and tree_of(tmp_path / "run") == tree_of(output)


def test_a_launcher_nested_in_exec_leaves_the_export_to_the_outer_one(tmp_path, output):
    inner = " ".join(launcher("exec", "--", "true"))
    result = export(tmp_path, f"file://{tmp_path / 'run'}", output, command=inner)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("export: 3 of 3 files to send") == 1, result.stderr


def test_the_trainjob_shows_the_export_in_progress_then_its_uri_and_file_count(tmp_path, status_server, s3_server,
                                                                              fault_proxy):
    s3_server.make_bucket("exports")
    proxy = fault_proxy(s3_server.endpoint)
    shared = tmp_path / "output"
    write_tree(shared, {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000, "slow.bin": b"s" * 1000})
    proxy.inject("/exports/status/slow.bin", "stall", times=1, method="PUT", seconds=8)
    env = clean_env(**status_server.env(), **s3_env(s3_server, proxy.endpoint), EXPORT_URI="s3://exports/status",
                    EXPORT_PATH=str(shared), OUT_DIR=str(tmp_path / "ranks"))
    job = Job(launcher("torch", "--", "--standalone", "--nproc-per-node", "1", WRITE_OUTPUT), env, tmp_path)
    assert job.wait(180) == 0, job.stderr

    def metrics(record: dict) -> dict[str, str]:
        return {m["name"]: m["value"] for m in ((record.get("body") or {}).get("trainerStatus") or {}).get("metrics", [])}

    records = [metrics(r) for r in status_server.wait_for(lambda rs: any("exit_code" in metrics(r) for r in rs))]
    assert any(m.get("export", "").startswith("2/3 files") for m in records), records
    final = next(m for m in records if "exit_code" in m)
    assert (final["exit_code"], final["export_uri"], final["export_files"]) == ("0", "s3://exports/status", "3")


# ------------------------------------------------------------------------------------------ hf://
@pytest.fixture
def hub(hub_server, tmp_path):
    """The session's Hub stand-in, with files from 100 kB up stored as LFS (10 MiB on the Hub)."""
    before, hub_server.lfs_threshold = hub_server.lfs_threshold, 100_000
    yield hub_server
    hub_server.lfs_threshold = before


def hub_env(hub, tmp_path: Path, token: str | None = None) -> dict[str, str]:
    return {**hub.env(tmp_path / "hf-home"), "ACCESS_TOKEN": token or hub.token}


def commits_to(hub, repo: str) -> list:
    return [c for c in hub.commits_made if c.repo_id == repo]


def test_hf_gets_one_commit_whose_files_are_the_outputs_lfs_and_regular(hub, tmp_path, output):
    from huggingface_hub import HfApi

    result = export(tmp_path, "hf://team/model-1/checkpoints", output, env=hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    (commit,) = commits_to(hub, "team/model-1")
    assert sorted(commit.added) == sorted(f"checkpoints/{p}" for p in tree_of(output))
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    tree = {e.path: e for e in api.list_repo_tree("team/model-1", recursive=True) if hasattr(e, "blob_id")}
    weights = (output / "weights" / "model.bin").read_bytes()
    assert tree["checkpoints/weights/model.bin"].lfs.sha256 == hashlib.sha256(weights).hexdigest()
    assert tree["checkpoints/config.json"].lfs is None
    assert result.termination["exportUri"] == "hf://team/model-1/checkpoints"


def test_hf_rerun_commits_only_what_changed_and_nothing_when_nothing_did(hub, tmp_path, output):
    env = hub_env(hub, tmp_path)
    assert export(tmp_path, "hf://team/model-2", output, env=env).returncode == 0
    again = export(tmp_path, "hf://team/model-2", output, env=env)
    assert again.returncode == 0 and "0 of 3 files to send" in again.stderr, again.stderr
    assert len(commits_to(hub, "team/model-2")) == 1
    (output / "config.json").write_bytes(b'{"hidden": 64}')
    changed = export(tmp_path, "hf://team/model-2", output, env=env)
    assert changed.returncode == 0, changed.stderr
    assert [c.added for c in commits_to(hub, "team/model-2")][-1] == ["config.json"]


def test_hf_a_failed_commit_is_retried(hub, tmp_path, output):
    fault = hub.fail_next("/api/models/team/model-3/commit/*", status=500, times=1)
    result = export(tmp_path, "hf://team/model-3", output, env=hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    assert fault.fired == 1 and len(commits_to(hub, "team/model-3")) == 1


def test_hf_a_refused_token_is_export_rejected_and_never_shown(hub, tmp_path, output):
    result = export(tmp_path, "hf://team/model-4", output, env=hub_env(hub, tmp_path, token="hf_wrong_secret_5678"))
    assert result.returncode == 2, result.stderr
    assert (result.termination["reason"], result.termination["exportCause"]) == ("ExportRejected", "AuthFailed")
    assert "hf_wrong_secret_5678" not in result.stdout + result.stderr + json.dumps(result.termination)
