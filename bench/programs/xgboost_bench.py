"""Benchmark worker for bench/bench_xgboost.py: a short distributed xgboost.train that sets up the
collective itself, so it runs the same by hand and under `trainer-launcher xgboost` (whose runner
it then joins).

MODE=explicit: CommunicatorContext with the DMLC_* values (the tracker runs elsewhere).
MODE=upstream: as upstream's example, task 0 also starts a RabitTracker in-process on
DMLC_TRACKER_PORT and waits for it at the end.
FAIL_TASK=N: task N records time.time() in $BENCH_DIR/failed_at and exits 3 after round 2:
sys.exit(3), or with FAIL_HOW=abrupt os._exit(3), as a crash would (no exception unwinding through
CommunicatorContext, no collective shutdown).
"""

import os
import sys
import time

import numpy as np
import xgboost as xgb
from xgboost import collective
from xgboost.tracker import RabitTracker

task = int(os.environ["DMLC_TASK_ID"])
workers = int(os.environ["DMLC_NUM_WORKER"])
uri, port = os.environ["DMLC_TRACKER_URI"], int(os.environ["DMLC_TRACKER_PORT"])
bench_dir = os.environ["BENCH_DIR"]
fail_task = int(os.environ.get("FAIL_TASK", "-1"))
rounds = int(os.environ.get("ROUNDS", "20"))


def write(name: str, data: bytes) -> None:
    path = os.path.join(bench_dir, name)
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)


class Fail(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        if task == fail_task and epoch == 2:
            write("failed_at", repr(time.time()).encode())
            if os.environ.get("FAIL_HOW") == "abrupt":
                os._exit(3)  # dies like a crash: no exception, no collective shutdown
            sys.exit(3)
        return False


tracker = None
if os.environ.get("MODE") == "upstream" and task == 0:
    tracker = RabitTracker(host_ip="0.0.0.0", n_workers=workers, port=port)
    tracker.start()
with collective.CommunicatorContext(dmlc_tracker_uri=uri, dmlc_tracker_port=port, dmlc_task_id=str(task)):
    rng = np.random.default_rng(task)
    features = rng.normal(size=(20_000, 16))
    labels = (features[:, :4].sum(axis=1) + rng.normal(size=20_000) > 0).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "max_depth": 5, "nthread": 1},
                        xgb.QuantileDMatrix(features, label=labels), num_boost_round=rounds, callbacks=[Fail()])
    write(f"model-{task}.ubj", bytes(booster.save_raw("ubj")))
if tracker is not None:
    tracker.wait_for()
