"""The preflight's measurements that need torch (imported only here, only by `smoke`).

GPU timings use CUDA events on the device that does the work, so a copy or matmul is timed on
the GPU it ran on, not on GPU 0's clock. None of this runs without a GPU here: the checks that
use it are tested with these functions replaced (tests/test_smoke_checks.py), and on a lent GPU
machine for real (docs/smoke.md).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Level:
    matmul_seconds: float  # per GPU, all GPUs at once
    copy_bytes: int  # device-to-device
    host_bytes: int  # host<->device, and each peer-to-peer pair
    allreduce_bytes: int  # NCCL, over the node's GPUs
    allreduce_iterations: int
    gloo_bytes: int  # CPU-only nodes


LEVELS = {
    "quick": Level(1.0, 1 * GIB, 256 * MIB, 4 * GIB, 5, 4 * MIB),
    "long": Level(30.0, 4 * GIB, 1 * GIB, 16 * GIB, 20, 64 * MIB),
}


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


def _allreduce_rank(rank: int, world: int, port: int, backend: str, numel: int, iterations: int, results) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    # One buffer, checked first and then timed: a multi-GB message leaves no room for two.
    tensor = torch.full((numel,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    correct = bool(torch.all(tensor == world * (world + 1) / 2).item())
    tensor.fill_(1.0 / world)  # stays finite however many times it is summed
    sync = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
    seconds = _timed(lambda: dist.all_reduce(tensor), iterations, sync)
    if rank == 0:
        results.put((seconds, correct))
    dist.barrier()
    dist.destroy_process_group()


def allreduce(world: int, backend: str, nbytes: int, iterations: int = 5) -> tuple[float, bool, float]:
    """(seconds per all-reduce, correct?, bus bandwidth GB/s as nccl-tests counts it)."""
    import torch.multiprocessing as mp

    numel = max(1, nbytes // 4)
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(
        _allreduce_rank,
        args=(world, _free_port(), backend, numel, iterations, results),
        nprocs=world,
        start_method="spawn",
    )
    seconds, correct = results.get(timeout=600)
    busbw = (numel * 4) * 2 * (world - 1) / world / seconds / 1e9 if world > 1 else 0.0
    return seconds, correct, busbw


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_bf16_tflops(devices: list[int], seconds: float, n: int = 8192, batch: int = 10) -> dict[int, float]:
    """Every GPU multiplies at once (as in training: shared power and cooling) for ``seconds``;
    per GPU, the median rate of its batches, timed on that GPU."""
    import torch

    operands = {
        d: (
            torch.randn(n, n, device=f"cuda:{d}", dtype=torch.bfloat16),
            torch.randn(n, n, device=f"cuda:{d}", dtype=torch.bfloat16),
        )
        for d in devices
    }
    for a, b in operands.values():
        a @ b  # warm-up: kernels chosen, clocks up
    for d in devices:
        torch.cuda.synchronize(d)
    rates: dict[int, list[float]] = {d: [] for d in devices}
    deadline = time.perf_counter() + seconds
    while True:
        timed = []
        for d, (a, b) in operands.items():
            with torch.cuda.device(d):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(batch):
                    a @ b
                end.record()
                timed.append((d, start, end))
        for d, start, end in timed:
            end.synchronize()
            rates[d].append(batch * 2 * n**3 / (start.elapsed_time(end) / 1e3) / 1e12)
        if time.perf_counter() >= deadline:
            return {d: statistics.median(found) for d, found in rates.items()}


def _copy_gbps(target, source, device: int, counted_bytes: int, iterations: int = 5) -> float:
    import torch

    with torch.cuda.device(device):
        target.copy_(source, non_blocking=True)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
    return iterations * counted_bytes / (start.elapsed_time(end) / 1e3) / 1e9


def gpu_copy_gbps(device: int, nbytes: int) -> float:
    """Device-to-device copy on one GPU, counting bytes read and written."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    target = torch.empty_like(source)
    return _copy_gbps(target, source, device, 2 * nbytes)


def gpu_host_copy_gbps(device: int, nbytes: int) -> tuple[float, float]:
    """(host to device, device to host), pinned host memory."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    return _copy_gbps(gpu, host, device, nbytes), _copy_gbps(host, gpu, device, nbytes)


def gpu_peer_gbps(devices: list[int], nbytes: int) -> dict[tuple[int, int], tuple[float, bool]]:
    """{(source, target): (GB/s, peer access?)} for every ordered pair. A pair without peer access
    is still measured (the copy then goes through the host), so it fails a NVLink floor."""
    import torch

    buffers = {d: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in devices}
    found = {}
    for source in devices:
        for target in devices:
            if source != target:
                access = torch.cuda.can_device_access_peer(source, target)
                found[(source, target)] = (_copy_gbps(buffers[target], buffers[source], source, nbytes), access)
    return found


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
