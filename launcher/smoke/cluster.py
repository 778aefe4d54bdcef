"""The cross-node preflight, run as the job's program on every rank:
``trainer-launcher torch -- -m launcher.smoke`` (or ``local --nnodes N -- -m launcher.smoke``).

Two checks a single node cannot make:
- one all-reduce over every rank of every node: the fabric carries it and the sum is right;
- every pair of nodes, in rounds (each node in at most one pair per round, both directions at
  once): a node whose best pair is far below the other nodes' is slow, and named by hostname,
  however it is slow (a bad NIC or cable, a throttled CPU, a noisy neighbour).

Pure parts (the rounds, the verdicts) are separate from the torch calls, so they can be tested
without a job.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from launcher.smoke.result import FAIL, PASS, SKIP, Check, Threshold, sum_check


@dataclass(frozen=True)
class PairLevel:
    nbytes: int
    iterations: int
    allreduce_bytes: int


PAIR_LEVELS = {"quick": PairLevel(64 << 20, 5, 64 << 20), "long": PairLevel(1 << 30, 10, 1 << 30)}


def rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``nodes`` exactly once, in rounds where no node is in two pairs (the circle
    method: N-1 rounds for even N, N for odd)."""
    if nodes < 2:
        return []
    seats = list(range(nodes)) + ([None] if nodes % 2 else [])
    found = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [
            (a, b) for a, b in zip(seats[:half], reversed(seats[half:]), strict=True) if a is not None and b is not None
        ]
        found.append([(a, b) if a < b else (b, a) for a, b in pairs])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return found


def pair_checks(
    hosts: list[str], pairs: dict[tuple[int, int], float], floor: Threshold, ratio: Threshold
) -> list[Check]:
    """The verdicts on node pairs (GB/s per direction, keyed by node index): any pair below the
    floor fails and names both hosts; with 3 nodes or more, a node whose best pair is below
    ``ratio`` of the median of every node's best is slow, and named."""
    if not pairs:
        return [Check("node-to-node bandwidth", SKIP, detail="one node: no pair")]
    slowest_pair = min(pairs, key=lambda pair: pairs[pair])
    low = [f"{hosts[a]} <-> {hosts[b]} {gbps:,.2f}" for (a, b), gbps in sorted(pairs.items()) if gbps < floor.value]
    checks = [
        Check(
            "node pairs",
            FAIL if low else PASS,
            pairs[slowest_pair],
            floor.value,
            "GB/s",
            floor.source,
            op=">=",
            detail=(f"below {floor.value:g} GB/s: " + ", ".join(low))
            if low
            else f"slowest: {hosts[slowest_pair[0]]} <-> {hosts[slowest_pair[1]]}",
        )
    ]
    if len(hosts) < 3:
        checks.append(
            Check(
                "slow node",
                SKIP,
                detail="2 nodes: a slow node cannot be told from its peer (the pair floor still applies)",
            )
        )
        return checks
    best = {node: max(g for pair, g in pairs.items() if node in pair) for node in range(len(hosts))}
    median = statistics.median(best.values())
    limit = ratio.value * median
    source = f"{ratio.value:g} x the nodes' median best pair ({median:,.2f} GB/s); ratio: {ratio.source}"
    for node, value in best.items():
        own = ", ".join(
            f"to {hosts[b if a == node else a]} {g:,.2f}" for (a, b), g in sorted(pairs.items()) if node in (a, b)
        )
        checks.append(
            Check(
                "node-to-node bandwidth",
                PASS if value >= limit else FAIL,
                value,
                round(limit, 2),
                "GB/s",
                source,
                op=">=",
                detail=f"best pair; {own}",
                node=hosts[node],
            )
        )
    return checks


def _exchange(dist, both: list) -> None:
    for request in dist.batch_isend_irecv(both):
        request.wait()


def measure(level: PairLevel) -> tuple[list[str], list[Check] | None, dict[tuple[int, int], float]]:
    """Run on every rank of the job: (node hostnames, the all-reduce check on rank 0 else None,
    the pairs' GB/s on rank 0 else {})."""
    import os
    import socket
    import time

    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    # torchrun's own per-rank variables, read as every training script reads them.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
    try:
        # Who leads each node (its local rank 0), in node order.
        me = (int(os.environ.get("GROUP_RANK", "0")), local_rank, rank, socket.gethostname())
        everyone: list = [None] * world
        dist.all_gather_object(everyone, me)
        leaders = sorted((node, r, host) for node, lr, r, host in everyone if lr == 0)
        hosts = [host for _, _, host in leaders]
        my_node = next((i for i, (_, r, _) in enumerate(leaders) if r == rank), None)

        numel = max(1, level.allreduce_bytes // 4)
        tensor = torch.full((numel,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        sync()
        correct = bool(torch.all(tensor == world * (world + 1) / 2).item())
        tensor.fill_(1.0 / world)
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        seconds = time.perf_counter() - started
        busbw = numel * 4 * 2 * (world - 1) / world / seconds / 1e9 if world > 1 else 0.0
        verdicts: list = [None] * world
        dist.all_gather_object(verdicts, correct)
        all_correct = all(verdicts)

        out = torch.empty(level.nbytes, dtype=torch.uint8, device=device)
        back = torch.empty_like(out)
        mine: dict[tuple[int, int], float] = {}
        for pairs in rounds(len(hosts)):
            dist.barrier()
            for a, b in pairs:
                if my_node not in (a, b):
                    continue
                peer = leaders[b if my_node == a else a][1]
                # Grouped, so NCCL posts the send and the receive together (two separate
                # sends, each waiting for its receive, would deadlock).
                both = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, back, peer)]
                _exchange(dist, both)  # warm-up
                sync()
                started = time.perf_counter()
                for _ in range(level.iterations):
                    _exchange(dist, both)
                sync()
                mine[(a, b)] = level.nbytes * level.iterations / (time.perf_counter() - started) / 1e9
        dist.barrier()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        pairs_seen: dict[tuple[int, int], float] = {}
        for found in gathered:
            for pair, gbps in found.items():  # both ends timed it: the slower says more
                pairs_seen[pair] = min(gbps, pairs_seen.get(pair, gbps))
        if rank != 0:
            return hosts, None, {}
        return (
            hosts,
            [
                sum_check(
                    f"all-reduce over {len(hosts)} nodes, {world} ranks",
                    all_correct,
                    round(busbw, 2),
                    "GB/s busbw",
                    f"{level.allreduce_bytes / (1 << 20):g} MiB",
                )
            ],
            pairs_seen,
        )
    finally:
        dist.destroy_process_group()
