"""Distributed XGBoost with nothing distributed in it: under `trainer-launcher xgboost` every
worker has already joined the job's collective, so xgb.train builds one model from every worker's
shard. Worker 0 saves it.

    trainer-launcher local --framework xgboost --nnodes 2 -- python examples/xgboost_demo.py
"""

import argparse
import os

import numpy as np
import xgboost as xgb
from xgboost import collective

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=50)
parser.add_argument("--output", default="/workspace/output/xgboost_model.ubj")
args = parser.parse_args()

rank = collective.get_rank()
rng = np.random.default_rng(rank)  # each worker's own shard
features = rng.normal(size=(10_000, 20))
labels = (features[:, :5].sum(axis=1) + rng.normal(size=10_000) > 0).astype(int)
train = xgb.QuantileDMatrix(features[:8000], label=labels[:8000])
valid = xgb.QuantileDMatrix(features[8000:], label=labels[8000:], ref=train)
device = "cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu"  # the launcher gives each GPU worker one
booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "device": device, "eval_metric": "logloss"},
                    train, num_boost_round=args.rounds, evals=[(valid, "valid")], verbose_eval=10)
accuracy = float(((booster.predict(valid) > 0.5) == labels[8000:]).mean())
print(f"worker {rank} of {collective.get_world_size()}: validation accuracy {accuracy:.3f}", flush=True)
if rank == 0 and os.access(os.path.dirname(args.output) or ".", os.W_OK):
    booster.save_model(args.output)
    print(f"saved {args.output}", flush=True)
