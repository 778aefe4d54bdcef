#!/bin/sh
# The launcher's dependencies, and the image's own requirements, into the launcher's virtual
# environment, from pyproject.toml alone. Dockerfile.torch and Dockerfile.mpi run it before they
# copy the source in: this slow layer (torch, jax, deepspeed...) then stays cached, by content,
# while only the launcher's code changes; install-launcher.sh finds every dependency in place.
# Usage: install-deps.sh PYPROJECT EXTRAS [EXTRA PIP REQUIREMENTS...]
#   EXTRAS: the launcher's extras, comma-separated (storage; mpi); PYTHON (default python3): the
#   base image's interpreter, which the environment sees through (torch in a PyTorch base).
set -eu
pyproject=$1 extras=$2
shift 2
PREFIX=${PREFIX:-/opt/trainer-launcher}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv --system-site-packages "$PREFIX/venv"
requirements=$(mktemp)
"$PREFIX/venv/bin/python" - "$pyproject" "$extras" > "$requirements" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as handle:
    pyproject = tomllib.load(handle)
project, build = pyproject["project"], pyproject["build-system"]["requires"]
wanted = list(project.get("dependencies", ()))
for extra in filter(None, sys.argv[2].split(",")):
    wanted += project["optional-dependencies"][extra]
# The build backend too (and wheel, for a base whose older setuptools it satisfies):
# install-launcher.sh then builds the package without an isolated environment of its own.
print("\n".join([*wanted, *build, "wheel"]))
PY
"$PREFIX/venv/bin/pip" install --no-cache-dir --disable-pip-version-check -r "$requirements" "$@"
rm -f "$requirements"
