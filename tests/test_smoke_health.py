"""The node's health as the driver, the kernel log and sysfs report it, read from fixtures
(synthesized: no GPU machine was lent, see tests/fixtures/smoke/README.md) and from real
processes standing in for nvidia-smi and dmesg (a hung one, a failing one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.smoke import health, kernel, nvidia, rdma, skus
from launcher.smoke.result import FAIL, PASS, SKIP, WARN, Threshold

FIXTURES = Path(__file__).parent / "fixtures" / "smoke"
HEALTHY = ["h100-sxm.xml", "h200-sxm.xml", "h200-sxm-real.xml", "h100-pcie.xml", "h100-nvl.xml", "h200-nvl.xml", "a100-sxm4-40gb.xml",
           "a100-sxm4-80gb.xml", "a100-pcie-40gb.xml", "a100-pcie-80gb.xml", "l40s.xml", "l4.xml"]
NO_XIDS = kernel.XidLog([], "", "/dev/kmsg", 86400)
NO_PORTS = rdma.PortScan(reason="no RDMA devices")


def inventory(name: str) -> nvidia.Inventory:
    return nvidia.parse((FIXTURES / name).read_text(), name)


def checks_of(name: str, xids=NO_XIDS, ports=NO_PORTS, max_temp=None) -> dict[str, object]:
    found = inventory(name)
    return {c.name: c for c in health.health_checks(found, xids, ports, skus.node_sku(found.gpus), max_temp)}


@pytest.mark.parametrize("fixture", HEALTHY)
def test_a_healthy_node_of_every_model_passes_every_health_check(fixture):
    checks = checks_of(fixture)
    assert list(checks) == list(health.NAMES)
    for name in (health.THROTTLE, health.TEMPERATURE, health.ROW_REMAPPING, health.ECC):
        assert checks[name].status == PASS, (fixture, checks[name])
    assert checks[health.RDMA].status == SKIP


def test_hw_thermal_slowdown_fails_and_the_power_cap_does_not():
    check = checks_of("throttled.xml")[health.THROTTLE]
    assert check.status == FAIL and check.value == 1
    assert "GPU 1" in check.detail and "HW thermal slowdown" in check.detail
    assert "GPU 0" not in check.detail  # at its power cap: benign


def test_a_gpu_above_its_maximum_operating_temperature_fails_naming_it():
    checks = checks_of("hot.xml")
    assert checks[health.TEMPERATURE].status == FAIL and "GPU 0" in checks[health.TEMPERATURE].detail
    assert checks[health.TEMPERATURE].source.startswith("the GPU's maximum operating temperature")
    assert checks[health.MEMORY_TEMPERATURE].status == FAIL and "GPU 1" in checks[health.MEMORY_TEMPERATURE].detail


def test_temperatures_given_as_margins_to_tlimit_are_read_too():
    check = checks_of("hot-tlimit.xml")[health.TEMPERATURE]
    assert check.status == FAIL and "GPU 1" in check.detail


def test_a_flag_limit_replaces_the_gpus_own_and_says_so():
    check = checks_of("h100-sxm.xml", max_temp=Threshold(20, "--max-gpu-temp-c"))[health.TEMPERATURE]
    assert check.status == FAIL and check.threshold == 20 and check.source == "--max-gpu-temp-c"


@pytest.mark.parametrize("fixture, gpu, said", [
    ("remap-pending.xml", "GPU 1", "pending"),
    ("remap-failed.xml", "GPU 0", "failed"),
])
def test_row_remapping_pending_or_failed_fails(fixture, gpu, said):
    check = checks_of(fixture)[health.ROW_REMAPPING]
    assert check.status == FAIL and gpu in check.detail and said in check.detail


def test_uncorrectable_sram_and_dram_errors_fail():
    checks = checks_of("sram.xml")
    assert checks[health.SRAM].status == FAIL and "GPU 0" in checks[health.SRAM].detail
    assert checks[health.ECC].status == FAIL and "GPU 1" in checks[health.ECC].detail


def test_a_recovery_action_fails_with_what_to_do():
    check = checks_of("recovery.xml")[health.RECOVERY]
    assert check.status == FAIL and "GPU 1" in check.detail and "reset the GPU" in check.detail


def test_the_old_driver_layout_is_read():
    checks = checks_of("old-layout.xml")
    assert checks[health.THROTTLE].status == FAIL and "GPU 1" in checks[health.THROTTLE].detail
    assert checks[health.ECC].status == FAIL
    assert checks[health.ROW_REMAPPING].status == SKIP  # no row remapping before Ampere
    assert checks[health.RECOVERY].status == SKIP


def test_xids_in_the_window_fail_or_warn_by_the_catalog_and_name_the_gpu():
    log = kernel.read_xids(86400, kmsg=str(FIXTURES / "kmsg.txt"), now_s=100000)
    assert log.readable and log.source.endswith("kmsg.txt")
    # The 79 at 10000 s is older than 24 h; the forged user-space 48 never counts.
    assert sorted(e.xid for e in log.events) == [13, 63, 79]
    found = inventory("h100-sxm.xml")
    check = health.xid_check(log, found.gpus)
    assert check.status == FAIL and check.value == 3
    assert check.detail.startswith("Xid 79 (GPU has fallen off the bus)")
    only_app = kernel.XidLog([e for e in log.events if e.xid == 13], "", "kmsg", 86400)
    assert health.xid_check(only_app).status == WARN  # the application's fault: follows the job


def test_dmesg_is_read_when_kmsg_is_not(tmp_path):
    dmesg = tmp_path / "dmesg"
    dmesg.write_text(f"#!/bin/sh\ncat {FIXTURES / 'dmesg.txt'}\n")
    dmesg.chmod(0o755)
    log = kernel.read_xids(86400, kmsg=str(tmp_path / "no-kmsg"), dmesg=(str(dmesg),), now_s=100000)
    assert log.source == str(dmesg) and sorted(e.xid for e in log.events) == [13, 63, 79]


def test_an_unreadable_kernel_log_is_a_skip_with_both_reasons(tmp_path):
    log = kernel.read_xids(86400, kmsg=str(tmp_path / "no-kmsg"), dmesg=(str(tmp_path / "no-dmesg"),))
    check = health.xid_check(log)
    assert check.status == SKIP and "no-kmsg" in check.detail and "no-dmesg not found" in check.detail


def make_port(root: Path, device: str, port: str, state: str, phys: str, rate: str = "400 Gb/sec (4X NDR)"):
    base = root / device / "ports" / port
    base.mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    (base / "phys_state").write_text(phys + "\n")
    (base / "rate").write_text(rate + "\n")
    (base / "link_layer").write_text("InfiniBand\n")


def test_rdma_ports_down_fail_and_a_slow_one_warns(tmp_path):
    for index in range(4):
        make_port(tmp_path, f"mlx5_{index}", "1", "4: ACTIVE", "5: LinkUp")
    assert health.rdma_check(rdma.read_ports(tmp_path)).status == PASS
    make_port(tmp_path, "mlx5_4", "1", "4: ACTIVE", "5: LinkUp", rate="200 Gb/sec (4X HDR)")
    slow = health.rdma_check(rdma.read_ports(tmp_path))
    assert slow.status == WARN and "mlx5_4 port 1 at 200 Gb/sec" in slow.detail
    make_port(tmp_path, "mlx5_5", "1", "1: DOWN", "3: Disabled")
    down = health.rdma_check(rdma.read_ports(tmp_path))
    assert down.status == FAIL and (down.value, down.threshold, down.shown_threshold()) == (5, 6, ">= 6 ports ACTIVE")
    assert down.detail == "mlx5_5 port 1: DOWN (Disabled)"


def test_no_rdma_tree_is_a_skip(tmp_path):
    check = health.rdma_check(rdma.read_ports(tmp_path / "absent"))
    assert check.status == SKIP and "absent" in check.detail


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_hung_nvidia_smi_is_bounded_and_every_gpu_check_skips_with_the_reason(tmp_path):
    smi = fake_smi(tmp_path, "sleep 600 & wait")  # a grandchild holds its output open too
    found = nvidia.read((smi, "-q", "-x"), timeout=1.0)
    assert found.gpus == [] and found.reason == f"{smi} did not answer within 1 s"
    checks = {c.name: c for c in health.health_checks(found, NO_XIDS, NO_PORTS, skus.GENERIC)}
    assert all(checks[name].status == SKIP and checks[name].detail == found.reason for name in health.NAMES[:7])


def test_a_failing_nvidia_smi_says_how_it_failed(tmp_path):
    smi = fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2; exit 9")
    found = nvidia.read((smi, "-q", "-x"))
    assert found.reason.startswith(f"{smi} -q -x exited 9: NVIDIA-SMI has failed")
    assert nvidia.read((str(tmp_path / "absent"),)).reason.endswith("absent not found")
