"""Storage behind TLS with a private CA, as MinIO or Ceph often is inside a cluster: a real moto
serving https with a certificate a test CA signed, and a small https file server with another.
With the CA named (AWS_CA_BUNDLE for s3://, SSL_CERT_FILE for https://) every file arrives
verified, both ways; without it the pod fails at once, in one line that names the variable to
set, with the permanent code: no retry meets another certificate."""

from __future__ import annotations

import json
import os
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from status_fixtures import make_certs
from storage_servers import S3Server
from test_export import MANIFEST, export, objects, tree_of, write_tree
from test_export import s3_env as s3_credentials
from test_init_storage import files_under, init, termination

DATA = {"corpus/small.txt": b"hello over tls\n", "corpus/sub/b.bin": os.urandom(70_000)}
LARGE = os.urandom(6 * 1024 * 1024 + 123)  # a multipart object: its body comes in ranges


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_s3(certs):
    server = S3Server(certs=certs)
    bucket = server.make_bucket("private-ca")
    for key, data in DATA.items():
        server.put(bucket, key, data)
    server.put_multipart(bucket, "corpus/large.bin", LARGE)
    yield server
    server.stop()


def s3_env(server, **extra) -> dict[str, str]:
    return {**s3_credentials(server), **extra}


def refused_in_one_line(stderr: str, variable: str) -> None:
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "TLS certificate was refused" in errors[0] and f"{variable} names the CA bundle" in errors[0], errors[0]


def test_s3_with_the_ca_named_downloads_every_file_verified(tls_s3, certs, tmp_path):
    out = tmp_path / "out"
    result = init("dataset", s3_env(tls_s3, STORAGE_URI="s3://private-ca/corpus", AWS_CA_BUNDLE=str(certs[0])), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {"small.txt": DATA["corpus/small.txt"], "sub/b.bin": DATA["corpus/sub/b.bin"],
                                "large.bin": LARGE}


def test_s3_with_the_ca_named_exports_every_file_verified_in_parts_and_whole(tls_s3, certs, tmp_path):
    output = tmp_path / "output"
    # Over TLS the bodies go unsigned; a file over the 16 MiB part floor goes up in parts.
    write_tree(output, {"model.bin": os.urandom(17 * 1024 * 1024), "config.json": b"{}"})
    result = export(tmp_path, "s3://private-ca/run", output, env=s3_env(tls_s3, AWS_CA_BUNDLE=str(certs[0])))
    assert result.returncode == 0, result.stderr
    stored = objects(tls_s3, "private-ca", "run/")
    manifest = json.loads(stored.pop(MANIFEST))
    assert stored == tree_of(output)
    assert {f["path"]: f["s3-etag"] for f in manifest["files"]}["model.bin"].endswith("-2")


def test_s3_without_the_ca_is_refused_at_once_in_one_line_naming_aws_ca_bundle(tls_s3, tmp_path):
    out = tmp_path / "out"
    result = init("dataset", s3_env(tls_s3, STORAGE_URI="s3://private-ca/corpus"), out)
    assert result.returncode == 2, result.stderr
    refused_in_one_line(result.stderr, "AWS_CA_BUNDLE")
    assert termination(out)["reason"] == "ConfigError"
    assert not out.exists() or not files_under(out)


def test_an_export_without_the_ca_is_rejected_and_the_output_stays(tls_s3, tmp_path):
    output = tmp_path / "output"
    write_tree(output, {"model.bin": b"weights"})
    result = export(tmp_path, "s3://private-ca/refused", output, env=s3_env(tls_s3))
    assert result.returncode == 2, result.stderr
    refused_in_one_line(result.stderr, "AWS_CA_BUNDLE")
    assert "ExportRejected" in result.stderr and tree_of(output) == {"model.bin": b"weights"}
    assert objects(tls_s3, "private-ca", "refused/") == {}


def test_the_native_body_client_sorts_a_refused_certificate_as_permanent(tls_s3):
    """The bodies' client (obstore) meets the certificate on its own connections: its error, from
    a real handshake with the server above, is the same one line."""
    import obstore
    from obstore.store import S3Store

    from launcher.initializers.errors import PermanentError
    from launcher.initializers.s3 import obstore_error

    store = S3Store("private-ca", endpoint=tls_s3.endpoint, region="us-east-1", virtual_hosted_style_request=False,
                    access_key_id="test", secret_access_key="test", retry_config={"max_retries": 0})
    with pytest.raises(Exception) as raised:
        obstore.get(store, "corpus/small.txt").bytes()
    sorted_as = obstore_error(raised.value, "get corpus/small.txt")
    assert isinstance(sorted_as, PermanentError), sorted_as
    assert "TLS certificate was refused (UnknownIssuer); AWS_CA_BUNDLE names the CA bundle" in str(sorted_as)


# ------------------------------------------------------------------------------------------ https://
BODY = os.urandom(200_000)


class _File(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()

    def do_GET(self):
        self.do_HEAD()
        self.wfile.write(BODY)


@pytest.fixture
def https_file(certs):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _File)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs[1], certs[2])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}/weights.bin"
    server.shutdown()
    server.server_close()


def test_https_with_ssl_cert_file_downloads_and_without_it_is_refused_at_once(https_file, certs, tmp_path):
    trusted = init("dataset", {"STORAGE_URI": https_file, "SSL_CERT_FILE": str(certs[0])}, tmp_path / "ok")
    assert trusted.returncode == 0, trusted.stderr
    assert files_under(tmp_path / "ok") == {"weights.bin": BODY}, trusted.stderr
    refused = init("dataset", {"STORAGE_URI": https_file}, tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr
    refused_in_one_line(refused.stderr, "SSL_CERT_FILE")
