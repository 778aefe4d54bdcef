"""The real Kubeflow SDK (kubeflow 0.5) against our images, as fixtures for tests/test_sdk.py.

- ``podman_service``: `podman system service` on a private socket, over the same storage as the
  image build (tests/containers.py), so the SDK's podman adapter (podman-py) sees the built
  images. Containers created through the API take their limits, runtime and subnet from a
  containers.conf given to the service: this machine refuses podman's default ulimits, and each
  SDK job network gets one known subnet, so the host side of its bridge is known in advance.
- ``gateway``: relays on that bridge address to the local S3 and Hub servers (which listen on
  127.0.0.1): the SDK's containers reach this machine there and nowhere else.
- ``pip_index``: a PEP 503 index with one small wheel, served from a container on the pods'
  network, for the SDK's `pip install` prelude.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

import containers

# One /24 for every network the SDK creates through the service: its bridge's address on this
# machine (the containers' gateway) is then .1. Apart from the image tests' internal subnet.
SDK_SUBNET = "10.89.220"
GATEWAY = f"{SDK_SUBNET}.1"
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def _containers_conf(path: Path, env: dict[str, str]) -> None:
    """containers.RUN_LIMITS, as defaults for containers created through the API."""
    pairs = list(zip(containers.RUN_LIMITS[::2], containers.RUN_LIMITS[1::2]))
    ulimits = [value for flag, value in pairs if flag == "--ulimit"]
    runtime = dict(pairs)["--runtime"]
    quoted = lambda items: ", ".join(f'"{item}"' for item in items)  # noqa: E731
    path.write_text(
        "[containers]\n"
        f"default_ulimits = [{quoted(ulimits)}]\n"
        f"env = [{quoted(f'{k}={v}' for k, v in env.items())}]\n"
        "[engine]\n"
        f'runtime = "{runtime}"\n'
        "[network]\n"
        f'default_subnet_pools = [{{"base" = "{SDK_SUBNET}.0/24", "size" = 24}}]\n'
    )


class PodmanService:
    """`podman system service --time=0` on unix://<directory>/podman.sock."""

    def __init__(self, engine: containers.Engine, directory: Path, env: dict[str, str]):
        self.engine = engine
        self.socket = directory / "podman.sock"
        self.url = f"unix://{self.socket}"
        conf = directory / "containers.conf"
        _containers_conf(conf, env)
        self._log = open(directory / "service.log", "wb")
        self.process = subprocess.Popen(
            ["podman", *engine.storage, "system", "service", "--time=0", self.url],
            env={**os.environ, "CONTAINERS_CONF": str(conf)}, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(directory / "service.log")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, log: Path, timeout: float = 60) -> None:
        import podman

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"podman system service exited {self.process.returncode}: {log.read_text()[-2000:]}")
            if self.socket.exists():
                try:
                    with podman.PodmanClient(base_url=self.url) as client:
                        if client.ping():
                            return
                except Exception:  # not answering yet
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"podman system service did not answer on {self.url} within {timeout}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Relay:
    """Accepts on ``host`` and forwards each connection to 127.0.0.1:``target_port``.

    IP_FREEBIND: the bridge, and so its address, exists only once an SDK job's first container
    starts; the listener is bound before that and receives as soon as it does."""

    def __init__(self, host: str, target_port: int):
        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://{host}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._connect, args=(client, upstream), daemon=True).start()

    def _connect(self, client: socket.socket, upstream: socket.socket) -> None:
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        self._pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # a reset: end the other direction too
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._listener.close()


def _remove_stale(service: PodmanService) -> None:
    """Jobs and networks a killed earlier run left behind: the one subnet must be free."""
    import podman

    with podman.PodmanClient(base_url=service.url) as client:
        for container in client.containers.list(all=True, filters={"label": "trainer.kubeflow.org/trainjob-name"}):
            if container.name.startswith(JOB_PREFIX):
                container.remove(force=True)
        for network in client.networks.list():
            subnets = [s.get("subnet", "") for s in network.attrs.get("subnets") or []]
            if any(s.startswith(f"{SDK_SUBNET}.") for s in subnets):
                network.remove(force=True)


JOB_PREFIX = "tl-sdk-"


@pytest.fixture(scope="session")
def gateway_relays(s3_server, hub_server):
    """The S3 and Hub servers, on the address the SDK's containers reach this machine at."""
    port = lambda endpoint: int(endpoint.rsplit(":", 1)[1])  # noqa: E731
    relays = {"s3": Relay(GATEWAY, port(s3_server.endpoint)), "hub": Relay(GATEWAY, port(hub_server.endpoint))}
    yield relays
    for relay in relays.values():
        relay.stop()


@pytest.fixture(scope="session")
def podman_service(engine, gateway_relays):
    try:
        import podman  # noqa: F401
    except ImportError:
        pytest.skip("needs the podman package (podman-py; the test extra pins it)")
    directory = Path(tempfile.mkdtemp(prefix="tl-sdk-podman-"))
    # The SDK's container backend gives initializers STORAGE_URI, OUTPUT_PATH and the initializer's
    # own fields only: a Hub mirror (HF_ENDPOINT) can reach them only as an engine-wide default.
    service = PodmanService(engine, directory, env={"HF_ENDPOINT": gateway_relays["hub"].endpoint})
    _remove_stale(service)
    yield service
    _remove_stale(service)
    service.stop()


# ------------------------------------------------------------------------------------------ pip index

def make_wheel(directory: Path, name: str, version: str, module: str) -> Path:
    """A pure-Python wheel with one module ``name`` (underscores) holding ``module``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: trainer-launcher-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


PROBE_PACKAGE, PROBE_MARK = "tl_sdk_probe", "installed by the SDK's pip prelude"
INDEX_IP = f"{containers.SUBNET}.9"


@pytest.fixture(scope="session")
def pip_index(engine, net, tmp_path_factory) -> str:
    """http://<ip>:8000/simple on the pods' network, serving PROBE_PACKAGE."""
    root = tmp_path_factory.mktemp("pip-index")
    (root / "files").mkdir()
    wheel = make_wheel(root / "files", PROBE_PACKAGE, "1.0", f"MARK = {PROBE_MARK!r}\n")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    project = root / "simple" / PROBE_PACKAGE.replace("_", "-")
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    root.chmod(0o755)
    name = "tl-sdk-pip-index"
    engine.podman("rm", "-f", name, check=False)
    engine.podman("run", "-d", "--name", name, *containers.RUN_LIMITS, "--network", net, "--ip", INDEX_IP,
                  "-v", f"{root}:/index:ro", containers.BASE, "python3", "-u", "-m", "http.server", "-d", "/index", "8000")
    try:
        end = time.monotonic() + 60
        while "Serving HTTP" not in (logs := engine.podman("logs", name, check=False)).stdout + logs.stderr:
            if time.monotonic() > end:
                raise RuntimeError(f"the pip index did not start: {logs.stdout}{logs.stderr}")
            time.sleep(0.1)
        yield f"http://{INDEX_IP}:8000/simple"
    finally:
        engine.podman("rm", "-f", "-t", "0", name, check=False)
