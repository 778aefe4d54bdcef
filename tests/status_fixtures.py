"""The ``status_server`` fixture: a real HTTPS Trainer status server stand-in (tests/status_server.py)
in its own process, with a CA and server certificate made for the test session and a token laid
out as the kubelet projects it (``token -> ..data/token``, ``..data`` swapped atomically on rotation).

    def test_it(status_server):
        env = status_server.env()                 # KUBEFLOW_TRAINER_SERVER_{URL,CA_CERT,TOKEN}
        ...                                       # run something with env
        records = status_server.wait_for(lambda rs: any(r["code"] == 200 for r in rs), timeout=30)

``received()`` is every answered request so far (dicts, see tests/status_server.py for the keys);
``accepted()`` only those answered 200. ``wait_for(predicate, timeout)`` polls the record file until
``predicate(received())`` is true and returns that list (an AssertionError with the records on
timeout). ``rotate_token()`` swaps in a new token (returned); the old one gets 403 from then on.
``fail_next(code, count)`` forces the next answers (code 0: drop the connection), ``slow(seconds)``
delays every answer until ``slow(0)``. ``kill()`` / ``start()`` stop and restart the server on the
same port. ``token`` is the current token, for asserting it never shows up in logs.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = Path(__file__).with_name("status_server.py")
NAMESPACE, NAME = "team-a", "my-job"
STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{}/trainjobs/{}/status"


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for localhost and 127.0.0.1: (ca.crt, server.crt, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "status-server-test-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                          x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
              .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class ProjectedVolume:
    """The kubelet's layout for a projected volume: each file a symlink through ``..data``."""

    def __init__(self, directory: Path, files: dict[str, bytes]):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._generation = itertools.count()
        self._files = dict(files)
        self._publish()
        for name in files:
            os.symlink(f"..data/{name}", directory / name)

    def update(self, name: str, data: bytes) -> None:
        self._files[name] = data
        self._publish()

    def _publish(self) -> None:
        version = self.directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{next(self._generation)}"
        version.mkdir()
        for name, data in self._files.items():
            (version / name).write_bytes(data)
        link = self.directory / "..data"
        old = os.readlink(link) if link.is_symlink() else None
        os.symlink(version.name, self.directory / "..data_tmp")
        os.replace(self.directory / "..data_tmp", link)  # the one atomic step readers can observe
        if old:
            shutil.rmtree(self.directory / old, ignore_errors=True)


class StatusServer:
    def __init__(self, workdir: Path, certs: tuple[Path, Path, Path], namespace: str = NAMESPACE, name: str = NAME):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.namespace, self.name = namespace, name
        self.token = secrets.token_urlsafe(32)
        ca, self._cert, self._key = certs
        self.volume = ProjectedVolume(workdir / "projected", {"token": self.token.encode(), "ca.crt": ca.read_bytes()})
        self.ca_cert = str(self.volume.directory / "ca.crt")
        self.token_path = str(self.volume.directory / "token")
        self.record = workdir / "requests.jsonl"
        self.control = workdir / "control.json"
        self._ready = workdir / "ready.json"
        self._log = workdir / "server.log"
        self._seq = itertools.count(1)
        self.port = 0
        self.process: subprocess.Popen | None = None

    # --- process ---------------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> "StatusServer":
        """Start (or restart, on the same port) and wait until it listens."""
        self._ready.unlink(missing_ok=True)
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER), "--port", str(self.port), "--cert", str(self._cert), "--key", str(self._key),
                 "--token-file", self.token_path, "--record", str(self.record), "--ready", str(self._ready),
                 "--control", str(self.control), "--job", f"{self.namespace}/{self.name}"],
                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while not self._ready.exists():
            if self.process.poll() is not None or time.monotonic() > end:
                self.kill()
                raise RuntimeError(f"status server did not start:\n{self._log.read_text(errors='replace')}")
            time.sleep(0.02)
        self.port = json.loads(self._ready.read_text())["port"]
        return self

    def kill(self) -> None:
        """Gone at once, as a crashed server: connections are refused from now on."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    # --- what a client needs -----------------------------------------------------------------------

    def url_for(self, namespace: str, name: str) -> str:
        return f"https://127.0.0.1:{self.port}" + STATUS_PATH.format(namespace, name)

    @property
    def url(self) -> str:
        return self.url_for(self.namespace, self.name)

    def env(self) -> dict[str, str]:
        return {"KUBEFLOW_TRAINER_SERVER_URL": self.url, "KUBEFLOW_TRAINER_SERVER_CA_CERT": self.ca_cert,
                "KUBEFLOW_TRAINER_SERVER_TOKEN": self.token_path}

    def rotate_token(self) -> str:
        self.token = secrets.token_urlsafe(32)
        self.volume.update("token", self.token.encode())
        return self.token

    # --- steering ------------------------------------------------------------------------------------

    def _control(self, **spec) -> None:
        current = json.loads(self.control.read_text()) if self.control.exists() else {}
        current.update(spec)
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(json.dumps(current))
        os.replace(temporary, self.control)

    def fail_next(self, code: int, count: int = 1, message: str | None = None) -> None:
        """The next ``count`` requests get ``code`` as a Status (0: the connection is dropped)."""
        self._control(seq=next(self._seq), fail=code, count=count, message=message)

    def slow(self, seconds: float) -> None:
        """Every answer waits ``seconds`` (0: back to normal); a request that waits is recorded
        at once as an event "delayed"."""
        self._control(delay=seconds)

    # --- what it saw -----------------------------------------------------------------------------------

    def records(self) -> list[dict]:
        try:
            text = self.record.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def received(self) -> list[dict]:
        return [r for r in self.records() if r["event"] == "request"]

    def accepted(self) -> list[dict]:
        return [r for r in self.received() if r["code"] == 200]

    def wait_for(self, predicate, timeout: float = 30, what: str = "the status server's records",
                 events: bool = False) -> list[dict]:
        """Poll until ``predicate(received())`` (``records()`` with ``events=True``) holds; return that list."""
        end = time.monotonic() + timeout
        while True:
            seen = self.records() if events else self.received()
            if predicate(seen):
                return seen
            if time.monotonic() > end:
                summary = "\n".join(json.dumps({k: r.get(k) for k in ("event", "code", "message", "body")})[:300]
                                    for r in seen[-20:])
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; last records:\n{summary}")
            time.sleep(0.02)


@pytest.fixture(scope="session")
def status_certs(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_certs(tmp_path_factory.mktemp("status-certs"))


@pytest.fixture
def status_server(tmp_path: Path, status_certs):
    server = StatusServer(tmp_path / "status-server", status_certs).start()
    yield server
    server.kill()
