"""The hf:// and https:// data path through the real CLI: a real local Hub (with a CDN origin it
redirects LFS files to), the real fault proxy, and a small real server that ignores Range."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import REPO, clean_env, launcher, wait_for
from storage_servers import HubServer


def init(kind: str, env: dict, out: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    full = clean_env(LAUNCHER_TERMINATION_LOG=str(out.parent / f"{out.name}.termination.json"), **env)
    return subprocess.run(launcher("init", kind, "--output", str(out), *args), env=full, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".trainer-launcher" not in p.parts}


def manifest(out: Path) -> dict:
    return json.loads((out / ".trainer-launcher" / "manifest.json").read_text())


def count_connections(server) -> list:
    """Every TCP connection the server accepts, counted where it accepts them."""
    accepted = []
    original = server.get_request

    def get_request():
        connection = original()
        accepted.append(connection[1])
        return connection

    server.get_request = get_request
    return accepted


@pytest.fixture
def hub():
    server = HubServer()
    yield server
    server.stop()


def hub_env(hub, tmp_path, uri, endpoint=None, **extra):
    return {**{k: v for k, v in hub.env(tmp_path / "hf-home", endpoint).items() if k.startswith("HF_")},
            "STORAGE_URI": uri, **extra}


SMALL = {f"shards/{i:03d}.json": os.urandom(1000 + i) for i in range(80)}


def test_many_small_files_share_keep_alive_connections_and_verify(hub, tmp_path):
    files = {**SMALL, "model.safetensors": os.urandom(3 * 1024 * 1024)}
    hub.add_repo("acme/many", files, lfs_paths={"model.safetensors"})
    accepted = count_connections(hub._server)
    out = tmp_path / "model"
    result = init("model", hub_env(hub, tmp_path, "hf://acme/many"), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == files
    assert "sha256:" + hashlib.sha256(files["model.safetensors"]).hexdigest() in json.dumps(
        manifest(out)["files"]["model.safetensors"])
    gets = hub.body_gets()
    assert len(gets) == len(files)
    # One connection per file was the old behaviour; now each of the 8 workers keeps its own
    # (plus huggingface_hub's few for listing).
    assert len(accepted) <= 8 + 4, (len(accepted), len(gets))


def test_lfs_redirect_to_another_origin_carries_no_credentials(hub, tmp_path):
    files = {"config.json": b'{"a": 1}', "weights.safetensors": os.urandom(200_000), "b.safetensors": os.urandom(9000)}
    hub.add_repo("acme/gated", files, gated=True, lfs_paths={"weights.safetensors", "b.safetensors"},
                 redirect_lfs=True)
    out = tmp_path / "model"
    result = init("model", hub_env(hub, tmp_path, "hf://acme/gated", ACCESS_TOKEN=hub.token), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == files
    cdn = [e for e in hub.log if e["cdn"]]
    resolves = [e for e in hub.log if not e["cdn"] and "/resolve/" in e["path"]]
    assert len(cdn) == 2 and all("Authorization" not in e["headers"] for e in cdn)
    assert resolves and all(e["headers"].get("Authorization") == f"Bearer {hub.token}" for e in resolves)
    assert hub.token not in result.stdout + result.stderr


def test_resets_truncation_and_corrupt_bytes_are_retried_until_verified(hub, fault_proxy, tmp_path):
    files = {"a.json": os.urandom(70_000), "b.json": os.urandom(70_000), "c.json": os.urandom(70_000),
             "w.safetensors": os.urandom(600_000)}
    hub.add_repo("acme/faulty", files, lfs_paths={"w.safetensors"})
    proxy = fault_proxy(hub.endpoint)
    faults = [proxy.inject("*/resolve/*/a.json", "drop_after", n_bytes=1000),
              proxy.inject("*/resolve/*/b.json", "truncate", n_bytes=5000),
              proxy.inject("*/resolve/*/c.json", "corrupt"),  # git-sha1 catches it
              proxy.inject("*/resolve/*/w.safetensors", "corrupt")]  # sha256 catches it
    out = tmp_path / "model"
    result = init("model", hub_env(hub, tmp_path, "hf://acme/faulty", endpoint=proxy.endpoint), out)
    assert result.returncode == 0, result.stderr
    assert [f.fired for f in faults] == [1, 1, 1, 1]
    assert files_under(out) == files
    assert result.stderr.count("retrying") >= 4, result.stderr


class _RangeBlindHandler(BaseHTTPRequestHandler):
    """Says Accept-Ranges but always answers 200 with the whole body, slowly when asked to."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        server.seen.append((self.command, self.headers.get("Range")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(server.data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"v1"')
        self.end_headers()
        if self.command == "HEAD":
            return
        step = 64 * 1024
        for start in range(0, len(server.data), step):
            if server.throttle.is_set():
                time.sleep(0.02)
            try:
                self.wfile.write(server.data[start:start + step])
            except OSError:
                return

    do_HEAD = do_GET


@pytest.fixture
def range_blind():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RangeBlindHandler)
    server.daemon_threads = True
    server.data, server.seen, server.throttle = os.urandom(6 * 1024 * 1024), [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_kill_9_then_resume_against_a_server_that_ignores_range(range_blind, tmp_path):
    url = f"http://127.0.0.1:{range_blind.server_address[1]}/files/blob.bin"
    out = tmp_path / "data"
    env = clean_env(STORAGE_URI=url, LAUNCHER_INIT_CHUNK_SIZE="65536")
    range_blind.throttle.set()
    first = subprocess.Popen(launcher("init", "dataset", "--output", str(out)), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / ".trainer-launcher" / "parts"

    def part_size() -> int:
        return max((p.stat().st_size for p in parts.glob("*.part")), default=0) if parts.exists() else 0

    wait_for(lambda: part_size() > 1024 * 1024, timeout=60, what="a partial blob.bin")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert not (out / "blob.bin").exists()
    range_blind.throttle.clear()
    before = len(range_blind.seen)
    result = init("dataset", {"STORAGE_URI": url}, out)
    assert result.returncode == 0, result.stderr
    assert (out / "blob.bin").read_bytes() == range_blind.data
    ranges = [r for method, r in range_blind.seen[before:] if method == "GET"]
    assert ranges and ranges[0] and not ranges[0].startswith("bytes=0-")  # asked to resume; got 200; skipped
    assert "resumed" in result.stderr


def test_an_http_proxy_from_the_environment_carries_the_body_gets(hub, fault_proxy, tmp_path):
    # The fault proxy forwards absolute-form requests too, so it stands in for a forward proxy here.
    files = {"a.json": b"{}", "w.safetensors": os.urandom(100_000)}
    hub.add_repo("acme/proxied", files, lfs_paths={"w.safetensors"})
    proxy = fault_proxy(hub.endpoint)
    out = tmp_path / "model"
    env = hub_env(hub, tmp_path, "hf://acme/proxied", HTTP_PROXY=proxy.endpoint, http_proxy=proxy.endpoint,
                  NO_PROXY="", no_proxy="")
    result = init("model", env, out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == files
    assert sum("/resolve/" in path for method, path, _ in proxy.requests if method == "GET") == 2
