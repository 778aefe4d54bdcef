"""launcher.core.devices: the GPUs and the CPU quota a container really has.

This machine has no GPU, so GPUs are faked with a fake /dev tree in tmp_path (``nvidia0`` ...
plus the control nodes every GPU host also has), and the CPU quota with fake cgroup v1 and v2
trees (a fake ``/proc/self/cgroup`` and a fake ``/sys/fs/cgroup``). Nothing here reads the real
host except the last test, which fakes only the device count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.core import devices, settings
from launcher.core.devices import HostFacts, cgroup_cpu_quota, gpu_devices, probe_host, visible_gpu_count
from launcher.core.settings import HostEnv

# --- fake trees ---------------------------------------------------------------------------------


def fake_dev(tmp_path: Path, gpus: int) -> Path:
    """A /dev with ``gpus`` GPU nodes and the nodes that are not GPUs."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                                        "nvidia-modeset", "null", "zero"]:
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    return dev


def cgroup_v2(tmp_path: Path, membership: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A unified (v2) hierarchy: ``limits`` maps a cgroup path to its cpu.max."""
    proc_self_cgroup = tmp_path / "proc-self-cgroup"
    proc_self_cgroup.write_text(membership)
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for path, cpu_max in limits.items():
        directory = root / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(cpu_max + "\n")
    return proc_self_cgroup, root


def cgroup_v1(tmp_path: Path, membership: str, mount: str, limits: dict[str, tuple[str, str]]) -> tuple[Path, Path]:
    """A v1 hierarchy with the cpu controller mounted at ``mount``: path -> (quota, period)."""
    proc_self_cgroup = tmp_path / "proc-self-cgroup"
    proc_self_cgroup.write_text(membership)
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True)
    (root / mount).mkdir()
    for path, (quota, period) in limits.items():
        directory = root / mount / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.cfs_quota_us").write_text(quota + "\n")
        (directory / "cpu.cfs_period_us").write_text(period + "\n")
    return proc_self_cgroup, root


POD = "/kubepods/pod1/ctr"
V1_MEMBERSHIP = (
    "12:memory:/kubepods/pod1/ctr\n"
    "11:cpu,cpuacct:/kubepods/pod1/ctr\n"
    "3:pids:/kubepods/pod1/ctr\n"
)

# --- cgroup v2 ----------------------------------------------------------------------------------


def test_v2_leaf_quota_is_read(tmp_path):
    files = cgroup_v2(tmp_path, f"0::{POD}\n", {POD: "250000 100000", "/kubepods": "max 100000"})
    assert cgroup_cpu_quota(*files) == 2.5


def test_v2_a_tighter_ancestor_wins(tmp_path):
    files = cgroup_v2(tmp_path, f"0::{POD}\n", {POD: "400000 100000", "/kubepods/pod1": "150000 100000"})
    assert cgroup_cpu_quota(*files) == 1.5


def test_v2_max_everywhere_is_unlimited(tmp_path):
    files = cgroup_v2(tmp_path, f"0::{POD}\n",
                      {POD: "max 100000", "/kubepods/pod1": "max 100000", "/kubepods": "max 100000"})
    assert cgroup_cpu_quota(*files) is None


def test_v2_container_namespace_reads_the_mount_root(tmp_path):
    """With a cgroup namespace the path is "/" and the mount root is the container's own cgroup."""
    files = cgroup_v2(tmp_path, "0::/\n", {"/": "200000 100000"})
    assert cgroup_cpu_quota(*files) == 2.0


def test_v2_no_cpu_max_files_is_unlimited(tmp_path):
    files = cgroup_v2(tmp_path, f"0::{POD}\n", {})
    assert cgroup_cpu_quota(*files) is None


def test_v2_with_a_different_period(tmp_path):
    files = cgroup_v2(tmp_path, f"0::{POD}\n", {POD: "50000 50000"})
    assert cgroup_cpu_quota(*files) == 1.0


def test_missing_proc_self_cgroup_is_unlimited(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent-root") is None


# --- cgroup v1 ----------------------------------------------------------------------------------


def test_v1_cpu_cpuacct_quota_is_read(tmp_path):
    files = cgroup_v1(tmp_path, V1_MEMBERSHIP, "cpu,cpuacct", {POD: ("150000", "100000")})
    assert cgroup_cpu_quota(*files) == 1.5


def test_v1_minus_one_is_unlimited(tmp_path):
    files = cgroup_v1(tmp_path, V1_MEMBERSHIP, "cpu,cpuacct", {POD: ("-1", "100000"), "/kubepods": ("-1", "100000")})
    assert cgroup_cpu_quota(*files) is None


def test_v1_a_tighter_ancestor_wins(tmp_path):
    files = cgroup_v1(tmp_path, V1_MEMBERSHIP, "cpu,cpuacct",
                      {POD: ("-1", "100000"), "/kubepods/pod1": ("300000", "100000")})
    assert cgroup_cpu_quota(*files) == 3.0


def test_v1_separate_cpu_mount(tmp_path):
    membership = "5:cpuacct:/kubepods/pod1/ctr\n4:cpu:/kubepods/pod1/ctr\n"
    files = cgroup_v1(tmp_path, membership, "cpu", {POD: ("200000", "100000")})
    assert cgroup_cpu_quota(*files) == 2.0


def test_v1_without_a_cpu_controller_line_is_unlimited(tmp_path):
    files = cgroup_v1(tmp_path, "12:memory:/kubepods/pod1/ctr\n", "cpu,cpuacct", {POD: ("150000", "100000")})
    assert cgroup_cpu_quota(*files) is None


# --- GPU device nodes ---------------------------------------------------------------------------


def test_only_nvidia_n_nodes_count_as_gpus(tmp_path):
    assert gpu_devices(fake_dev(tmp_path, gpus=8)) == 8


def test_no_dev_dir_means_no_gpus(tmp_path):
    assert gpu_devices(tmp_path / "absent") == 0


@pytest.mark.parametrize(
    "nvidia_visible, cuda_visible, expected",
    [
        pytest.param(None, None, 8, id="nothing-set-all-8"),
        pytest.param("all", None, 8, id="nvidia-all"),
        pytest.param("none", None, 0, id="nvidia-none"),
        pytest.param("void", None, 0, id="nvidia-void"),
        pytest.param("", None, 0, id="nvidia-empty"),
        pytest.param("0,1", None, 2, id="nvidia-two-indices"),
        pytest.param(None, "0,1", 2, id="cuda-two-indices"),
        pytest.param(None, "", 0, id="cuda-empty-hides-all"),
        pytest.param(None, "-1", 0, id="cuda-minus-one-hides-all"),
        pytest.param(None, "0,-1,1", 1, id="cuda-stops-at-first-invalid"),
        pytest.param(None, "0,x,1", 1, id="cuda-stops-at-first-non-number"),
        pytest.param(None, "GPU-abc,GPU-def", 2, id="cuda-uuids"),
        pytest.param(None, "MIG-4f0e,MIG-77aa,MIG-9b01", 3, id="cuda-mig-uuids"),
        pytest.param(None, " 0, 1 ,2 ", 3, id="cuda-spaces-around-items"),
        pytest.param(None, ",".join(str(i) for i in range(12)), 8, id="cuda-more-than-there-are"),
        pytest.param("all", "3", 1, id="both-set-narrowest-wins"),
        pytest.param("0,1", "0,1,2,3", 2, id="nvidia-narrower-than-cuda"),
    ],
)
def test_visible_gpus_on_an_8_gpu_node(tmp_path, nvidia_visible, cuda_visible, expected):
    dev = fake_dev(tmp_path, gpus=8)
    assert visible_gpu_count(cuda_visible, nvidia_visible, dev) == expected


@pytest.mark.parametrize("nvidia_visible", ["all", "0", "GPU-abc"])
def test_a_cuda_base_image_on_a_cpu_node_has_no_gpus(tmp_path, nvidia_visible):
    """CUDA base images set NVIDIA_VISIBLE_DEVICES=all everywhere: the device nodes decide."""
    dev = fake_dev(tmp_path, gpus=0)
    assert visible_gpu_count("0,1", nvidia_visible, dev) == 0


# --- HostFacts ----------------------------------------------------------------------------------


def facts(quota: float | None, affinity: int) -> HostFacts:
    return HostFacts(hostname="node", gpu_count=0, cpu_quota=quota, cpu_affinity=affinity, omp_num_threads_set=False)


@pytest.mark.parametrize(
    "quota, affinity, cpus, whole",
    [
        pytest.param(None, 16, 16.0, 16, id="no-quota-is-affinity"),
        pytest.param(4.0, 16, 4.0, 4, id="quota-below-affinity"),
        pytest.param(32.0, 8, 8.0, 8, id="quota-capped-by-affinity"),
        pytest.param(1.5, 16, 1.5, 1, id="one-and-a-half-is-one-whole"),
        pytest.param(0.5, 16, 0.5, 1, id="half-a-cpu-is-still-one"),
        pytest.param(3.5, 2, 2.0, 2, id="affinity-below-fractional-quota"),
        pytest.param(2.9999999999, 16, 2.9999999999, 3, id="float-noise-rounds-to-whole"),
    ],
)
def test_host_cpus(quota, affinity, cpus, whole):
    host = facts(quota, affinity)
    assert host.cpus == pytest.approx(cpus)
    assert host.whole_cpus == whole


# --- probe_host with the environment as the launcher loads it -----------------------------------


@pytest.mark.parametrize(
    "cuda_visible, expected",
    [
        pytest.param("0,1", 2, id="two"),
        pytest.param("-1", 0, id="minus-one"),
        pytest.param("", 0, id="empty-hides-all"),
    ],
)
def test_probe_host_honours_cuda_visible_devices_from_the_environment(monkeypatch, cuda_visible, expected):
    """CUDA treats CUDA_VISIBLE_DEVICES="" as "no GPUs": the launcher must not start a rank per
    device node then. Only the device count is faked here."""
    monkeypatch.setattr(devices, "gpu_devices", lambda dev_root="/dev": 8)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible)

    assert probe_host(settings.load(HostEnv)).gpu_count == expected


def test_probe_host_notices_a_user_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert probe_host(settings.load(HostEnv)).omp_num_threads_set is True
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert probe_host(settings.load(HostEnv)).omp_num_threads_set is False


# --- accelerators other than whole NVIDIA GPUs (MIG, Neuron, Gaudi) ------------------------------
# None of these exist on this machine: each test builds the /dev (and /sys) a container would see.


def test_mig_devices_count_as_listed_although_they_share_one_device_node(tmp_path):
    """Two MIG slices of one A100: the container gets /dev/nvidia0 once, and both slices."""
    dev = fake_dev(tmp_path, gpus=1)
    assert visible_gpu_count(None, "MIG-4f0e1c2a-aaaa,MIG-77aa3b1c-bbbb", dev) == 2
    found = devices.nvidia_accelerators(None, "MIG-4f0e1c2a-aaaa,MIG-77aa3b1c-bbbb", dev)
    assert (found.kind, found.count) == ("NVIDIA MIG device", 2)


def test_a_gpu_uuid_in_nvidia_visible_devices_counts_on_a_gpu_node(tmp_path):
    assert visible_gpu_count(None, "GPU-1d2c3b4a-0000", fake_dev(tmp_path, gpus=8)) == 1


def fake_neuron(tmp_path: Path, devices_present: int, cores_per_device: int | None) -> tuple[Path, Path]:
    """/dev/neuronN nodes and the sysfs core_count the Neuron driver publishes for each."""
    dev, sys = tmp_path / "dev", tmp_path / "sys"
    dev.mkdir()
    for index in range(devices_present):
        (dev / f"neuron{index}").touch()
        directory = sys / "devices/virtual/neuron_device" / f"neuron{index}"
        directory.mkdir(parents=True)
        if cores_per_device is not None:
            (directory / "core_count").write_text(f"{cores_per_device}\n")
    return dev, sys


@pytest.mark.parametrize(
    "visible_cores, visible_devices, logical, expected",
    [
        pytest.param(None, None, None, 8, id="4-devices-x-2-cores"),
        pytest.param("0-3", None, None, 4, id="visible-cores-range"),
        pytest.param("1,4-5", None, None, 3, id="visible-cores-list-and-range"),
        pytest.param(None, "0,1", None, 4, id="visible-devices-narrow"),
        pytest.param(None, "ALL", None, 8, id="visible-devices-all"),
        pytest.param(None, None, "2", 4, id="two-cores-fused-into-one-logical-core"),
    ],
)
def test_neuron_cores_on_a_4_device_node(tmp_path, visible_cores, visible_devices, logical, expected):
    dev, sys = fake_neuron(tmp_path, devices_present=4, cores_per_device=2)
    found = devices.neuron_accelerators(visible_cores, visible_devices, logical, dev, sys)
    assert (found.kind, found.count) == ("Neuron core", expected)


def test_neuron_devices_without_a_readable_core_count_are_there_but_uncounted(tmp_path):
    dev, sys = fake_neuron(tmp_path, devices_present=2, cores_per_device=None)
    found = devices.neuron_accelerators(None, None, None, dev, sys)
    assert found.count is None and "unreadable" in found.how


def test_no_neuron_device_node_means_no_neuron_cores_whatever_the_variables_say(tmp_path):
    dev, sys = fake_neuron(tmp_path, devices_present=0, cores_per_device=2)
    assert devices.neuron_accelerators("0-7", "ALL", None, dev, sys) is None


def fake_gaudi(tmp_path: Path, hpus: int, legacy: bool = False) -> Path:
    dev = tmp_path / "dev"
    (dev / "accel").mkdir(parents=True)
    for index in range(hpus):
        if legacy:
            (dev / f"hl{index}").touch()
            (dev / f"hl_controlD{index}").touch()
        else:
            (dev / "accel" / f"accel{index}").touch()
            (dev / "accel" / f"accel_controlD{index}").touch()
    return dev


@pytest.mark.parametrize(
    "visible, legacy, expected",
    [
        pytest.param(None, False, 8, id="accel-class-nodes"),
        pytest.param("all", False, 8, id="habana-all"),
        pytest.param("0,1", False, 2, id="habana-two-indices"),
        pytest.param(None, True, 8, id="older-driver-hl-nodes"),
    ],
)
def test_gaudi_hpus_on_an_8_hpu_node(tmp_path, visible, legacy, expected):
    found = devices.gaudi_accelerators(visible, fake_gaudi(tmp_path, 8, legacy))
    assert (found.kind, found.count) == ("Gaudi HPU", expected)


def test_habana_none_hides_every_hpu(tmp_path):
    assert devices.gaudi_accelerators("none", fake_gaudi(tmp_path, 8)) is None


def test_probe_host_reads_the_neuron_variables_from_the_environment(monkeypatch, tmp_path):
    """Only the roots are faked: the variables travel the real way, through HostEnv."""
    dev, sys = fake_neuron(tmp_path, devices_present=2, cores_per_device=2)
    real = devices.neuron_accelerators
    monkeypatch.setattr(devices, "gpu_devices", lambda dev_root="/dev": 0)
    monkeypatch.setattr(devices, "neuron_accelerators", lambda *variables: real(*variables, dev_root=dev, sys_root=sys))
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-2")

    host = probe_host(settings.load(HostEnv))

    assert host.gpu_count == 0
    assert (host.accelerators.kind, host.accelerators.count) == ("Neuron core", 3)
