#!/bin/sh
# The images' ENTRYPOINT. Kubernetes `command:` replaces an image's entrypoint, but docker and
# podman append the container's command to it: the Kubeflow SDK's container backend sends
# `bash -lc "..."`, which a bare `ENTRYPOINT ["trainer-launcher"]` would read as a subcommand.
#   - trainer-launcher's own subcommands and options, or nothing, go to trainer-launcher
#     (`IMAGE torch -- train.py`, `IMAGE init dataset`, `IMAGE --version`);
#   - any other command runs under `trainer-launcher exec`, which makes it a proper PID 1:
#     signals forwarded to every process group, orphans reaped, its exit code kept. A torchrun
#     inside it still goes through the torchrun shim (exec does not turn the shims off);
#   - except at a terminal (`docker run -it IMAGE bash`): an interactive shell needs the
#     terminal itself, not the launcher's output relay, so it runs directly.
# Keep the list in step with launcher/cli.py (tests/test_images.py checks it).
#
# First, in the torch image (LAUNCHER_RUN_AS=1000), a start as root gives a root-owned /workspace
# to that user and drops to it before anything else runs (run-as.py says why). LAUNCHER_RUN_AS=0
# keeps root. Under Kubernetes the image runs as the runtimes' runAsUser: not root, nothing to do.
if [ -n "${LAUNCHER_RUN_AS:-}" ] && [ "$LAUNCHER_RUN_AS" != 0 ] && [ "$(id -u)" = 0 ]; then
  exec /opt/trainer-launcher/venv/bin/python -I -S /opt/trainer-launcher/run-as "$LAUNCHER_RUN_AS" "$0" "$@"
fi
case "${1:-}" in
  ""|-*|torch|plan|mpi|jax|xgboost|exec|local|init|policy|smoke) exec trainer-launcher "$@" ;;
esac
if [ -t 0 ] && [ -t 1 ]; then
  exec "$@"
fi
exec trainer-launcher exec -- "$@"
