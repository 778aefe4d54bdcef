"""An MPI rank for the tests: reports who and where it is, and what it can see.

REPORT_DIR  each rank writes <rank>.json (rank, size, hostname, JOB_ONLY value, allreduce)
BEHAVIOUR   ok (default) | exit:<code> | raise:<message> | signal:<NAME> (on FAIL_RANK, after the
            allreduce; the other ranks sleep 60 s, so only an abort ends them sooner)
"""

import json
import os
import signal
import socket
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1)
report_dir = os.environ.get("REPORT_DIR")
if report_dir:
    with open(os.path.join(report_dir, f".{rank}.json.tmp"), "w") as handle:
        json.dump({"rank": rank, "size": size, "hostname": socket.gethostname(),
                   "job_only": os.environ.get("JOB_ONLY"), "allreduce": total,
                   "library": MPI.Get_library_version().splitlines()[0]}, handle)
    # the test polls for <rank>.json: it appears complete or not at all
    os.replace(os.path.join(report_dir, f".{rank}.json.tmp"), os.path.join(report_dir, f"{rank}.json"))
print(f"rank {rank}/{size} on {socket.gethostname()}", flush=True)
behaviour = os.environ.get("BEHAVIOUR", "ok")
if behaviour != "ok":
    if rank == int(os.environ.get("FAIL_RANK", "1")):
        time.sleep(0.5)
        how, _, what = behaviour.partition(":")
        if how == "raise":
            raise RuntimeError(what)
        if how == "signal":
            os.kill(os.getpid(), signal.Signals[what])
        sys.exit(int(what))
    time.sleep(60)
comm.Barrier()
