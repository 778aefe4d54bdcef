#!/bin/sh
# Install trainer-launcher in an image (run by Dockerfile.torch and Dockerfile.mpi as root).
#   - a virtual environment at $PREFIX/venv that also sees the base image's packages (torch in a
#     PyTorch base), so the launcher, its torchrun agent and the user's `python` share one torch;
#   - the torchrun/mpirun shims in $PREFIX/shims (the Dockerfile puts both first on PATH);
#   - the entrypoint $PREFIX/entrypoint (images/entrypoint.sh), and /etc/profile.d/trainer-launcher.sh
#     with $PREFIX/image-path, the PATH this runs with (the image's), for login shells;
#   - a non-root user (uid $APP_UID, writable home) and /workspace owned by it; APP_UID=0 keeps
#     root (for hosts that bind-mount root-owned directories, like the Kubeflow SDK's /workspace).
# Usage: install-launcher.sh SRC EXTRAS USER_NAME [EXTRA PIP REQUIREMENTS...]
#   (EXTRAS and the requirements are installed here only where install-deps.sh has not run)
#   PYTHON (default python3): the base image's interpreter; APP_UID (default 1000);
#   SHIMS: which of images/shims/ to put on PATH (torchrun; mpirun mpiexec).
set -eu
src=$1 extras=$2 user=$3
shift 3
PREFIX=${PREFIX:-/opt/trainer-launcher}
PYTHON=${PYTHON:-python3}
APP_UID=${APP_UID:-1000}

# The environment is there already where install-deps.sh made it: its layer holds every dependency
# and requirement, so only the package itself is installed here (no second resolution of torch,
# jax, ...: seconds for each image whenever the code changes). Without it, everything is.
# install-deps.sh put the build backend there too, so pip builds in the venv itself rather than
# fetching setuptools into an isolated environment for every image (3.3 s -> 1.3 s an image).
if [ -x "$PREFIX/venv/bin/python" ]; then
  "$PREFIX/venv/bin/pip" install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation "$src"
else
  "$PYTHON" -m venv --system-site-packages "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install --no-cache-dir --disable-pip-version-check "$@" "${src}[${extras}]"
fi
install -d -m 0755 "$PREFIX/shims"
for shim in ${SHIMS:-}; do install -m 0755 "$src/images/shims/$shim" "$PREFIX/shims/$shim"; done
install -m 0755 "$src/images/entrypoint.sh" "$PREFIX/entrypoint"
install -m 0644 "$src/images/run-as.py" "$PREFIX/run-as"
printf '%s\n' "$PATH" > "$PREFIX/image-path"
install -d -m 0755 /etc/profile.d
install -m 0644 "$src/images/profile.sh" /etc/profile.d/trainer-launcher.sh

# The user: reuse uid $APP_UID where the base already has one (Ubuntu 24.04 ships `ubuntu`).
home=/home/$user
existing=$(getent passwd "$APP_UID" | cut -d: -f1 || true)
if [ "$APP_UID" = 0 ]; then
  :  # root stays root
elif [ -n "$existing" ] && [ "$existing" != "$user" ]; then
  usermod --login "$user" --home "$home" --move-home "$existing"
  groupmod --new-name "$user" "$(id -gn "$user")" 2>/dev/null || true
elif [ -z "$existing" ]; then
  groupadd --gid "$APP_UID" "$user" 2>/dev/null || groupadd "$user"
  useradd --uid "$APP_UID" --gid "$user" --create-home --home-dir "$home" --shell /bin/bash "$user"
fi
install -d -o "$APP_UID" -g "$(getent passwd "$APP_UID" | cut -d: -f4)" -m 0755 "$home" /workspace
"$PREFIX/venv/bin/trainer-launcher" --version
