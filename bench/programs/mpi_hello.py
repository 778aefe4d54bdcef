"""Benchmark rank: the least an MPI job does. Import mpi4py (MPI_Init), one allreduce, exit."""

from mpi4py import MPI

total = MPI.COMM_WORLD.allreduce(1)
if total != MPI.COMM_WORLD.Get_size():
    raise SystemExit(f"allreduce gave {total}, expected {MPI.COMM_WORLD.Get_size()}")
