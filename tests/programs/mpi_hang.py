"""MPI ranks in step, until rank 1 stops joining the all-reduce the others wait in: HANG_AT.
Rank 0 prints the progress (Katib's name=value lines), as the launcher pod sees it through mpirun."""

import os
import time

from mpi4py import MPI


def stuck_forever() -> None:
    while True:
        time.sleep(3600)


comm = MPI.COMM_WORLD
for step in range(1, 1000):
    if comm.rank == 1 and step == int(os.environ["HANG_AT"]):
        stuck_forever()
    total = comm.allreduce(step)
    time.sleep(0.2)
    if comm.rank == 0:
        print(f"step={step} loss={1.0 / step:.4f} total={total}", flush=True)
