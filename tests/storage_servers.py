"""Real local storage servers for the initializer tests, all bound to 127.0.0.1.

- ``s3_server`` / ``s3_server_auth``: moto_server subprocesses (the second enforces IAM auth).
- ``hub_server``: a Hugging Face Hub look-alike good enough for huggingface_hub 2.4: downloads, and uploads
  over HTTP/LFS with Xet off (create_repo, upload_folder, create_commit).
- ``fault_proxy``: a factory for reverse proxies that inject faults (fail, drop, truncate, ...).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import pytest

from launcher.local.nodes import free_port  # below the ephemeral range: safe beside xdist's other workers

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # clients that hang up are expected here
        pass


def _serve(handler: type, owner, **attrs) -> _Server:
    server = _Server(("127.0.0.1", 0), handler)
    server.owner = owner
    for name, value in attrs.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status: int, headers: dict, body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, str(value))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))


# --------------------------------------------------------------------------------------- S3 (moto)
class S3Server:
    """A moto_server process. ``auth=True`` enforces IAM auth (SigV4 + policies) after creating a user.
    ``certs``: (ca.crt, server.crt, server.key) to serve https with a certificate that CA signed."""

    def __init__(self, auth: bool = False, certs: tuple[Path, Path, Path] | None = None):
        exe = Path(sys.executable).with_name("moto_server")
        found = str(exe) if exe.exists() else shutil.which("moto_server")
        argv = [found] if found else [sys.executable, "-m", "moto.server"]
        self.port = free_port()
        self.ca = certs[0] if certs else None
        self.endpoint = f"{'https' if certs else 'http'}://127.0.0.1:{self.port}"
        if certs:
            argv += ["--ssl-cert", str(certs[1]), "--ssl-key", str(certs[2])]
        self.access_key_id, self.secret_access_key, self.role_arn = "test", "test", None
        self._clients: dict[tuple, object] = {}
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen([*argv, "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
            if auth:
                self._enable_auth()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                self._log.seek(0)
                raise RuntimeError(f"moto_server exited {self.process.returncode}: {self._log.read().decode()}")
            try:
                context = ssl.create_default_context(cafile=self.ca) if self.ca else None
                urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=1, context=context).read()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} within {timeout}s")

    def _enable_auth(self) -> None:
        """Create user ``initializer`` (s3:* and sts:AssumeRole) and role ``initializer-role`` (s3:*),
        then switch enforcement on: from now on only those credentials are accepted."""
        iam = self.client("iam")
        allow = lambda *actions: json.dumps({"Version": "2012-10-17", "Statement": [  # noqa: E731
            {"Effect": "Allow", "Action": list(actions), "Resource": "*"}]})
        user = iam.create_user(UserName="initializer")["User"]
        iam.put_user_policy(UserName="initializer", PolicyName="s3", PolicyDocument=allow("s3:*", "sts:AssumeRole"))
        key = iam.create_access_key(UserName="initializer")["AccessKey"]
        trust = json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": user["Arn"]}, "Action": "sts:AssumeRole"}]})
        role = iam.create_role(RoleName="initializer-role", AssumeRolePolicyDocument=trust)["Role"]
        iam.put_role_policy(RoleName="initializer-role", PolicyName="s3", PolicyDocument=allow("s3:*"))
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})  # a form body would be eaten
        urllib.request.urlopen(request, timeout=10).read()
        self.access_key_id, self.secret_access_key = key["AccessKeyId"], key["SecretAccessKey"]
        self.role_arn = role["Arn"]

    def client(self, service: str = "s3", endpoint: str | None = None, access_key_id: str | None = None,
               secret_access_key: str | None = None, session_token: str | None = None, **config):
        """A boto3 client of this server, made once for each set of arguments and credentials:
        each new client parses botocore's models again (0.05 s), which was most of the time of
        the S3 listing property (three puts a case)."""
        key = (service, endpoint or self.endpoint, access_key_id or self.access_key_id,
               secret_access_key or self.secret_access_key, session_token, repr(sorted(config.items())))
        if key not in self._clients:
            self._clients[key] = self._new_client(*key[:5], **config)
        return self._clients[key]

    def _new_client(self, service: str, endpoint: str, access_key_id: str, secret_access_key: str,
                    session_token: str | None, **config):
        import boto3
        from botocore.config import Config
        return boto3.client(
            service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key, aws_session_token=session_token,
            config=Config(s3={"addressing_style": "path"}, **config), verify=str(self.ca) if self.ca else None)

    def make_bucket(self, name: str) -> str:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def put(self, bucket: str, key: str, data: bytes) -> str:
        return self.client().put_object(Bucket=bucket, Key=key, Body=data)["ETag"]

    def put_multipart(self, bucket: str, key: str, data: bytes, part_size: int = 5 * 1024 * 1024) -> str:
        """Real multipart upload; returns the ETag, '"<md5 of the parts' md5s>-<parts>"'."""
        client = self.client()
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, max(len(data), 1), part_size), 1):
            etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                      Body=data[start:start + part_size])["ETag"]
            parts.append({"ETag": etag, "PartNumber": number})
        return client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                                MultipartUpload={"Parts": parts})["ETag"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def multipart_etag(data: bytes, part_size: int = 5 * 1024 * 1024) -> str:
    md5s = [hashlib.md5(data[i:i + part_size]).digest() for i in range(0, max(len(data), 1), part_size)]
    return f'"{hashlib.md5(b"".join(md5s)).hexdigest()}-{len(md5s)}"'


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server_auth():
    server = S3Server(auth=True)
    yield server
    server.stop()


# --------------------------------------------------------------------------------------- Hugging Face Hub
def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    data: bytes
    lfs: bool

    def __post_init__(self):
        self.size = len(self.data)
        self.sha256 = hashlib.sha256(self.data).hexdigest() if self.lfs else None
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
        self.pointer_size = len(pointer) if self.lfs else None
        self.oid = _git_oid(pointer.encode() if self.lfs else self.data)  # git stores the pointer for LFS
        self.etag = f'"{self.sha256 or self.oid}"'


@dataclass
class HubRepo:
    repo_type: str
    repo_id: str
    gated = private = redirect_lfs = False
    head: str = ""  # sha of the commit "main" resolves to
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)  # sha -> {path: file}
    lfs_oids: set[str] = field(default_factory=set)  # sha256s in this repo's LFS store (the Hub's is per repo)


@dataclass
class HubCommit:
    """One commit made through the API (``POST .../commit/main``), as ``HubServer.commits_made`` records it."""
    repo_type: str
    repo_id: str
    revision: str
    oid: str  # the new head
    parent: str
    summary: str
    added: list[str]  # paths written (regular or LFS), in request order
    deleted: list[str]  # file paths removed (a deleted folder: each file under it)


_TYPES = {"models": "model", "datasets": "dataset"}
_PREFIX = {"model": "", "dataset": "datasets/"}  # URL prefix of a repo type
_REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
_TREE = re.compile(rf"^/api/(?P<t>models|datasets)/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_INFO = re.compile(rf"^/api/(?P<t>models|datasets)/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(rf"^/(?:(?P<t>datasets)/)?{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/_cdn/(?P<sha>[0-9a-f]{64})$")
_PREUPLOAD = re.compile(rf"^/api/(?P<t>models|datasets)/{_REPO}/preupload/(?P<rev>[^/]+)$")
_COMMIT = re.compile(rf"^/api/(?P<t>models|datasets)/{_REPO}/commit/(?P<rev>[^/]+)$")
_LFS = re.compile(rf"^/(?:(?P<t>datasets)/)?{_REPO}\.git/info/lfs/objects/(?P<op>batch|verify)$")
_UPLOAD = re.compile(rf"^/_lfs/(?P<t>models|datasets)/{_REPO}/(?P<oid>[0-9a-f]{{64}})$")  # a "presigned" PUT
LFS_JSON = "application/vnd.git-lfs+json"


class _HubHandler(_Handler):
    def do_GET(self):
        hub: HubServer = self.server.owner
        url = urlsplit(self.path)
        self.note(hub)
        if self.server.cdn:
            match = _CDN.match(url.path)
            blob = match and hub.blobs.get(match["sha"])
            return self.send_blob(blob, {"ETag": f'"{blob.sha256}"'}) if blob else self.error(404, None, "no blob")
        auth = self.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {hub.token}":
            return self.error(401, None, "Invalid credentials in Authorization header")
        for regex, route in ((_TREE, self.tree), (_INFO, self.info), (_RESOLVE, self.resolve)):
            match = regex.match(url.path)
            if match:
                repo_type = _TYPES.get(match["t"] or "models")
                found = self.lookup(repo_type, unquote(match["repo"]), unquote(match["rev"] or "main"), auth)
                return found and route(*found, match, parse_qs(url.query), auth)
        self.error(404, None, f"no route for {url.path}")

    do_HEAD = do_GET

    def do_POST(self):
        hub: HubServer = self.server.owner
        body = self.read_body()  # always, so that the connection stays usable after an early answer
        url = urlsplit(self.path)
        self.note(hub)
        if self.server.cdn:
            return self.error(405, None, "the CDN is read-only")
        status = hub._injected(url.path)
        if status:
            return self.error(status, None, f"injected {status}")
        try:
            if self.command == "PUT":
                match = _UPLOAD.match(url.path)
                return self.upload(match, parse_qs(url.query), body) if match else self.error(404, None, "no route")
            if self.headers.get("Authorization") != f"Bearer {hub.token}":  # writes always need the token
                given = self.headers.get("Authorization") is not None
                return self.error(401, None, "Invalid credentials in Authorization header" if given
                                  else "You must be authenticated to write to the Hub")
            if url.path == "/api/repos/create":
                return self.create_repo(json.loads(body))
            for regex, route in ((_PREUPLOAD, self.preupload), (_COMMIT, self.commit), (_LFS, self.lfs)):
                match = regex.match(url.path)
                if match:
                    repo = hub.repos.get((_TYPES[match["t"] or "models"], unquote(match["repo"])))
                    if repo is None:
                        return self.error(404, "RepoNotFound", f"Repository Not Found for {unquote(match['repo'])}")
                    return route(repo, match, parse_qs(url.query), body)
            self.error(404, None, f"no route for {self.command} {url.path}")
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # a malformed body: say so, do not hang up
            self.error(400, None, f"Bad request: {err!r}")

    do_PUT = do_POST

    def note(self, hub: HubServer) -> None:
        hub.requests.append((self.command, self.path, self.headers.get("Range")))
        hub.log.append({"method": self.command, "path": self.path, "cdn": self.server.cdn,
                        "headers": self.headers})  # an http.client.HTTPMessage: names case-insensitive

    def error(self, status: int, code: str | None, message: str, extra: dict | None = None, **headers) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **headers}
        if code:
            headers["X-Error-Code"] = code
        self.send(status, headers, json.dumps({"error": message, **(extra or {})}).encode())

    def send_json(self, status: int, body, content_type: str = "application/json") -> None:
        self.send(status, {"Content-Type": content_type}, json.dumps(body).encode())

    def base(self) -> str:
        return f"http://{self.headers['Host']}"  # the address the client used (a proxy keeps Host)

    # ---- writes (huggingface_hub's create_repo / create_commit / upload_folder, HTTP LFS path, Xet off)
    def create_repo(self, payload: dict) -> None:
        hub: HubServer = self.server.owner
        repo_type = payload.get("type") or "model"
        if repo_type not in _PREFIX:
            return self.error(400, None, f"Invalid repo type: {repo_type} (this stand-in has models and datasets)")
        repo_id = f"{payload.get('organization') or hub.user}/{payload['name']}"
        url = f"{self.base()}/{_PREFIX[repo_type]}{repo_id}"
        with hub._lock:
            if (repo_type, repo_id) in hub.repos:  # create_repo(exist_ok=True) accepts a 409; it reads "url"
                return self.error(409, None, f"You already created this {repo_type} repo", {"url": url})
            private = payload.get("visibility") == "private" or payload.get("private") is True
            hub.add_repo(repo_id, {}, repo_type, private=private)  # an empty first commit: later ones have a parent
        self.send_json(200, {"url": url, "name": repo_id, "id": hashlib.sha1(url.encode()).hexdigest()[:24]})

    def preupload(self, repo: HubRepo, match, query, body: bytes) -> None:
        found = self.lookup(repo.repo_type, repo.repo_id, unquote(match["rev"]), self.headers["Authorization"])
        if found:
            threshold, files = self.server.owner.lfs_threshold, found[2]
            answer = []
            for f in json.loads(body)["files"]:
                entry = {"path": f["path"], "uploadMode": "lfs" if f["size"] >= threshold else "regular",
                         "shouldIgnore": False}
                if f["path"] in files:  # lets the client drop unchanged files (sha256 for LFS, git sha1 otherwise)
                    entry["oid"] = files[f["path"]].sha256 or files[f["path"]].oid
                answer.append(entry)
            self.send_json(200, {"files": answer, "commitOid": found[1]})

    def lfs(self, repo: HubRepo, match, query, body: bytes) -> None:
        hub: HubServer = self.server.owner
        payload = json.loads(body)
        if match["op"] == "verify":
            blob = hub.blobs.get(payload["oid"]) if payload["oid"] in repo.lfs_oids else None
            if blob is None or blob.size != payload["size"]:
                return self.error(404, None, f"Object {payload['oid']} not found")
            return self.send_json(200, {"success": True}, LFS_JSON)
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            return self.error(400, None, "this stand-in only does basic LFS uploads")
        objects = []
        for obj in payload["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not re.fullmatch(r"[0-9a-f]{64}", obj["oid"]):
                entry["error"] = {"code": 422, "message": "Invalid oid"}
            elif obj["oid"] not in repo.lfs_oids:  # stored already: no actions, the client sends nothing
                lfs_url = f"{self.base()}/{_PREFIX[repo.repo_type]}{repo.repo_id}.git/info/lfs/objects"
                entry["actions"] = {"upload": {"href": self.upload_url(repo, obj["oid"]), "expires_in": 3600},
                                    "verify": {"href": f"{lfs_url}/verify"}}
            objects.append(entry)
        self.send_json(200, {"transfer": "basic", "objects": objects}, LFS_JSON)

    def upload_url(self, repo: HubRepo, oid: str) -> str:
        path = f"/_lfs/{repo.repo_type}s/{repo.repo_id}/{oid}"
        return f"{self.base()}{path}?{urlencode({'sig': self.server.owner._sign(path)})}"

    def upload(self, match, query, body: bytes) -> None:
        """The storage behind a batch "upload" href: no Authorization (huggingface_hub sends none), a signature."""
        hub: HubServer = self.server.owner
        path = urlsplit(self.path).path
        if not hmac.compare_digest(query.get("sig", [""])[0], hub._sign(path)):
            return self.error(403, "SignatureDoesNotMatch", "The request signature does not match")
        if hashlib.sha256(body).hexdigest() != match["oid"]:
            return self.error(400, "BadDigest", "The content's sha256 does not match the oid it was sent to")
        repo = hub.repos.get((_TYPES[match["t"]], unquote(match["repo"])))
        if repo is None:
            return self.error(404, "NoSuchBucket", "No such repo")
        with hub._lock:
            hub.blobs.setdefault(match["oid"], HubFile(body, True))
            repo.lfs_oids.add(match["oid"])
        self.send(200, {"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    def commit(self, repo: HubRepo, match, query, body: bytes) -> None:
        hub: HubServer = self.server.owner
        revision = unquote(match["rev"])
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0]["key"] != "header":
            return self.error(400, None, "The first line must be the commit header")
        if revision != "main":  # only main is modelled; the Hub refuses a commit to a non-branch revision too
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if query.get("create_pr"):
            return self.error(400, None, "create_pr is not supported by this stand-in")
        header = lines[0]["value"]
        with hub._lock:  # check-and-commit is atomic: concurrent writers see 412 as on the Hub
            parent = repo.head
            wanted = (header.get("parentCommit") or "").lower()
            if wanted and not parent.startswith(wanted):
                return self.error(412, None, "A commit has happened since. Please refresh and try again.")
            files, added, deleted = dict(repo.commits[parent]), [], []
            for op in lines[1:]:
                key, value = op["key"], op["value"]
                path = value["path"].strip("/")
                if key == "file":
                    content = value["content"]
                    data = base64.b64decode(content) if value.get("encoding") == "base64" else content.encode()
                    files[path] = HubFile(data, False)
                elif key == "lfsFile":
                    blob = hub.blobs.get(value["oid"]) if value["oid"] in repo.lfs_oids else None
                    if blob is None or value.get("size", blob.size) != blob.size:  # the Hub rejects a dangling pointer
                        return self.error(400, None, "Your push was rejected because an LFS pointer pointed to a "
                                          f"file that does not exist. Offending file: {path}")
                    files[path] = blob
                elif key in ("deletedFile", "deletedFolder"):
                    gone = [p for p in files if (p == path if key == "deletedFile" else p.startswith(f"{path}/"))]
                    if not gone:
                        return self.error(404, "EntryNotFound", f"A file with this name doesn't exist: {path}")
                    for p in gone:
                        del files[p]
                    deleted += gone
                    continue
                else:
                    return self.error(400, None, f"Unknown commit operation: {key}")
                added.append(path)
            sha = hub._new_commit(repo, files)
            hub.commits_made.append(HubCommit(repo.repo_type, repo.repo_id, revision, sha, parent,
                                              header.get("summary", ""), added, deleted))
        url = f"{self.base()}/{_PREFIX[repo.repo_type]}{repo.repo_id}/commit/{sha}"
        self.send_json(200, {"success": True, "commitOid": sha, "commitUrl": url, "hookOutput": ""})

    def lookup(self, repo_type: str, repo_id: str, rev: str, auth):
        repo = self.server.owner.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and auth is None):
            return self.error(401 if repo else 404, "RepoNotFound", f"Repository Not Found for {repo_id}")
        sha = repo.head if rev == "main" else rev
        if sha not in repo.commits:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return repo, sha, repo.commits[sha]

    def info(self, repo, sha, files, match, query, auth):
        siblings = [{"rfilename": p, "size": f.size, "blobId": f.oid,
                     **({"lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}} if f.lfs else {})}
                    for p, f in sorted(files.items())]
        body = {"_id": sha[:24], "id": repo.repo_id, "sha": sha, "private": repo.private,
                "gated": "manual" if repo.gated else False, "disabled": False, "downloads": 0, "likes": 0,
                "lastModified": "2024-01-01T00:00:00.000Z", "tags": [], "siblings": siblings}
        self.send(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

    def tree(self, repo, sha, files, match, query, auth):
        prefix = unquote(match["path"] or "").strip("/")
        dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
        if prefix and prefix not in dirs:
            return self.error(404, "EntryNotFound", f"{prefix} does not exist", **{"X-Repo-Commit": sha})
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        base = f"{prefix}/" if prefix else ""
        items = []
        for path in sorted(dirs | set(files)):
            if path.startswith(base) and (recursive or "/" not in path[len(base):]):
                f = files.get(path)
                items.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                              "path": path} if f is None else
                             {"type": "file", "oid": f.oid, "size": f.size, "path": path, **(
                                 {"lfs": {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}}
                                 if f.lfs else {})})
        cursor, size = int(query.get("cursor", ["0"])[0]), self.server.owner.tree_page_size
        headers = {"Content-Type": "application/json"}
        if cursor + size < len(items):
            params = {k: v[0] for k, v in query.items()} | {"cursor": cursor + size}
            next_url = f"http://{self.headers['Host']}{urlsplit(self.path).path}?{urlencode(params)}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self.send(200, headers, json.dumps(items[cursor:cursor + size]).encode())

    def resolve(self, repo, sha, files, match, query, auth):
        if repo.gated and auth is None:
            return self.error(401, "GatedRepo", f"Access to {repo.repo_type} {repo.repo_id} is restricted. "
                              "You must have access to it and be authenticated to access it. Please log in.")
        f = files.get(unquote(match["path"]))
        if f is None:
            return self.error(404, "EntryNotFound", "Entry not found", **{"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f.etag}
        if f.lfs:
            headers.update({"X-Linked-Etag": f.etag, "X-Linked-Size": f.size})
            if repo.redirect_lfs:
                location = f"{self.server.owner.cdn_endpoint}/_cdn/{f.sha256}"
                return self.send(302, {**headers, "Location": location})
        self.send_blob(f, headers)

    def send_blob(self, f: HubFile, headers: dict) -> None:
        data, status = f.data, 200
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", **headers}
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", (self.headers.get("Range") or "").strip())
        if match and (match[1] or match[2]):
            start = int(match[1]) if match[1] else max(0, f.size - int(match[2]))
            end = min(int(match[2]), f.size - 1) if match[1] and match[2] else f.size - 1
            if start >= f.size or start > end:
                return self.send(416, {**headers, "Content-Range": f"bytes */{f.size}"})
            data, status = data[start:end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        self.send(status, headers, data)


class HubServer:
    """In-memory Hub: ``add_repo`` then point HF_ENDPOINT (or ``endpoint=``) at ``.endpoint``.

    ``requests``: (method, raw path with query, Range header or None) per request, CDN ones included.
    ``log``: dicts {method, path, cdn: bool, headers} for the same requests; ``headers`` is the request's
    http.client.HTTPMessage, so ``"Authorization" in entry["headers"]`` ignores case (httpx sends lower case).

    Uploads (huggingface_hub's HTTP path: Xet off, see ``env()``; in-process patch
    ``huggingface_hub.constants.HF_HUB_DISABLE_XET``, read at import): create_repo, preupload, the LFS batch
    API (basic transfer) with a signed PUT and a verify, and NDJSON commits to ``main``. Writes need
    ``Bearer <token>``. ``lfs_threshold``: preupload answers "lfs" from this size up (10 MiB, as the Hub).
    ``commits_made``: a ``HubCommit`` per API commit. ``fail_next(glob, status)``: fail writes on purpose;
    mind that huggingface_hub retries 5xx (with 1 s, 2 s, ... sleeps) on all write routes but the commit.
    """

    def __init__(self):
        self.token = "hf_test_" + secrets.token_hex(12)
        self.user = "tester"  # the token's namespace: create_repo of a bare name lands here
        self.repos: dict[tuple[str, str], HubRepo] = {}
        self.blobs: dict[str, HubFile] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.log: list[dict] = []
        self.tree_page_size = 1000
        self.lfs_threshold = 10 * 1024 * 1024
        self.commits_made: list[HubCommit] = []
        self.failures: list[Fault] = []
        self._secret = secrets.token_bytes(16)
        self._lock = threading.Lock()
        self._server = _serve(_HubHandler, self, cdn=False)
        self._cdn = _serve(_HubHandler, self, cdn=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.cdn_endpoint = f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = "model", gated: bool = False,
                 lfs_paths=frozenset(), *, private: bool = False, redirect_lfs: bool = False) -> str:
        """Add a commit (the repo's new head; older commits stay resolvable by sha); returns its sha.

        gated: file downloads (resolve) need the token (401 GatedRepo); info and tree stay public, as on the Hub.
        private: everything needs the token (401 RepoNotFound). redirect_lfs: LFS resolves answer 302 to a
        second origin (``cdn_endpoint``), like the Hub's CDN: huggingface_hub then drops Authorization."""
        assert repo_type in ("model", "dataset"), repo_type
        repo = self.repos.setdefault((repo_type, repo_id), HubRepo(repo_type, repo_id))
        repo.gated, repo.private, repo.redirect_lfs = gated, private, redirect_lfs
        snapshot = {path: HubFile(bytes(data), path in lfs_paths) for path, data in files.items()}
        return self._new_commit(repo, snapshot)

    def _new_commit(self, repo: HubRepo, snapshot: dict[str, HubFile]) -> str:
        digest = hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}/{len(repo.commits)}".encode())
        for path, f in sorted(snapshot.items()):
            digest.update(f"{path}\0{f.oid}\0".encode())
            if f.lfs:
                self.blobs[f.sha256] = f
                repo.lfs_oids.add(f.sha256)
        sha = digest.hexdigest()
        repo.commits[sha], repo.head = snapshot, sha
        return sha

    def fail_next(self, path_glob: str, status: int = 500, times: int = 1) -> Fault:
        """Answer ``status`` to the next ``times`` writes (POST/PUT) whose path (no query) matches ``path_glob``
        (fnmatch, '*' crosses '/'), before any handling. E.g. "/api/models/org/x/commit/*", "*/preupload/*",
        "*.git/info/lfs/objects/batch", "/_lfs/*" (the PUT of LFS bytes). ``.fired`` counts the answers."""
        fault = Fault(path_glob, "fail", {"status": status}, times, None)
        with self._lock:
            self.failures.append(fault)
        return fault

    def _injected(self, path: str) -> int | None:
        with self._lock:
            for fault in self.failures:
                if fault.fired < fault.times and fnmatch.fnmatchcase(path, fault.path_glob):
                    fault.fired += 1
                    return fault.params["status"]
        return None

    def _sign(self, path: str) -> str:
        return hmac.new(self._secret, path.encode(), hashlib.sha256).hexdigest()[:32]

    def env(self, hf_home, endpoint: str | None = None) -> dict[str, str]:
        """Environment for a subprocess that uses huggingface_hub against this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
        return env | {"HF_ENDPOINT": endpoint or self.endpoint, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_XET": "1",
                      "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "0"}

    def body_gets(self) -> list[str]:
        """Paths of file-body transfers (GET on resolve or CDN) seen so far."""
        return [p for m, p, _ in self.requests if m == "GET" and ("/resolve/" in p or p.startswith("/_cdn/"))]

    def stop(self) -> None:
        for server in (self._server, self._cdn):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="session")
def hub_server():
    server = HubServer()
    yield server
    server.stop()


# --------------------------------------------------------------------------------------- fault proxy
@dataclass
class Fault:
    path_glob: str
    kind: str  # fail | stall | drop_after | truncate | corrupt | slow | capped
    params: dict
    times: int | None  # None: forever
    method: str | None
    fired: int = 0
    next_slot: float = 0.0  # capped: when the next slice of any body it throttles may go


BODY_FAULTS = {"drop_after", "truncate", "corrupt", "slow", "capped"}


class _ProxyHandler(_Handler):
    def do_GET(self):
        proxy: FaultProxy = self.server.owner
        body = self.read_body()
        proxy.requests.append((self.command, self.path, self.headers.get("Range")))
        proxy.agents.append((self.command, self.path, self.headers.get("User-Agent", "")))
        path = urlsplit(self.path).path
        fault = proxy.take(self.command, path, {"fail", "stall"})
        if fault and fault.kind == "fail":
            status = fault.params.get("status", 503)
            return self.send(status, {"Content-Type": "text/plain"}, f"injected {status}".encode())
        if fault and fault.kind == "stall":
            time.sleep(fault.params.get("seconds", 30))
        upstream = HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=120)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():  # Host included, unchanged: SigV4 signatures stay valid
                if name.lower() not in HOP_BY_HOP | {"content-length", "expect"}:
                    upstream.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            has_body = self.command != "HEAD" and response.status not in (204, 304)
            data = response.read() if has_body else b""
        finally:
            upstream.close()
        fault = proxy.take(self.command, path, BODY_FAULTS) if response.status in (200, 206) and data else None
        self.send_response_only(response.status, response.reason)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        if has_body or response.getheader("Content-Length"):
            self.send_header("Content-Length", response.getheader("Content-Length") if not has_body else len(data))
        self.end_headers()
        self.send_body(data, fault)

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_GET

    def send_body(self, data: bytes, fault: Fault | None) -> None:
        kind, params = (fault.kind, fault.params) if fault else (None, {})
        if kind == "corrupt":
            offset = min(params.get("offset", len(data) // 2), len(data) - 1)
            data = data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1:]
        if kind in ("drop_after", "truncate"):
            data = data[:params["n_bytes"]]
        rate = params.get("bytes_per_second") if kind in ("slow", "capped") else None
        step = max(1, rate // 20) if rate else len(data) or 1
        for start in range(0, len(data), step):
            self.wfile.write(data[start:start + step])
            if kind == "slow":
                time.sleep(step / rate)
            elif kind == "capped":  # every body this fault throttles shares the one rate
                with self.server.owner._lock:
                    now = time.monotonic()
                    fault.next_slot = max(now, fault.next_slot) + step / rate
                    wait = fault.next_slot - now
                time.sleep(wait)
        if kind == "drop_after":  # abortive close: the client sees a connection reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        if kind in ("drop_after", "truncate"):  # truncate: orderly close (FIN) short of Content-Length
            self.close_connection = True


class FaultProxy:
    """Reverse proxy to ``upstream`` ("host:port" or "http://host:port") that can inject faults.

    ``inject(path_glob, kind, times=1, method=None, **params)``, path_glob an fnmatch pattern on the path
    (no query; '*' crosses '/'); times=None: every matching request. Kinds and params:
      fail(status=503)          answer ``status`` without asking upstream
      stall(seconds=30)         wait, then pass the request on
      drop_after(n_bytes)       send the headers and n_bytes of body, then reset the connection (RST)
      truncate(n_bytes)         the same, but close in order (FIN): the body ends short of Content-Length
      corrupt(offset=len//2)    flip one byte of the body (same length)
      slow(bytes_per_second)    throttle the body: each body at this rate
      capped(bytes_per_second)  throttle the bodies together: all that this fault matches share the rate
    fail/stall count a match on any request; body faults only on a 200/206 answer with a body (HEADs or
    errors do not use them up). The first fault that matches and has times left is used.
    ``requests``: (method, raw path, Range header) seen, like the hub's.
    """

    def __init__(self, upstream: str):
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream_host, self.upstream_port = host, int(port or 80)
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.agents: list[tuple[str, str, str]] = []  # (method, raw path, User-Agent): which client asked
        self._lock = threading.Lock()
        self._server = _serve(_ProxyHandler, self)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def inject(self, path_glob: str, kind: str, times: int | None = 1, method: str | None = None, **params) -> Fault:
        assert kind in BODY_FAULTS | {"fail", "stall"}, kind
        assert kind not in ("drop_after", "truncate") or "n_bytes" in params, "needs n_bytes="
        assert kind not in ("slow", "capped") or params.get("bytes_per_second", 0) > 0, "needs bytes_per_second="
        fault = Fault(path_glob, kind, params, times, method)
        with self._lock:
            self.faults.append(fault)
        return fault

    def take(self, method: str, path: str, kinds: set[str]) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.kind in kinds and (fault.times is None or fault.fired < fault.times)
                        and fault.method in (None, method) and fnmatch.fnmatchcase(path, fault.path_glob)):
                    fault.fired += 1
                    return fault
        return None

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def fault_proxy():
    """Factory: ``proxy = fault_proxy(upstream_endpoint)``; every proxy made is stopped after the test."""
    proxies: list[FaultProxy] = []

    def make(upstream: str) -> FaultProxy:
        proxies.append(FaultProxy(upstream))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.stop()
