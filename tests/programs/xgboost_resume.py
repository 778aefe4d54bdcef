"""A distributed XGBoost training that checkpoints every round and resumes from its checkpoint, for
restarts in place: run under `trainer-launcher xgboost` (the runner joins the collective). Rank 0
saves the model after each round, atomically; every worker then waits for the others (a tiny
allreduce), so a round every worker has finished is on disk. At start every worker loads the
checkpoint, if any, and trains the rounds that are left.

CKPT        the checkpoint file (default: none, so no resume)
ROUNDS      how many boosting rounds the job has (default 6)
FAIL        <ending>@<round>[@<generations>]: task FAIL_TASK ends so as that round begins, in the given
            generations (comma-separated; default 0: only the first start), the generation being the
            launcher's restart count (LAUNCHER_RESTART_COUNT). <ending>: exit:<code> | signal:<NAME>
FAIL_TASK   the task that fails (default 1)
HANG        <round>[@<generations>]: task FAIL_TASK stops as that round begins, for good (default: never)
PROGRESS    1: every worker prints its progress as Katib's "step=N" lines, a round a step
ROUND_TIME  seconds each round sleeps once done (default 0), so that a test can act while the job trains
OUT_DIR     each worker appends "<generation> <round> <DMLC_TRACKER_PORT>" per round done to
            <task>.rounds, writes <task>.first-<generation> (atomically, the first round it did in
            that generation) so a test can wait for a generation to train, and at the end saves
            its model to model-<task>.ubj
"""

import gc
import os
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import numpy as np
import xgboost as xgb
from restart_fault import FAIL, HANG, progress
from xgboost import collective

gc.freeze()
gc.enable()

generation = int(os.environ["LAUNCHER_RESTART_COUNT"])
task = int(os.environ["DMLC_TASK_ID"])
out = os.environ["OUT_DIR"]
checkpoint = os.environ.get("CKPT")
rounds = int(os.environ.get("ROUNDS", "6"))
fail_task = int(os.environ.get("FAIL_TASK", "1"))
round_time = float(os.environ.get("ROUND_TIME", "0"))


def write(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)


class Checkpoint(xgb.callback.TrainingCallback):
    first = True

    def before_iteration(self, model, epoch, evals_log):
        if task == fail_task and FAIL.due(model.num_boosted_rounds(), generation):
            print(f"task {task} ends ({FAIL.ending}) in generation {generation}", flush=True)
            FAIL.end()
        if task == fail_task and HANG.due(model.num_boosted_rounds(), generation):
            HANG.end()
        return False

    def after_iteration(self, model, epoch, evals_log):
        done = model.num_boosted_rounds() - 1
        if checkpoint and collective.get_rank() == 0:
            write(checkpoint, bytes(model.save_raw("ubj")))
        with open(os.path.join(out, f"{task}.rounds"), "a") as log:
            log.write(f"{generation} {done} {os.environ['DMLC_TRACKER_PORT']}\n")
        if self.first:
            write(os.path.join(out, f"{task}.first-{generation}"), str(done).encode())
            self.first = False
        # Nobody begins the next round before the checkpoint of this one is down.
        collective.allreduce(np.zeros(1), collective.Op.SUM)
        progress(done)
        time.sleep(round_time)
        return False


rng = np.random.default_rng(task)
features = rng.normal(size=(2000, 8))
labels = (features[:, 0] + 0.5 * features[:, 1] + rng.normal(scale=0.3, size=2000) > 0).astype(int)
resumed = None
if checkpoint and os.path.exists(checkpoint):
    with open(checkpoint, "rb") as handle:
        resumed = xgb.Booster(model_file=bytearray(handle.read()))
left = rounds - (resumed.num_boosted_rounds() if resumed is not None else 0)
booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "max_depth": 3, "nthread": 1},
                    xgb.QuantileDMatrix(features, label=labels), num_boost_round=left, xgb_model=resumed,
                    callbacks=[Checkpoint()])
write(os.path.join(out, f"model-{task}.ubj"), bytes(booster.save_raw("ubj")))
print(f"task {task} done: {booster.num_boosted_rounds()} rounds", flush=True)
