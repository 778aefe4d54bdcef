"""A rank that does what the test asks, through environment variables:

BEHAVIOUR  ok (default) | exit:<code> | kill:<SIGNAL> | ignore-term | nccl-error | sleep | usr1 |
           replay-abort (print the file ABORT_TEXT names to stderr, then abort: a native abort's
           output captured on a GPU machine, replayed here)
FAIL_RANK  the global rank that misbehaves (others wait in a barrier or sleep)
OTHERS     sleep (default): the other ranks sleep | finish: they end at once, without a barrier
           (they destroy their process group first: a gloo rank that exits holding one may abort
           in its threads' destructors, a SIGABRT the launcher would rightly report)
REPORT_DIR each rank writes <rank>.json with what torchrun gave it and the all-reduce it saw;
           the misbehaving rank writes <rank>.died (epoch seconds) just before it exits or dies
"""

import gc
import json
import os
import signal
import sys
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist

gc.freeze()
gc.enable()

rank = int(os.environ["RANK"])
behaviour = os.environ.get("BEHAVIOUR", "ok")
fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
others_finish = os.environ.get("OTHERS") == "finish"
report_dir = os.environ.get("REPORT_DIR")


def note_death() -> None:
    if report_dir:
        with open(os.path.join(report_dir, f".{rank}.died.tmp"), "w") as handle:
            handle.write(repr(time.time()))
        os.replace(os.path.join(report_dir, f".{rank}.died.tmp"), os.path.join(report_dir, f"{rank}.died"))

if behaviour == "usr1":  # every rank notes SIGUSR1 in REPORT_DIR/<rank>.usr1
    signal.signal(signal.SIGUSR1, lambda *_: open(os.path.join(report_dir, f"{rank}.usr1"), "w").close())
dist.init_process_group("gloo")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
if report_dir:
    with open(os.path.join(report_dir, f".{rank}.json.tmp"), "w") as handle:
        json.dump({
            "rank": rank,
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"]),
            "group_rank": int(os.environ["GROUP_RANK"]),
            "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
            "allreduce": total.item(),
            "pid": os.getpid(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "hostname": os.uname().nodename,
        }, handle)
    # the test polls for <rank>.json: it appears complete or not at all
    os.replace(os.path.join(report_dir, f".{rank}.json.tmp"), os.path.join(report_dir, f"{rank}.json"))
print(f"rank {rank} ready", flush=True)

if rank != fail_rank and behaviour != "ok" and others_finish:
    dist.destroy_process_group()
    sys.exit(0)
if behaviour in ("sleep", "usr1") or (rank != fail_rank and behaviour != "ok"):
    time.sleep(300)
elif behaviour.startswith("exit:"):
    time.sleep(0.2)
    note_death()
    sys.exit(int(behaviour.split(":")[1]))
elif behaviour.startswith("kill:"):
    time.sleep(0.2)
    note_death()
    os.kill(os.getpid(), getattr(signal, behaviour.split(":")[1]))
elif behaviour == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300)
elif behaviour == "nccl-error":
    print("[E ProcessGroupNCCL.cpp:1234] [Rank 1] Watchdog caught collective operation timeout: "
          "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.", file=sys.stderr, flush=True)
    os.abort()
elif behaviour == "replay-abort":
    with open(os.environ["ABORT_TEXT"]) as capture:
        sys.stderr.write(capture.read())
    sys.stderr.flush()
    os.abort()
dist.barrier()
dist.destroy_process_group()
