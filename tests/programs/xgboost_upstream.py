"""Upstream's XGBoost example (Kubeflow Trainer v2.3.0, docs/user-guides/xgboost.md), with the same
collective calls in the same order: task 0 starts a RabitTracker on DMLC_TRACKER_PORT, every task
enters CommunicatorContext with the DMLC_* values, task 0 waits for its tracker at the end. Data
from numpy instead of scikit-learn; the model and a report go to $OUT_DIR."""

import gc
import json
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
import numpy as np
import xgboost as xgb
from xgboost import collective as coll
from xgboost.tracker import RabitTracker

gc.freeze()
gc.enable()

rank = int(os.environ["DMLC_TASK_ID"])
world_size = int(os.environ["DMLC_NUM_WORKER"])
tracker_uri = os.environ["DMLC_TRACKER_URI"]
tracker_port = int(os.environ["DMLC_TRACKER_PORT"])
out = os.environ["OUT_DIR"]

tracker = None
if rank == 0:
    tracker = RabitTracker(host_ip="0.0.0.0", n_workers=world_size, port=tracker_port)
    tracker.start()

with coll.CommunicatorContext(dmlc_tracker_uri=tracker_uri, dmlc_tracker_port=tracker_port, dmlc_task_id=str(rank)):
    rng = np.random.default_rng(42 + rank)
    features = rng.normal(size=(2000, 8))
    labels = (features[:, 0] - features[:, 2] > 0).astype(int)
    dtrain = xgb.QuantileDMatrix(features, label=labels)
    model = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "max_depth": 3, "nthread": 1},
                      dtrain, num_boost_round=6)
    seen = {"task": rank, "rank": coll.get_rank(), "world": coll.get_world_size()}
    with open(os.path.join(out, f"model-{rank}.ubj.tmp"), "wb") as handle:
        handle.write(bytes(model.save_raw("ubj")))
    os.replace(os.path.join(out, f"model-{rank}.ubj.tmp"), os.path.join(out, f"model-{rank}.ubj"))

if tracker is not None:
    tracker.wait_for()
with open(os.path.join(out, f"worker-{rank}.json"), "w") as handle:
    json.dump(seen, handle)
