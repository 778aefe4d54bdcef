"""The smoke test's measurements that need torch (imported only here, only by `smoke`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time


def _timed(function, iterations: int, synchronize=lambda: None) -> float:
    function()  # warm-up
    synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        function()
    synchronize()
    return (time.perf_counter() - start) / iterations


def cpu_matmul_gflops(n: int = 1024) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _timed(lambda: a @ b, 10) / 1e9


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _allreduce_rank(rank: int, world: int, port: int, backend: str, numel: int, results) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    tensor = torch.full((numel,), float(rank + 1), device=device)
    sync = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
    seconds = _timed(lambda: dist.all_reduce(tensor), 5, sync)
    check = torch.full((numel,), float(rank + 1), device=device)
    dist.all_reduce(check)
    correct = bool(torch.all(check == world * (world + 1) / 2).item())
    if rank == 0:
        results.put((seconds, correct))
    dist.barrier()
    dist.destroy_process_group()


def allreduce(world: int, backend: str, numel: int = 1 << 22) -> tuple[float, bool, float]:
    """(seconds per all-reduce, correct?, bus bandwidth GB/s as nccl-tests counts it)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_allreduce_rank, args=(world, _free_port(), backend, numel, results), nprocs=world,
                       start_method="spawn")
    seconds, correct = results.get(timeout=60)
    busbw = (numel * 4) * 2 * (world - 1) / world / seconds / 1e9 if world > 1 else 0.0
    return seconds, correct, busbw


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_bf16_tflops(device: int, n: int = 8192) -> float:
    import torch

    a = torch.randn(n, n, device=f"cuda:{device}", dtype=torch.bfloat16)
    b = torch.randn(n, n, device=f"cuda:{device}", dtype=torch.bfloat16)
    return 2 * n**3 / _timed(lambda: a @ b, 10, torch.cuda.synchronize) / 1e12


def gpu_copy_gbps(device: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, counting bytes read and written."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    target = torch.empty_like(source)
    return 2 * nbytes / _timed(lambda: target.copy_(source), 10, torch.cuda.synchronize) / 1e9


def uncorrected_ecc_errors() -> list[int] | None:
    """Per GPU, from nvidia-smi; None when it cannot be read."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        output = subprocess.run(["nvidia-smi", "--query-gpu=ecc.errors.uncorrected.volatile.total",
                                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [line.strip() for line in output.splitlines() if line.strip()]
    return [int(v) for v in values] if values and all(v.isdigit() for v in values) else None


def disk_gb(path: str) -> float | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize / 1e9


def shm_gb() -> float | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize / 1e9
