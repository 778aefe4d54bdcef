"""``trainer-launcher xgboost``: how the CLI reaches this package (nothing heavy imported here)."""

from launcher.core.runner_command import RunnerCommand
from launcher.xgboost.knobs import XGBOOST_KNOBS

COMMAND = RunnerCommand(
    "xgboost",
    XGBOOST_KNOBS,
    help="run XGBoost workers from the DMLC_* environment (one per GPU, else one per pod) and pod 0's tracker, "
    "supervised",
    usage="trainer-launcher xgboost [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)",
)
