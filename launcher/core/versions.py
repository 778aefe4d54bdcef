"""What users may bring: the supported range of each framework and of Python, and the check that
refuses anything outside it at start, in one line, before a job begins.

The ranges are the versions the compatibility matrix runs (tests/test_matrix_*.py, the table in
docs/compatibility.md): a floor we test, and a ceiling just above the newest release we test. A
version outside is refused with exit 2 (``UnsupportedVersion``) rather than left to fail mid-job; ``1`` in
``LAUNCHER_ALLOW_UNTESTED_VERSIONS`` (or ``--allow-untested-versions 1``) runs it anyway, with
one warning line, for the day a new torch ships before we have tested it.

Stdlib only, and loadable by path: the JAX and XGBoost runners, which run in the user's own
interpreter, check their framework with this same table (launcher/jax/run.py).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

ALLOW_ENV = "LAUNCHER_ALLOW_UNTESTED_VERSIONS"


@dataclass(frozen=True)
class Supported:
    """``floor <= version < ceiling``, compared on the release numbers (2.4.1+cu121 is 2.4.1)."""

    package: str  # the distribution name (importlib.metadata), or "python"
    floor: str
    ceiling: str
    tested: tuple[str, ...]  # the versions the matrix runs

    @property
    def spec(self) -> str:
        return f">={self.floor},<{self.ceiling}"

    def admits(self, version: str) -> bool:
        release = release_of(version)
        return release_of(self.floor) <= release < release_of(self.ceiling)


# The matrix (tests/test_matrix_*.py) runs every version in `tested`; pyproject.toml's extras carry
# the same floors and ceilings. DeepSpeed and transformers are never imported by the launcher and
# not gated: their rows say what the suite runs (DeepSpeed under mpirun in tests/test_mpi_frameworks.py,
# transformers' KubeflowCallback in tests/test_progress_sources.py).
SUPPORTED: dict[str, Supported] = {
    s.package: s
    for s in (
        Supported("python", "3.11", "3.14", ("3.11", "3.13")),
        Supported("torch", "2.4", "2.16", ("2.4.1", "2.8.0", "2.13.0", "2.15.0")),
        Supported("jax", "0.5", "0.11", ("0.5.3", "0.7.2", "0.10.2")),
        Supported("xgboost", "2.1", "3.3", ("2.1.4", "3.2.0")),
        Supported("mpi4py", "3.1", "4.2", ("3.1.6", "4.1.2")),
        Supported("deepspeed", "0.19", "0.20", ("0.19.8",)),
        Supported("transformers", "5.23", "6.0", ("5.23.0",)),
        Supported("accelerate", "1.0", "1.16", ("1.0.1", "1.15.0")),
    )
}


def release_of(version: str) -> tuple[int, ...]:
    """The leading release numbers: '2.4.1+cu121' -> (2, 4, 1); '2.16.0.dev2026' -> (2, 16, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed(package: str) -> str | None:
    """The installed version of a distribution in this interpreter, without importing it."""
    if package == "python":
        return ".".join(str(part) for part in sys.version_info[:3])
    from importlib import metadata

    names = (package, f"{package}-cpu") if package == "xgboost" else (package,)  # xgboost-cpu is xgboost
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def running(package: str) -> str:
    """The version of ``package`` this process runs: the imported module's own, else the
    installed distribution's, else "unknown"."""
    version = getattr(sys.modules.get(package), "__version__", None)
    return str(version) if version else installed(package) or "unknown"


class FeatureNotes:
    """Which features of the launcher are off on the installed version of a framework's library,
    each said once, on stderr: "trainer-launcher: jax 0.5.3: stop records ... is off: why"."""

    def __init__(self, package: str):
        self.package = package
        self.said: set[str] = set()

    def off(self, feature: str, why: str) -> None:
        if feature in self.said:
            return
        self.said.add(feature)
        print(
            f"trainer-launcher: {self.package} {running(self.package)}: {feature} is off: {why}",
            file=sys.stderr,
            flush=True,
        )


def refusal(package: str, version: str | None = None) -> str | None:
    """Why ``package`` at ``version`` (default: the installed one) is refused, as one line; None
    when it is in range or not installed (its absence is reported where it is imported)."""
    rule = SUPPORTED[package]
    version = version if version is not None else installed(package)
    if version is None or rule.admits(version):
        return None
    return (
        f"{package}={version!r}: expected {package} {rule.spec}, the range {_launcher()} "
        f"supports (tested: {', '.join(rule.tested) or 'none yet'}); {ALLOW_ENV}=1 runs it anyway"
    )


def runner_refusal(package: str, say, version: str | None = None, environ: dict[str, str] | None = None) -> str | None:
    """In a runner (the program's interpreter, launcher/jax/run.py and launcher/xgboost/run.py):
    the line that refuses ``package`` (default: the installed version), or None. Out of range but
    allowed by ALLOW_ENV in ``environ`` (default os.environ): one warning through ``say``, None."""
    import os

    line = refusal(package, version)
    if line is None:
        return None
    if not allowed((os.environ if environ is None else environ).get(ALLOW_ENV)):
        return line
    if line not in _runner_warned:
        _runner_warned.add(line)
        say(f"warning: {line.rsplit('; ', 1)[0]}; running it anyway ({ALLOW_ENV}=1)")
    return None


_runner_warned: set[str] = set()


def _launcher() -> str:
    try:  # a runner loaded by path may sit in an interpreter that cannot import the package
        from launcher import __version__
    except ImportError:
        return "trainer-launcher"
    return f"trainer-launcher {__version__}"


def allowed(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def check(*packages: str, allow: bool = False) -> None:
    """In the launcher: refuse (UnsupportedVersion, exit 2) any of ``packages`` installed here
    outside its range; with ``allow``, say it once as a warning and go on."""
    from launcher.core import log
    from launcher.core.outcome import UnsupportedVersion

    for package in packages:
        line = refusal(package)
        if line is None:
            continue
        if not allow:
            raise UnsupportedVersion(line)
        if package not in _warned:
            _warned.add(package)
            log.warning(f"{line.split(': expected ')[0]} is untested: running it because {ALLOW_ENV} is set")


_warned: set[str] = set()
