"""The smoke test's thresholds: LAUNCHER_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

# The smoke test's thresholds (trainer-launcher smoke).
SMOKE_KNOBS: dict[str, Knob] = {
    "min_shm_gb": Knob("LAUNCHER_SMOKE_MIN_SHM_GB", "--min-shm-gb", "fail below this /dev/shm size (default 1)"),
    "min_free_gb": Knob("LAUNCHER_SMOKE_MIN_FREE_GB", "--min-free-gb", "warn below this free space on /workspace (default 10)"),
    "min_matmul_gflops": Knob("LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS", "--min-matmul-gflops",
                              "fail below this fp32 CPU matmul rate (default 1)"),
    "min_bf16_tflops": Knob("LAUNCHER_SMOKE_MIN_BF16_TFLOPS", "--min-bf16-tflops",
                            "fail below this bf16 GPU matmul rate per GPU (default 100)"),
    "min_copy_gbps": Knob("LAUNCHER_SMOKE_MIN_COPY_GBPS", "--min-copy-gbps",
                          "fail below this device-to-device copy rate per GPU, GB/s read+write (default 500)"),
    "min_busbw_gbps": Knob("LAUNCHER_SMOKE_MIN_BUSBW_GBPS", "--min-busbw-gbps",
                           "fail below this NCCL all-reduce bus bandwidth, GB/s (default 10)"),
}
