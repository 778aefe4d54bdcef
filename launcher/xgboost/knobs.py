"""The XGBoost role's knobs: LAUNCHER_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

XGBOOST_KNOBS: dict[str, Knob] = {
    "tracker": Knob(
        "LAUNCHER_XGBOOST_TRACKER",
        "--xgboost-tracker",
        "who runs the RabitTracker on pod 0: launcher (a supervised process, and a `python` program runs "
        "through launcher/xgboost/run.py, which joins the collective for it), program (the program's task 0 "
        "starts it, as upstream's examples do; run as given) or auto (default: launcher for a `python ...` "
        "command, program for any other)",
    ),
    "workers_per_pod": Knob(
        "LAUNCHER_XGBOOST_WORKERS_PER_POD",
        "--xgboost-workers-per-pod",
        "worker processes per pod: auto (default: one per visible NVIDIA GPU, else 1, as Trainer counts "
        "DMLC_NUM_WORKER) or a count",
    ),
}
