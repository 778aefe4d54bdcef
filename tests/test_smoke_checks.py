"""The GPU checks against their model's floors. No GPU here (none was lent for issue 14): the
measurements are replaced by a stand-in that returns figures measured on a real H100 80GB HBM3
(787.9 TFLOP/s bf16 at 8192^3, 3,002 GB/s device copy: docs/smoke.md, "What ran where"), or degraded ones.
What is tested is everything around them: the floors each GPU is held to and where they come
from, which GPU or pair is named, the sizes each level asks for."""

from __future__ import annotations

import pytest

from launcher.core import settings
from launcher.core.settings import Override
from launcher.smoke import probes, skus, thresholds
from launcher.smoke.job import gpu_checks, outcome_of
from launcher.smoke.settings import SmokeSettings

H100 = {"bf16": 787.9, "copy": 3002.0, "h2d": 55.1, "d2h": 54.8, "p2p": 361.0, "busbw": 481.0}


class StandIn:
    """The probes' GPU functions, with figures per GPU; records what it was asked."""

    def __init__(self, gpus: int, **changed: dict):
        self.figures = {d: dict(H100) for d in range(gpus)}
        for key, per_gpu in changed.items():
            for device, value in per_gpu.items():
                self.figures[device][key] = value
        self.no_peer: set[tuple[int, int]] = set()
        self.correct = True
        self.asked: dict[str, object] = {}

    def gpu_bf16_tflops(self, devices, seconds):
        self.asked["matmul_seconds"] = seconds
        return {d: self.figures[d]["bf16"] for d in devices}

    def gpu_copy_gbps(self, device, nbytes):
        self.asked["copy_bytes"] = nbytes
        return self.figures[device]["copy"]

    def gpu_host_copy_gbps(self, device, nbytes):
        self.asked["host_bytes"] = nbytes
        return self.figures[device]["h2d"], self.figures[device]["d2h"]

    def gpu_peer_gbps(self, devices, nbytes):
        found = {}
        for s in devices:
            for t in devices:
                if s != t:
                    slow = (s, t) in self.no_peer
                    found[(s, t)] = (22.0 if slow else min(self.figures[s]["p2p"], self.figures[t]["p2p"]), not slow)
        return found

    def allreduce(self, world, backend, nbytes, iterations):
        self.asked["allreduce"] = (backend, nbytes, iterations)
        return 0.03, self.correct, min(f["busbw"] for f in self.figures.values())


def checks(stand_in: StandIn, gpus: int = 8, level: str = "quick", sku=skus.H100_SXM, overrides=None, **env):
    smoke = settings.load(SmokeSettings, overrides or {})
    floors = thresholds.gpu_floors(smoke, sku, gpus, overrides)
    return {c.name.split(",")[0]: c for c in gpu_checks(probes.LEVELS[level], floors, gpus, stand_in)}


def test_a_healthy_h100_node_passes_its_models_floors_with_their_sources():
    found = checks(StandIn(8))
    assert {name: c.status for name, c in found.items()} == dict.fromkeys(
        ["GPU bf16 matmul 8192^3", "GPU device-to-device copy", "GPU host<->device copy (pinned)",
         "GPU peer-to-peer copy", "NCCL all-reduce"], "pass")
    bf16 = found["GPU bf16 matmul 8192^3"]
    assert (bf16.value, bf16.threshold, bf16.op) == (787.9, 560, ">=") and bf16.source.startswith("H100 SXM:")
    assert found["GPU device-to-device copy"].threshold == 1900
    assert found["NCCL all-reduce"].threshold == 460 and found["NCCL all-reduce"].detail == "4 GiB messages"
    assert found["GPU host<->device copy (pinned)"].value == 54.8  # the slower direction


def test_one_degraded_gpu_fails_its_node_naming_it_though_a_generic_floor_would_pass_it():
    # A throttled H100 at 420 TFLOP/s clears the old generic 100 but not the H100's 560.
    found = checks(StandIn(8, bf16={3: 420.0}, copy={5: 1450.0}))
    bf16, copy = found["GPU bf16 matmul 8192^3"], found["GPU device-to-device copy"]
    assert bf16.status == "fail" and bf16.value == 420.0 and bf16.detail == "below 560 TFLOP/s: GPU 3 420.0"
    assert copy.status == "fail" and copy.detail == "below 1900 GB/s: GPU 5 1,450.0"
    assert checks(StandIn(8, bf16={3: 420.0}), sku=skus.GENERIC)["GPU bf16 matmul 8192^3"].status == "pass"
    outcome = outcome_of(list(found.values()))
    assert outcome.exit_code == 138 and "GPU 3 420.0" in outcome.message


def test_a_pair_without_peer_access_fails_the_nvlink_floor_and_is_named():
    stand_in = StandIn(8)
    stand_in.no_peer = {(2, 6)}
    check = checks(stand_in)["GPU peer-to-peer copy"]
    assert check.status == "fail" and "GPU 2->6 22.0" in check.detail and "no peer access: 2->6" in check.detail


def test_a_wrong_all_reduce_sum_fails_whatever_its_speed():
    stand_in = StandIn(8)
    stand_in.correct = False
    check = checks(stand_in)["NCCL all-reduce"]
    assert check.status == "fail" and check.detail.startswith("WRONG SUM")


def test_the_models_all_reduce_floor_is_for_8_gpus_fewer_get_the_generic_one():
    check = checks(StandIn(4, busbw={0: 120.0}), gpus=4)["NCCL all-reduce"]
    assert check.status == "pass" and check.threshold == 10 and "is for 8 GPUs" in check.source


def test_a_flag_or_variable_overrides_the_models_floor_and_is_named(monkeypatch):
    monkeypatch.setenv("LAUNCHER_SMOKE_MIN_BF16_TFLOPS", "800")
    found = checks(StandIn(8), overrides={"min_copy_gbps": Override("3500", "--min-copy-gbps")})
    assert (found["GPU bf16 matmul 8192^3"].threshold, found["GPU bf16 matmul 8192^3"].source) == (
        800, "LAUNCHER_SMOKE_MIN_BF16_TFLOPS")
    assert (found["GPU device-to-device copy"].status, found["GPU device-to-device copy"].source) == (
        "fail", "--min-copy-gbps")


def test_one_gpu_skips_the_pairs_and_the_all_reduce():
    found = checks(StandIn(1), gpus=1)
    assert found["GPU peer-to-peer copy"].status == found["NCCL all-reduce"].status == "skip"


@pytest.mark.parametrize("level, seconds, nccl", [("quick", 1.0, (4 << 30, 5)), ("long", 30.0, (16 << 30, 20))])
def test_the_long_level_measures_longer_with_multi_gb_messages(level, seconds, nccl):
    stand_in = StandIn(8)
    checks(stand_in, level=level)
    assert stand_in.asked["matmul_seconds"] == seconds
    assert stand_in.asked["allreduce"] == ("nccl", *nccl)
