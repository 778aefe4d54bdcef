"""`trainer-launcher smoke` on this machine's CPU, for real (the GPU path ran on a lent H100:
figures in the README)."""

from __future__ import annotations

import json
import subprocess

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
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["CPU quota vs nproc"]["status"] in ("pass", "warn")
    assert checks["gloo all-reduce, 2 local ranks"]["status"] == "pass"
    assert checks["gloo all-reduce, 2 local ranks"]["value"].startswith("correct")
    assert float(checks["CPU fp32 matmul"]["value"].split()[0].replace(",", "")) > 0
    assert report["exitCode"] == 0


def test_a_node_below_a_performance_threshold_is_retryable_138(tmp_path):
    result = smoke(tmp_path, "--json", "--min-matmul-gflops", "100000000", "--min-shm-gb", "0.01")
    assert result.returncode == 138, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["CPU fp32 matmul"]["status"] == "fail" and checks["CPU fp32 matmul"]["kind"] == "node"
    message = json.loads((tmp_path / "termination.json").read_text())
    assert message["reason"] == "NodeFault" and message["retryable"] is True


def test_a_misconfigured_pod_is_permanent_2(tmp_path):
    result = smoke(tmp_path, "--min-shm-gb", "100000000")
    assert result.returncode == 2, result.stderr
    assert json.loads((tmp_path / "termination.json").read_text())["reason"] == "Misconfigured"


@pytest.mark.skipif(not IS_ROOT, reason="needs root for a private resolver (unshare)")
def test_a_master_address_that_does_not_resolve_fails_the_preflight(tmp_path):
    result = smoke(tmp_path, "--min-shm-gb", "0.01", private_names=True, PET_MASTER_ADDR="no-such-master.invalid")
    assert result.returncode == 138
    line = next(row for row in result.stdout.splitlines() if row.startswith("master address resolves"))
    assert "FAIL" in line and "no-such-master.invalid" in line


def test_a_bad_threshold_is_one_line_exit_2(tmp_path):
    result = smoke(tmp_path, "--min-free-gb", "lots")
    assert_one_line_naming(result, "--min-free-gb", "lots")
