"""The test environment, made with uv where it can be: ``python3 -m tests.install DIR REQUIREMENT...``.

pip unpacks the suite's ~150 wheels (2.1 GB) one after another: 52 s here, every CI run. uv
installs the same set from its cache by hard links, and the first time from the index in
parallel (10 s here, cold). The set is the same: `pip freeze` of both compared, name for name.

uv reads none of pip's configuration, and this machine's lives there (a find-links directory
with the local torch CPU wheel, a constraints file that caps torch). So what pip would use is
asked from pip itself (``pip config list``, files and PIP_* variables alike) and handed to uv:
find-links directories and local index folders that exist, the constraint files, the CA bundle,
and pip's choice of the best version across all indexes (uv's default takes the first index's).
Where uv cannot be installed or fails, pip installs as before. Either way the bytecode is then
compiled with every core (tests/bytecode.py says why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python3 -m tests.install DIR REQUIREMENT...", file=sys.stderr)
        return 2
    venv, requirements = Path(argv[0]), argv[1:]
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not _with_uv(python, requirements):
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", *requirements], check=True)
    from tests import bytecode  # run from the checkout's root, as -m tests.install is

    return bytecode.main([str(venv)])


def _with_uv(python: Path, requirements: list[str]) -> bool:
    pip, uv = [str(python), "-m", "pip"], python.parent / "uv"
    if not uv.exists() and subprocess.run([*pip, "install", "-q", "uv"]).returncode != 0:
        return False
    if not uv_install(uv, python, requirements, pip=pip):
        print("tests.install: uv failed; installing with pip", file=sys.stderr)
        return False
    return True


def uv_install(uv: Path, python: Path | str, requirements: Sequence[str], *, pip: Sequence[str] = (),
               constraints: bool = True) -> bool:
    """``uv pip install REQUIREMENTS`` into ``python``'s environment with what pip is configured
    with (asked from ``pip``, by default this interpreter's); ``constraints=False`` leaves pip's
    constraint files out (an environment above this machine's cap). True when uv succeeded."""
    config = _pip_config(list(pip) or [sys.executable, "-m", "pip"])
    if not constraints:
        config.pop("constraint", None)
    args, env = uv_options(config)
    argv = [str(uv), "pip", "install", "-q", "--python", str(python), *args, *requirements]
    return subprocess.run(argv, env={**os.environ, **env}).returncode == 0


def _pip_config(pip: list[str]) -> dict[str, str]:
    listed = subprocess.run([*pip, "config", "list"], capture_output=True, text=True).stdout
    return parse_pip_config(listed)


def parse_pip_config(listed: str) -> dict[str, str]:
    """``pip config list`` as {option: value}. A PIP_* variable (``:env:.option``) wins over a
    file's ``global.option``, as it does for pip; other sections (``install.``) count too."""
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        section, option = key.rsplit(".", 1)
        rank = 1 if section == ":env:" else 0
        if option not in found or rank >= found[option][0]:
            found[option] = (rank, value.strip().strip("'\""))
    return {option: value for option, (_, value) in found.items()}


def uv_options(config: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's arguments and environment for what pip is configured with. Local places that do not
    exist are left out: pip only warns about them, uv would stop."""
    # pip takes the best version across all its indexes; uv, by default, only the first index's.
    args: list[str] = ["--index-strategy", "unsafe-best-match"]
    for place in config.get("find-links", "").split():
        if _exists(place):
            args += ["--find-links", place]
    if config.get("index-url") and _exists(config["index-url"]):
        args += ["--index-url", config["index-url"]]
    for index in config.get("extra-index-url", "").split():
        if _exists(index):
            args += ["--extra-index-url", index]
    for constraint in config.get("constraint", "").split():
        if Path(constraint).is_file():
            args += ["--constraint", constraint]
    env = {"SSL_CERT_FILE": config["cert"]} if Path(config.get("cert", "")).is_file() else {}
    return args, env


def _exists(place: str) -> bool:
    url = urlparse(place)
    if url.scheme in ("http", "https"):
        return True
    return Path(url.path if url.scheme == "file" else place).exists()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
