"""The preflight's knobs: LAUNCHER_SMOKE_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

_BY_MODEL = "(default: the GPU model's floor, launcher/smoke/skus.py)"

NODE_KNOBS: dict[str, Knob] = {
    "level": Knob(
        "LAUNCHER_SMOKE_LEVEL",
        "--level",
        "quick (default: seconds, for every pod's init container) or long (multi-GB NCCL, 30 s matmul)",
    ),
    "min_shm_gb": Knob("LAUNCHER_SMOKE_MIN_SHM_GB", "--min-shm-gb", "fail below this /dev/shm size (default 1)"),
    "min_free_gb": Knob(
        "LAUNCHER_SMOKE_MIN_FREE_GB", "--min-free-gb", "warn below this free space on /workspace (default 10)"
    ),
    "min_matmul_gflops": Knob(
        "LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS", "--min-matmul-gflops", "fail below this fp32 CPU matmul rate (default 1)"
    ),
    "min_bf16_tflops": Knob(
        "LAUNCHER_SMOKE_MIN_BF16_TFLOPS",
        "--min-bf16-tflops",
        f"fail below this bf16 GPU matmul rate per GPU {_BY_MODEL}",
    ),
    "min_copy_gbps": Knob(
        "LAUNCHER_SMOKE_MIN_COPY_GBPS",
        "--min-copy-gbps",
        f"fail below this device-to-device copy rate per GPU, GB/s read+write {_BY_MODEL}",
    ),
    "min_busbw_gbps": Knob(
        "LAUNCHER_SMOKE_MIN_BUSBW_GBPS",
        "--min-busbw-gbps",
        f"fail below this NCCL all-reduce bus bandwidth over the node's GPUs, GB/s {_BY_MODEL}",
    ),
    "min_h2d_gbps": Knob(
        "LAUNCHER_SMOKE_MIN_H2D_GBPS",
        "--min-h2d-gbps",
        f"fail below this pinned host<->device copy rate, either direction, GB/s {_BY_MODEL}",
    ),
    "min_p2p_gbps": Knob(
        "LAUNCHER_SMOKE_MIN_P2P_GBPS",
        "--min-p2p-gbps",
        f"fail below this peer-to-peer copy rate between any two GPUs, GB/s {_BY_MODEL}",
    ),
    "max_gpu_temp_c": Knob(
        "LAUNCHER_SMOKE_MAX_GPU_TEMP_C",
        "--max-gpu-temp-c",
        "fail above this GPU temperature (default: each GPU's maximum operating temperature)",
    ),
    "xid_window": Knob(
        "LAUNCHER_SMOKE_XID_WINDOW", "--xid-window", "how far back the kernel log's GPU XID errors count (default 24h)"
    ),
}
# Only the cross-node preflight (python -m launcher.smoke) reads these.
CLUSTER_KNOBS: dict[str, Knob] = {
    "min_node_gbps": Knob(
        "LAUNCHER_SMOKE_MIN_NODE_GBPS", "--min-node-gbps", "fail a node pair below this bandwidth, GB/s (default 1)"
    ),
    "slow_node_ratio": Knob(
        "LAUNCHER_SMOKE_SLOW_NODE_RATIO",
        "--slow-node-ratio",
        "fail a node whose best pair is below this share of the nodes' median (default 0.5)",
    ),
}
SMOKE_KNOBS: dict[str, Knob] = {**NODE_KNOBS, **CLUSTER_KNOBS}
