"""Benchmark rank: every rank writes $BENCH_DIR/rank<N>.pid, then MPI_Init + one allreduce;
rank 1 records time.time() in $BENCH_DIR/failed_at and exits 3, rank 0 sleeps 60 s.

Run plainly (``python3 mpi_fail.py``) nothing tells the MPI that rank 1 failed on purpose, so
mpirun waits for rank 0; run as ``python3 -m mpi4py mpi_fail.py`` the nonzero SystemExit
calls MPI_Abort and the job ends at once."""

import os
import sys
import time

from mpi4py import MPI

bench_dir = os.environ["BENCH_DIR"]
comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def write(name: str, text: str) -> None:
    path = os.path.join(bench_dir, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


write(f"rank{rank}.pid", str(os.getpid()))
comm.allreduce(rank)
if rank == 1:
    time.sleep(0.3)  # let rank 0 settle into its sleep and mpirun into its wait
    write("failed_at", repr(time.time()))
    sys.exit(3)
time.sleep(60)
