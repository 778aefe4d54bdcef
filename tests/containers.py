"""Build and run the project's images here, without a Docker engine: buildah builds
Dockerfile.torch and Dockerfile.mpi from a Debian base bootstrapped on this machine (no registry
can be pulled), podman runs them with runc.

What stands in for what a cluster gives a pod:
- the base image: `debootstrap --variant=minbase bookworm` plus python3, in place of the PyTorch
  CUDA image (torch comes from the local CPU wheel instead) and of python:3.12-slim; for the
  Python 3.13 image, a trixie minbase with PyPI's CUDA torch in its own interpreter, the way the
  PyTorch image carries it (torch_base());
- the pod network: an --internal podman bridge (no route out), pods at fixed addresses, their
  DNS names from --add-host, the way the headless service names them;
- the Trainer's Secret and ConfigMap: host directories bind-mounted read-only.

Storage lives in one directory (overlay, or vfs where overlay cannot mount), kept between runs so
layers and the base image are reused.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import subprocess
import warnings
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STATE = "/var/tmp/trainer-launcher-test-containers"
STATE = Path(os.environ.get("TRAINER_LAUNCHER_TEST_CONTAINERS", DEFAULT_STATE))
BASE = "localhost/trainer-launcher-test-base:bookworm"
# Debian 13: Python 3.13. Its torch is PyPI's CUDA build (the local CPU wheel is cp311 only): it
# imports and runs gloo without a GPU. ~3.5 GB of wheels, so the base that carries it is kept and
# reused; only the launcher's layers above it are rebuilt.
TRIXIE_BASE = "localhost/trainer-launcher-test-base:trixie"
TRIXIE_TORCH = "2.15.0"
TRIXIE_TORCH_BASE = f"localhost/trainer-launcher-test-base:trixie-torch-{TRIXIE_TORCH}"
TOOLS = ("buildah", "podman", "runc", "debootstrap")
# The --internal bridge: only these containers, no route off the machine. Networks are global to
# the machine's podman, not per storage directory: another storage directory (two test runs at
# once) gets its own name and subnet.
_STATE_ID = zlib.crc32(str(STATE).encode())
if str(STATE) == DEFAULT_STATE:
    NETWORK, SUBNET = "trainer-launcher-test", "10.89.213"
else:
    NETWORK, SUBNET = f"trainer-launcher-test-{_STATE_ID:08x}", f"10.89.{_STATE_ID % 200 + 10}"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # this machine's registry access (pip in RUN steps)
RUN_LIMITS = ["--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def why_not() -> str | None:
    """Why the image tests cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root: buildah/podman storage and runc (run as root, as .ci/run does)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install podman buildah runc debootstrap; .ci/run does)"
    return None


def torch_wheel_dir() -> str | None:
    """Where pip finds the local torch CPU wheel (any other torch spec pulls a multi-GB CUDA build)."""
    for directory in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split():
        if glob.glob(os.path.join(directory, "torch-*cp311*.whl")):
            return directory
    return None


class Engine:
    """buildah and podman over one storage directory."""

    def __init__(self, driver: str):
        self.driver = driver
        # podman wants a runroot under 50 characters; one per storage directory
        runroot = f"/run/tl-test-{_STATE_ID:08x}-{driver}"
        self.storage = ["--root", str(STATE / driver), "--runroot", runroot, "--storage-driver", driver]

    def podman(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run(["podman", *self.storage, *args], check, timeout)

    def buildah(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return _run(["buildah", *self.storage, *args], True, timeout)

    def has_image(self, name: str) -> bool:
        return self.podman("image", "exists", name, check=False).returncode == 0

    def build(self, dockerfile: str, tag: str, build_args: dict[str, str], volumes: list[str] = (),
              context: Path = REPO, timeout: float = 900,
              labels: dict[str, str] | None = None) -> None:
        argv = ["bud", "--isolation", "chroot", "--network", "host", "--layers", "-f", str(context / dockerfile), "-t", tag]
        for name, value in (labels or {}).items():
            argv += ["--label", f"{name}={value}"]
        if os.path.exists(CA_BUNDLE):
            argv += ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
        for volume in volumes:
            argv += ["--volume", volume]
        for name, value in build_args.items():
            argv += ["--build-arg", f"{name}={value}"]
        self.buildah(*argv, str(context), timeout=timeout)
        # The image this tag named before is now dangling. The store is the machine's, shared by
        # every run: unpruned, each suite run left ~13 GB behind and one filled the disk (564 GB of
        # images, 99% reclaimable). Layers a tagged image still uses are not dangling and stay.
        self.podman("image", "prune", "-f", check=False, timeout=600)

    def run(self, image: str, *args: str, options: list[str] = (), timeout: float = 300,
            check: bool = False) -> subprocess.CompletedProcess:
        """``podman run --rm``. A run past ``timeout`` fails the test with what it printed and its
        processes (their state, CPU time and command line, from ``podman top``), then is removed:
        a stuck run says where it stood."""
        name = f"tl-test-{os.getpid()}-{next(_RUNS)}"
        try:
            return self.podman("run", "--rm", "--name", name, *RUN_LIMITS, *options, image, *args, check=check,
                               timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            top = self.podman("top", name, "pid", "ppid", "state", "etime", "time", "args", check=False, timeout=60)
            self.podman("rm", "-f", "-t", "0", name, check=False, timeout=120)
            printed = [_text(expired.stdout)[-4000:], _text(expired.stderr)[-12000:]]
            raise AssertionError(f"podman run {image} {' '.join(args)} ran past {timeout} s; it printed:\n"
                                 + "\n".join(printed) + f"\nits processes then:\n{top.stdout}{top.stderr}") from None


_RUNS = itertools.count()


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _run(argv: list[str], check: bool, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited {result.returncode}:\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def make_base(engine: Engine, suite: str = "bookworm", tag: str = BASE, extra: tuple[str, ...] = ()) -> None:
    """A Debian minbase (12 unless ``suite`` says otherwise) with python3 and venv: what the
    Dockerfiles need from a base; ``extra`` packages besides."""
    if engine.has_image(tag):
        return
    rootfs = STATE / ("rootfs" if suite == "bookworm" else f"rootfs-{suite}")
    shutil.rmtree(rootfs, ignore_errors=True)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(('python3', 'python3-venv', 'ca-certificates', *extra))}",
          suite, str(rootfs), "http://deb.debian.org/debian"], True, 900)
    archive = rootfs.with_name(f"{rootfs.name}.tar")
    _run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], True, 300)
    shutil.rmtree(rootfs, ignore_errors=True)
    try:
        engine.podman("import", str(archive), tag)
    finally:
        archive.unlink()


def torch_base(engine: Engine) -> str:
    """Debian 13 (Python 3.13) with PyPI's torch and numpy in the system interpreter, as a PyTorch
    image carries them; Dockerfile.torch builds on it with TORCH empty, its default. Built once,
    in one RUN (one layer: vfs stores each layer whole), then reused: a cold build downloads
    ~3.5 GB of wheels (torch and its nvidia-* libraries). uv fetches and unpacks them in parallel:
    78.6 s for this build against 105.9 s with pip alone (same base, same machine). uv trusts the
    CA bundle mounted at CA_BUNDLE, as pip does, and leaves the image when done."""
    if engine.has_image(TRIXIE_TORCH_BASE):
        return TRIXIE_TORCH_BASE
    make_base(engine, "trixie", TRIXIE_BASE, extra=("python3-pip",))
    context = STATE / "trixie-torch"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(
        f"FROM {TRIXIE_BASE}\n"
        f"RUN python3 -m pip install --no-cache-dir --break-system-packages uv \\\n"
        f"    && SSL_CERT_FILE={CA_BUNDLE} python3 -m uv pip install --system --break-system-packages --no-cache \\\n"
        f"       torch=={TRIXIE_TORCH} numpy \\\n"
        "    && python3 -m pip uninstall -y --break-system-packages uv \\\n"
        "    && python3 -c 'import numpy, torch; print(torch.__version__, numpy.__version__)'\n")
    engine.build("Containerfile", TRIXIE_TORCH_BASE, {}, context=context, timeout=3600)
    return TRIXIE_TORCH_BASE


def engine() -> Engine:
    """overlay where it works (a container start costs a fraction of a second), else vfs."""
    STATE.mkdir(parents=True, exist_ok=True)
    overlay = Engine("overlay")
    try:
        make_base(overlay)
        overlay.run(BASE, "true", check=True, timeout=60)
        return overlay
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        warnings.warn(f"overlay storage unusable, falling back to vfs (slow: a full copy per container): {error}")
        vfs = Engine("vfs")
        make_base(vfs)
        return vfs


def network(engine: Engine) -> str:
    """The pods' network, made anew: internal (no gateway, no NAT), fixed subnet."""
    engine.podman("network", "rm", "-f", NETWORK, check=False)
    engine.podman("network", "create", "--internal", "--subnet", f"{SUBNET}.0/24", NETWORK)
    return NETWORK


def torch_extensions_cache(what, prefix: str = "") -> str:
    """A TORCH_EXTENSIONS_DIR kept between test runs (DeepSpeed compiles its CPU op there on first
    use), one per ``what`` (whatever decides the op's build: an image's base and packages, an
    interpreter and its versions). Writable by the ranks' non-root users; a lock a killed run left
    is removed."""
    key = zlib.crc32(json.dumps(what, sort_keys=True).encode())
    cache = STATE / "torch-extensions" / f"{prefix}{key:08x}"
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o777)
    for lock in cache.glob("*/lock"):
        lock.unlink()
    return str(cache)
