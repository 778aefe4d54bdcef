"""``trainer-launcher mpi``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse

from launcher.core.knobs import Override, given
from launcher.mpi.knobs import MPI_KNOBS

NAME = "mpi"
HELP = "MPI launcher role (mpirun from the Trainer hostfile), or --worker (sshd)"
USAGE = (
    "trainer-launcher mpi [OPTIONS] -- [MPIRUN FLAGS] PROGRAM [ARGS...]\n       trainer-launcher mpi --worker [OPTIONS]"
)
KNOBS = MPI_KNOBS


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker", action="store_true", help="run the worker role: sshd on the ssh port with the mounted keys"
    )


def add_local_options(parser: argparse.ArgumentParser) -> None:
    """``local``'s options for an MPI TrainJob; ``--mpi`` alone picks this framework."""
    parser.add_argument(
        "--mpi",
        choices=["openmpi", "intel", "mpich"],
        default=None,
        help="emulate an MPI TrainJob with this MPI (workers with sshd, a launcher pod); needs root",
    )
    parser.add_argument("--user", default="mpiuser", help="with --mpi: the unprivileged user sshd and mpirun run as")


def claims_local(args: argparse.Namespace) -> bool:
    """``local --mpi IMPL`` without ``--framework`` emulates an MPI TrainJob."""
    return bool(args.mpi)


def run(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.mpi import job

    if args.worker:
        return job.run_worker(overrides, given(args, MPI_KNOBS, "mpi_"))
    return job.run_mpi(overrides, given(args, MPI_KNOBS, "mpi_"), rest)


def plan(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.core.report import print_plan
    from launcher.mpi.job import make_plan

    mpi_overrides = given(args, MPI_KNOBS, "mpi_")
    return print_plan(overrides, lambda launcher: make_plan(mpi_overrides, rest or ["PROGRAM"], launcher)[1].to_json())


def local(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.mpi.local import run_local_mpi

    return run_local_mpi(
        overrides,
        given(args, MPI_KNOBS, "mpi_"),
        rest,
        args.mpi or "openmpi",
        args.nnodes,
        args.nproc_per_node,
        args.trainjob,
        args.user,
    )
