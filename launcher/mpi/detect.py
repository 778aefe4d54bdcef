"""Which MPI is on PATH: its name and major version from ``--version``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass

from launcher.core.outcome import ConfigError

IMPLEMENTATIONS = ("openmpi", "intel", "mpich")


@dataclass(frozen=True)
class MpiImpl:
    name: str  # openmpi | intel | mpich
    major: int | None
    launcher: str  # the mpirun/mpiexec to run

    @property
    def flavor(self) -> str:
        return "openmpi" if self.name == "openmpi" else "hydra"

    def to_json(self) -> dict:
        return {"name": self.name, "major": self.major, "launcher": self.launcher}


def parse_version(text: str) -> tuple[str, int | None] | None:
    """``mpirun (Open MPI) 5.0.11``; ``Intel(R) MPI Library ..., Version 2021.19``;
    ``HYDRA build details: Version: 4.0.2`` (MPICH)."""
    if match := (
        re.search(r"\((?:Open MPI|OpenRTE)\)\s+(\d+)\.", text)  # mpirun / Debian's mpiexec 4.x
        or re.search(r"Open MPI.*?v?(\d+)\.\d+", text)
    ):
        return "openmpi", int(match[1])
    if match := re.search(r"Intel\(R\) MPI Library.*?Version\s+(\d+)", text, re.S):
        return "intel", int(match[1])
    if "Intel(R) MPI" in text:
        return "intel", None
    if match := re.search(r"HYDRA build details:.*?Version:\s+(\d+)", text, re.S):
        return "mpich", int(match[1])
    if "HYDRA" in text or "MPICH" in text:
        return "mpich", None
    return None


def find_launcher(explicit: str | None) -> str | None:
    if explicit:
        return explicit if os.path.sep in explicit else shutil.which(explicit)
    return shutil.which("mpirun") or shutil.which("mpiexec")


def detect(explicit_launcher: str | None, wanted: str, source: str = "LAUNCHER_MPIRUN") -> MpiImpl:
    """Run ``<launcher> --version`` and read it; ``wanted`` (auto or a name) must agree.
    ``source`` is the flag or variable that named the launcher, for errors."""
    launcher = find_launcher(explicit_launcher)
    if launcher is None:
        if explicit_launcher:
            raise ConfigError(source, explicit_launcher, "an executable mpirun or mpiexec")
        raise ConfigError("mpirun", None, "an mpirun or mpiexec on PATH (or --mpirun / LAUNCHER_MPIRUN)")
    try:
        output = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(source, launcher, f"an MPI launcher that answers --version ({error})") from None
    found = parse_version(output)
    if wanted != "auto":
        major = found[1] if found and found[0] == wanted else None
        return MpiImpl(wanted, major, launcher)
    if found is None:
        first = output.strip().splitlines()[0] if output.strip() else ""
        raise ConfigError(
            "LAUNCHER_MPI_IMPLEMENTATION", "auto", f"openmpi, intel or mpich: '{launcher} --version' printed {first!r}"
        )
    return MpiImpl(found[0], found[1], launcher)


def find_libmpi(launcher: str) -> str | None:
    """Open MPI's shared library (``libmpi.so.40``, its soname since 3.0) in the prefix of the
    ``mpirun`` we run: ``<prefix>/lib``, ``lib64`` or the Debian multiarch directory."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for bindir in dict.fromkeys((os.path.dirname(launcher), os.path.dirname(os.path.realpath(launcher)))):
        prefix = os.path.dirname(bindir)
        for libdir in ("lib", "lib64", os.path.join("lib", multiarch) if multiarch else None):
            if libdir and os.path.isfile(path := os.path.join(prefix, libdir, "libmpi.so.40")):
                return path
    return None
