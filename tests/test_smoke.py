"""`trainer-launcher smoke` on this machine's CPU, for real; the driver's view through a stand-in
nvidia-smi (a script printing a synthesized fixture: no GPU machine was lent for issue 14). The
GPU measurements are tested in tests/test_smoke_checks.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, assert_one_line_naming, clean_env, launcher, with_private_names


def smoke(tmp_path, *args, private_names=False, **env):
    full = clean_env(LAUNCHER_TERMINATION_LOG=str(tmp_path / "termination.json"), **env)
    argv = launcher("smoke", *args)
    if private_names:  # made-up names are looked up on loopback only
        argv = with_private_names(tmp_path, argv)[0]
    return subprocess.run(argv, env=full, cwd=REPO, capture_output=True, text=True, timeout=180)


def test_the_cpu_preflight_passes_and_reports_every_check_as_json(tmp_path):
    result = smoke(tmp_path, "--json", "--min-shm-gb", "0.01", PET_NPROC_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"node", "level", "gpus", "sku", "seconds", "checks", "exitCode"} <= set(report)
    assert (report["level"], report["gpus"], report["sku"], report["exitCode"]) == ("quick", 0, "generic", 0)
    for check in report["checks"]:
        assert set(check) == {"name", "status", "value", "threshold", "comparison", "unit", "source", "kind", "detail"}
        assert check["status"] in ("pass", "warn", "fail", "skip")
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["CPU quota vs nproc"]["status"] in ("pass", "warn")
    gloo = checks["gloo all-reduce, 2 local ranks"]
    assert gloo["status"] == "pass" and gloo["detail"] == "correct sum, 4 MiB" and gloo["value"] > 0
    matmul = checks["CPU fp32 matmul"]
    assert matmul["value"] > 0 and (matmul["threshold"], matmul["comparison"], matmul["unit"]) == (1, ">=", "GFLOP/s")
    assert matmul["source"] == "default"
    assert checks["/dev/shm size"]["source"] == "--min-shm-gb"
    # No driver here: every GPU health check says why it did not run.
    assert checks["GPU clock throttling"]["status"] == "skip" and "nvidia-smi" in checks["GPU clock throttling"]["detail"]


def test_the_long_level_measures_with_bigger_messages(tmp_path):
    result = smoke(tmp_path, "--json", "--min-shm-gb", "0.01", LAUNCHER_SMOKE_LEVEL="long")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    gloo = next(c for c in report["checks"] if c["name"].startswith("gloo all-reduce"))
    assert report["level"] == "long" and gloo["detail"] == "correct sum, 64 MiB"


def test_a_node_below_a_performance_threshold_is_retryable_138_naming_the_thresholds_source(tmp_path):
    result = smoke(tmp_path, "--json", "--min-shm-gb", "0.01", LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS="100000000")
    assert result.returncode == 138, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    matmul = checks["CPU fp32 matmul"]
    assert (matmul["status"], matmul["kind"], matmul["source"]) == ("fail", "node", "LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS")
    message = json.loads((tmp_path / "termination.json").read_text())
    assert message["reason"] == "NodeFault" and message["retryable"] is True
    assert message["message"].startswith("preflight failed: CPU fp32 matmul (")
    assert [c["name"] for c in message["failedChecks"]] == ["CPU fp32 matmul"]
    # The flag wins over the variable, and says so.
    result = smoke(tmp_path, "--json", "--min-shm-gb", "0.01", "--min-matmul-gflops", "0.5",
                   LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS="100000000")
    assert result.returncode == 0, result.stderr
    matmul = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "CPU fp32 matmul")
    assert (matmul["threshold"], matmul["source"]) == (0.5, "--min-matmul-gflops")


FIXTURES = Path(__file__).parent / "fixtures" / "smoke"


def with_driver(tmp_path: Path, fixture: str) -> dict[str, str]:
    """A stand-in nvidia-smi first on PATH that prints a fixture for -q -x."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{FIXTURES / fixture}'\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:{clean_env()['PATH']}"}


def test_a_throttled_node_fails_retryable_with_the_gpu_and_the_reason(tmp_path):
    result = smoke(tmp_path, "--min-shm-gb", "0.01", **with_driver(tmp_path, "throttled.xml"))
    assert result.returncode == 138, result.stderr
    assert result.stdout.startswith("node ") and "thresholds of H100 SXM" in result.stdout.splitlines()[0]
    lines = result.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("GPU clock throttling"))
    assert "FAIL" in lines[row] and "GPU 1" in lines[row + 1] and "HW thermal slowdown" in lines[row + 1]
    message = json.loads((tmp_path / "termination.json").read_text())
    assert (message["exitCode"], message["reason"], message["sku"]) == (138, "NodeFault", "H100 SXM")
    assert "GPU clock throttling (1 GPUs: GPU 1" in message["message"]
    [failed] = message["failedChecks"]
    assert failed["name"] == "GPU clock throttling" and "HW thermal slowdown" in failed["detail"]


def test_a_healthy_drivers_view_passes(tmp_path):
    result = smoke(tmp_path, "--json", "--min-shm-gb", "0.01", **with_driver(tmp_path, "h100-sxm.xml"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sku"] == "H100 SXM"
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["GPU clock throttling"] == statuses["GPU temperature"] == statuses["GPU row remapping"] == "pass"


def test_a_misconfigured_pod_is_permanent_2(tmp_path):
    result = smoke(tmp_path, "--min-shm-gb", "100000000")
    assert result.returncode == 2, result.stderr
    assert json.loads((tmp_path / "termination.json").read_text())["reason"] == "Misconfigured"


@pytest.mark.skipif(not IS_ROOT, reason="needs root for a private resolver (unshare)")
def test_a_master_address_that_does_not_resolve_fails_the_preflight(tmp_path):
    result = smoke(tmp_path, "--min-shm-gb", "0.01", private_names=True, PET_MASTER_ADDR="no-such-master.invalid")
    assert result.returncode == 138
    lines = result.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("master address resolves"))
    assert "FAIL" in lines[row] and "no-such-master.invalid" in lines[row + 1]


@pytest.mark.parametrize("args, env, named, value", [
    (("--min-free-gb", "lots"), {}, "--min-free-gb", "lots"),
    (("--level", "thorough"), {}, "--level", "thorough"),
    ((), {"LAUNCHER_SMOKE_LEVEL": "thorough"}, "LAUNCHER_SMOKE_LEVEL", "thorough"),
    ((), {"LAUNCHER_SMOKE_SLOW_NODE_RATIO": "2"}, "LAUNCHER_SMOKE_SLOW_NODE_RATIO", "2"),
    ((), {"LAUNCHER_SMOKE_XID_WINDOW": "yesterday"}, "LAUNCHER_SMOKE_XID_WINDOW", "yesterday"),
])
def test_a_bad_setting_is_one_line_exit_2(tmp_path, args, env, named, value):
    result = smoke(tmp_path, *args, **env)
    assert_one_line_naming(result, named, value)
