"""A distributed XGBoost training for tests: run under `trainer-launcher xgboost` (it never sets up
the collective itself). Each worker trains on its own shard, saves the model it ends with and a
JSON report, both atomically, in $OUT_DIR.

BEHAVIOUR: train (default); exit:N (task $FAIL_TASK exits N after boosting round 2, the others
keep training); crash:N (the same through os._exit(N): no exception, no collective shutdown, as a
crash); signal:NAME (the task sends itself that signal: SIGSEGV for a native crash); sleep (write the report, then sleep: for signal tests); raise (task $FAIL_TASK raises
ValueError after round 2); fault (task $FAIL_TASK prints an NCCL system error, as a worker on a
broken node does, and exits 1 after round 2).
"""

import gc
import json
import os
import signal
import socket
import sys
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import numpy as np
import xgboost as xgb
from xgboost import collective

gc.freeze()
gc.enable()

task = int(os.environ["DMLC_TASK_ID"])
out = os.environ["OUT_DIR"]
behaviour = os.environ.get("BEHAVIOUR", "train")
fail_task = int(os.environ.get("FAIL_TASK", "-1"))


def write(name: str, data: bytes) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)


def report(**extra) -> None:
    write(f"worker-{task}.json", json.dumps({
        "task": task, "rank": collective.get_rank(), "world": collective.get_world_size(),
        "distributed": collective.is_distributed(), "pid": os.getpid(), "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **extra}).encode())


class FailAfterRound(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        if epoch == 0:
            write(f"training-{task}", b"")  # a test may act once every worker trains
        if task == fail_task and epoch == 2:
            if behaviour.startswith("signal:"):
                print(f"task {task} sends itself {behaviour[7:]}", flush=True)
                os.kill(os.getpid(), signal.Signals[behaviour[7:]])
            if behaviour.startswith("crash:"):
                print(f"task {task} crashes with {behaviour[6:]}", flush=True)
                os._exit(int(behaviour[6:]))
            if behaviour.startswith("exit:"):
                print(f"task {task} exits {behaviour[5:]}", flush=True)
                sys.exit(int(behaviour[5:]))
            if behaviour == "fault":  # what a worker on a broken node prints before it exits 1
                print("NCCL error in: ProcessGroupNCCL.cpp:2050, unhandled system error", file=sys.stderr, flush=True)
                sys.exit(1)
            if behaviour == "raise":
                raise ValueError(f"task {task} found a bad shard")
        return False


if behaviour == "sleep":
    report(state="sleeping")
    time.sleep(600)

rng = np.random.default_rng(task)
features = rng.normal(size=(2000, 8))
labels = (features[:, 0] + 0.5 * features[:, 1] + rng.normal(scale=0.3, size=2000) > 0).astype(int)
rounds = int(os.environ.get("ROUNDS", "8" if fail_task < 0 else "2000"))
booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "max_depth": 3, "nthread": 1},
                    xgb.QuantileDMatrix(features, label=labels), num_boost_round=rounds,
                    callbacks=[FailAfterRound()])
write(f"model-{task}.ubj", bytes(booster.save_raw("ubj")))
report(state="trained", rounds=booster.num_boosted_rounds())
