"""Malformed environment and flags, through the real CLI.

Every case runs the command line (``trainer-launcher ...`` in this process, tests/cli_fixture.py, or
``python -m launcher ...`` for the subcommands that start processes before they validate) with a
clean environment (no PET_*, LAUNCHER_* or JOB_COMPLETION_INDEX from the caller) plus the case's
own variables, and checks what a user sees in the pod log: exit code 2, exactly one line on stderr
that names the variable or flag and repeats the bad value, nothing on stdout, and no Python
traceback.

The "program" in each case is a script that leaves a marker file when it runs, so the cases that
go through ``torch``, ``exec`` and ``local`` also prove that validation failed before anything ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import assert_one_line_naming
from launcher.core.devices import gpu_devices

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "{script}"  # replaced by a marker-writing script in each test's tmp_path
HUGE = "99999999999999999999"
LONG_HOST = ".".join(["a" * 50] * 6)  # 305 characters of valid labels: too long for DNS
TOKEN = "hf_s3cr3tT0kenValue42"
MASTER = "tj-node-0-0.tj"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    names: str = ""  # the variable or flag the error line must name
    value: str | None = None  # the bad value the line must repeat (None: the thing is unset)
    needs_no_gpu: bool = False


def plan(*after_dashdash: str) -> tuple[str, ...]:
    return ("plan", "--", *after_dashdash, SCRIPT)


def plan_env(id: str, names: str, value: str, **extra: str) -> Case:
    """``plan -- SCRIPT`` with ``names=value`` (and any extra variables) in the environment."""
    return Case(id, plan(), {names: value, **extra}, names, value)


CASES = [
    # --- PET_NNODES ---------------------------------------------------------------------------
    plan_env("nnodes-whitespace", "PET_NNODES", "   "),
    plan_env("nnodes-negative", "PET_NNODES", "-1"),
    plan_env("nnodes-zero", "PET_NNODES", "0"),
    plan_env("nnodes-non-numeric", "PET_NNODES", "abc"),
    plan_env("nnodes-huge", "PET_NNODES", HUGE),
    plan_env("nnodes-float", "PET_NNODES", "2.5"),
    plan_env("nnodes-min-above-max", "PET_NNODES", "3:2", PET_MASTER_ADDR=MASTER),
    plan_env("nnodes-min-zero", "PET_NNODES", "0:2", PET_MASTER_ADDR=MASTER),
    plan_env("nnodes-three-parts", "PET_NNODES", "1:2:3", PET_MASTER_ADDR=MASTER),
    plan_env("nnodes-empty-max", "PET_NNODES", "2:", PET_MASTER_ADDR=MASTER),
    # --- PET_NPROC_PER_NODE -------------------------------------------------------------------
    plan_env("nproc-unknown-word", "PET_NPROC_PER_NODE", "many"),
    plan_env("nproc-zero", "PET_NPROC_PER_NODE", "0"),
    plan_env("nproc-negative", "PET_NPROC_PER_NODE", "-4"),
    plan_env("nproc-float", "PET_NPROC_PER_NODE", "1.5"),
    plan_env("nproc-huge", "PET_NPROC_PER_NODE", HUGE),
    plan_env("nproc-whitespace", "PET_NPROC_PER_NODE", " "),
    Case("nproc-gpu-on-this-cpu-machine", plan(), {"PET_NPROC_PER_NODE": "gpu"},
         "PET_NPROC_PER_NODE", "gpu", needs_no_gpu=True),
    plan_env("nproc-gpu-all-hidden-by-cuda", "PET_NPROC_PER_NODE", "gpu", CUDA_VISIBLE_DEVICES="-1"),
    # --- PET_NODE_RANK / JOB_COMPLETION_INDEX -------------------------------------------------
    plan_env("node-rank-negative", "PET_NODE_RANK", "-1"),
    plan_env("node-rank-non-numeric", "PET_NODE_RANK", "abc"),
    plan_env("node-rank-huge", "PET_NODE_RANK", HUGE),
    plan_env("node-rank-equals-nnodes", "PET_NODE_RANK", "4", PET_NNODES="4", PET_MASTER_ADDR=MASTER),
    plan_env("job-completion-index-equals-nnodes", "JOB_COMPLETION_INDEX", "4",
             PET_NNODES="4", PET_MASTER_ADDR=MASTER),
    plan_env("job-completion-index-non-numeric", "JOB_COMPLETION_INDEX", "x1"),
    # --- PET_MASTER_ADDR / PET_MASTER_PORT ----------------------------------------------------
    plan_env("master-addr-bad-chars", "PET_MASTER_ADDR", "bad_host!"),
    plan_env("master-addr-leading-dash", "PET_MASTER_ADDR", "-leading-dash"),
    plan_env("master-addr-300-chars", "PET_MASTER_ADDR", LONG_HOST),
    plan_env("master-addr-whitespace", "PET_MASTER_ADDR", "  "),
    plan_env("master-port-zero", "PET_MASTER_PORT", "0"),
    plan_env("master-port-65536", "PET_MASTER_PORT", "65536"),
    plan_env("master-port-non-numeric", "PET_MASTER_PORT", "abc"),
    plan_env("master-port-float", "PET_MASTER_PORT", "29500.0"),
    Case("multi-node-without-master-addr", plan(), {"PET_NNODES": "2"}, "PET_MASTER_ADDR", None),
    # --- PET_RDZV_* ---------------------------------------------------------------------------
    plan_env("rdzv-backend-unknown", "PET_RDZV_BACKEND", "zookeeper"),
    Case("rdzv-c10d-without-master-or-endpoint", plan(), {"PET_RDZV_BACKEND": "c10d"}, "PET_MASTER_ADDR", None),
    plan_env("rdzv-endpoint-port-not-a-number", "PET_RDZV_ENDPOINT", "host:notaport"),
    plan_env("rdzv-endpoint-port-70000", "PET_RDZV_ENDPOINT", "host:70000"),
    plan_env("rdzv-endpoint-two-colons", "PET_RDZV_ENDPOINT", "a:b:c"),
    plan_env("rdzv-endpoint-whitespace", "PET_RDZV_ENDPOINT", " "),
    plan_env("rdzv-id-with-space", "PET_RDZV_ID", "has space"),
    plan_env("rdzv-id-leading-dash", "PET_RDZV_ID", "-job"),
    plan_env("rdzv-conf-no-equals", "PET_RDZV_CONF", "novalue"),
    plan_env("rdzv-conf-no-key", "PET_RDZV_CONF", "=x"),
    plan_env("rdzv-conf-empty-value", "PET_RDZV_CONF", "join_timeout="),
    plan_env("max-restarts-negative", "PET_MAX_RESTARTS", "-1"),
    plan_env("max-restarts-float", "PET_MAX_RESTARTS", "1.5"),
    plan_env("standalone-maybe", "PET_STANDALONE", "maybe"),
    # --- LAUNCHER_* variables -----------------------------------------------------------------
    plan_env("grace-period-negative", "LAUNCHER_GRACE_PERIOD", "-1"),
    plan_env("grace-period-non-numeric", "LAUNCHER_GRACE_PERIOD", "abc"),
    plan_env("grace-period-bad-unit", "LAUNCHER_GRACE_PERIOD", "10x"),
    plan_env("grace-period-over-7-days", "LAUNCHER_GRACE_PERIOD", "999999999"),
    plan_env("pod-grace-a-duration", "LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS", "10m"),
    plan_env("pod-grace-within-the-margin", "LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS", "5"),
    # The pod's grace raised to 600 s, the launcher's set to all of it: no time left for the message.
    plan_env("grace-period-beyond-the-pods", "LAUNCHER_GRACE_PERIOD", "600",
             LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS="600"),
    plan_env("rendezvous-timeout-word", "LAUNCHER_RENDEZVOUS_TIMEOUT", "soon"),
    plan_env("retryable-codes-zero", "LAUNCHER_RETRYABLE_EXIT_CODES", "0"),
    plan_env("retryable-codes-256", "LAUNCHER_RETRYABLE_EXIT_CODES", "256"),
    plan_env("retryable-codes-junk-in-list", "LAUNCHER_RETRYABLE_EXIT_CODES", "1,,x"),
    plan_env("retryable-codes-word", "LAUNCHER_RETRYABLE_EXIT_CODES", "abc"),
    plan_env("retryable-codes-only-commas", "LAUNCHER_RETRYABLE_EXIT_CODES", ",,"),
    plan_env("retryable-pattern-unbalanced", "LAUNCHER_RETRYABLE_PATTERN", "("),
    plan_env("log-format-xml", "LAUNCHER_LOG_FORMAT", "xml"),
    # --- the same knobs as launcher flags (a flag wins over the variable and is the one named) -
    Case("flag-grace-period", ("plan", "--grace-period", "abc", "--", SCRIPT), {}, "--grace-period", "abc"),
    Case("flag-grace-period-equals", ("plan", "--grace-period=10x", "--", SCRIPT), {}, "--grace-period", "10x"),
    Case("flag-grace-period-beats-valid-env", ("plan", "--grace-period", "abc", "--", SCRIPT),
         {"LAUNCHER_GRACE_PERIOD": "30"}, "--grace-period", "abc"),
    Case("flag-rendezvous-timeout", ("plan", "--rendezvous-timeout", "soon", "--", SCRIPT),
         {"LAUNCHER_RENDEZVOUS_TIMEOUT": "60"}, "--rendezvous-timeout", "soon"),
    Case("flag-retryable-exit-codes", ("plan", "--retryable-exit-codes", "256", "--", SCRIPT), {},
         "--retryable-exit-codes", "256"),
    Case("flag-retryable-pattern", ("plan", "--retryable-pattern", "([a-", "--", SCRIPT), {},
         "--retryable-pattern", "([a-"),
    Case("flag-log-format", ("plan", "--log-format", "xml", "--", SCRIPT), {"LAUNCHER_LOG_FORMAT": "json"},
         "--log-format", "xml"),
    # --- torchrun flags after `--` override PET_* and are the ones named ----------------------
    Case("torchrun-nnodes-reversed", plan("--nnodes", "3:1"), {"PET_NNODES": "2", "PET_MASTER_ADDR": MASTER},
         "--nnodes", "3:1"),
    Case("torchrun-nproc-underscore-equals", plan("--nproc_per_node=0"), {"PET_NPROC_PER_NODE": "2"},
         "--nproc_per_node", "0"),
    Case("torchrun-master-port", plan("--master-port", "abc"), {"PET_MASTER_PORT": "29500"},
         "--master-port", "abc"),
    Case("torchrun-node-rank-too-high", plan("--node-rank", "5"),
         {"PET_NNODES": "4", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": MASTER}, "--node-rank", "5"),
    Case("torchrun-rdzv-endpoint", plan("--rdzv-endpoint", "host:70000"), {}, "--rdzv-endpoint", "host:70000"),
    Case("torchrun-standalone-with-bad-value", plan("--standalone=maybe"), {}, "--standalone", "maybe"),
    Case("torchrun-value-flag-last", ("plan", "--", "--nnodes"), {}, "--nnodes", None),
    # --- torchrun's grammar: what torchrun's own parser refuses, the launcher refuses in one line -
    Case("torchrun-unknown-flag", plan("--bogus-flag", "1"), {}, "--bogus-flag"),
    Case("torchrun-ambiguous-abbreviation", plan("--rdzv", "c10d"), {}, "--rdzv"),
    Case("torchrun-int-flag-word", plan("--shutdown-timeout", "soon"), {}, "--shutdown-timeout", "soon"),
    Case("torchrun-int-flag-abbreviated", plan("--max-rest=lots"), {}, "--max-restarts", "lots"),
    Case("torchrun-choice", plan("--start-method=thread"), {}, "--start-method", "thread"),
    Case("torchrun-switch-with-value", plan("--no-python=1"), {}, "--no-python", "1"),
    Case("torchrun-help", plan("--help"), {}, "--help"),
    Case("torchrun-static-endpoint-without-port", plan("--rdzv-backend=static", "--rdzv-endpoint=master"),
         {"PET_NNODES": "2"}, "--rdzv-endpoint", "master"),
    plan_env("keep-nproc-maybe", "LAUNCHER_KEEP_NPROC", "maybe"),
    Case("flag-keep-nproc", ("plan", "--keep-nproc", "sometimes", "--", SCRIPT), {}, "--keep-nproc", "sometimes"),
    # --- argparse-level mistakes ---------------------------------------------------------------
    Case("plan-unknown-framework", ("plan", "--framework", "chainer", "--", SCRIPT), {}, "--framework", "chainer"),
    Case("plan-unknown-launcher-flag", ("plan", "--bogus", "1", "--", SCRIPT), {}, "--bogus"),
    Case("unknown-subcommand", ("bogus", SCRIPT), {}, "COMMAND", "bogus"),
    # --- torch: validation fails before torchrun (or the script) starts ------------------------
    Case("torch-bad-nnodes", ("torch", "--", SCRIPT), {"PET_NNODES": "abc"}, "PET_NNODES", "abc"),
    Case("torch-bad-master-port", ("torch", "--", SCRIPT), {"PET_MASTER_PORT": "0"}, "PET_MASTER_PORT", "0"),
    Case("torch-node-rank-too-high", ("torch", "--", SCRIPT),
         {"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": MASTER}, "PET_NODE_RANK", "2"),
    Case("torch-bad-grace-period", ("torch", "--", SCRIPT), {"LAUNCHER_GRACE_PERIOD": "abc"},
         "LAUNCHER_GRACE_PERIOD", "abc"),
    Case("torch-torchrun-flag", ("torch", "--", "--nnodes", "3:1", SCRIPT), {}, "--nnodes", "3:1"),
    Case("torch-missing-script", ("torch", "--"), {}, "SCRIPT", None),
    Case("torch-missing-script-no-dashdash", ("torch",), {}, "SCRIPT", None),
    # --- exec -----------------------------------------------------------------------------------
    # A framework that does not restart in place refuses the restarts, before anything runs.
    Case("exec-max-restarts-flag", ("exec", "--max-restarts", "2", "--", sys.executable, SCRIPT), {},
         "--max-restarts", "2"),
    Case("exec-max-restarts-env", ("exec", "--", sys.executable, SCRIPT), {"LAUNCHER_MAX_RESTARTS": "1"},
         "LAUNCHER_MAX_RESTARTS", "1"),
    Case("launcher-max-restarts-negative", ("exec", "--", sys.executable, SCRIPT), {"LAUNCHER_MAX_RESTARTS": "-1"},
         "LAUNCHER_MAX_RESTARTS", "-1"),
    Case("exec-no-command", ("exec",), {}, "CMD", None),
    Case("exec-no-command-after-dashdash", ("exec", "--"), {}, "CMD", None),
    Case("exec-bad-grace-period-flag", ("exec", "--grace-period", "-1", "--", sys.executable, SCRIPT), {},
         "--grace-period", "-1"),
    Case("exec-bad-retryable-codes-env", ("exec", "--", sys.executable, SCRIPT),
         {"LAUNCHER_RETRYABLE_EXIT_CODES": "256"}, "LAUNCHER_RETRYABLE_EXIT_CODES", "256"),
    # --- the export after the job (any job subcommand; exec here: no process starts first) ------
    Case("export-uri-unknown-scheme", ("exec", "--export-uri", "gs://bucket/x", "--", sys.executable, SCRIPT), {},
         "--export-uri", "gs://bucket/x"),
    Case("export-uri-hf-without-name", ("exec", "--", sys.executable, SCRIPT), {"EXPORT_URI": "hf://only-owner"},
         "EXPORT_URI", "hf://only-owner"),
    Case("export-uri-hf-bad-repo-name", ("exec", "--", sys.executable, SCRIPT), {"EXPORT_URI": "hf://team/my model!"},
         "EXPORT_URI", "hf://team/my model!"),
    Case("export-uri-bad-bucket", ("exec", "--", sys.executable, SCRIPT), {"EXPORT_URI": "s3://Bad_Bucket/x"},
         "EXPORT_URI", "s3://Bad_Bucket/x"),
    Case("export-path-relative", ("exec", "--export-uri", "file:///tmp/x", "--export-path", "out", "--",
                                  sys.executable, SCRIPT), {}, "--export-path", "out"),
    Case("export-per-node-word", ("exec", "--", sys.executable, SCRIPT),
         {"EXPORT_URI": "file:///tmp/x", "EXPORT_PER_NODE": "maybe"}, "EXPORT_PER_NODE", "maybe"),
    Case("export-concurrency-zero", ("exec", "--export-uri", "file:///tmp/x", "--export-concurrency", "0", "--",
                                     sys.executable, SCRIPT), {}, "--export-concurrency", "0"),
    # --- local ----------------------------------------------------------------------------------
    Case("local-nnodes-zero", ("local", "--nnodes", "0", "--", SCRIPT), {}, "--nnodes", "0"),
    Case("local-nnodes-word", ("local", "--nnodes", "two", "--", SCRIPT), {}, "--nnodes", "two"),
    Case("local-nnodes-over-64", ("local", "--nnodes", "65", "--", SCRIPT), {}, "--nnodes", "65"),
    Case("local-nproc-word", ("local", "--nproc-per-node", "many", "--", SCRIPT), {}, "--nproc-per-node", "many"),
    Case("local-nproc-zero", ("local", "--nproc-per-node", "0", "--", SCRIPT), {}, "--nproc-per-node", "0"),
    Case("local-trainjob-uppercase", ("local", "--trainjob", "My_Job", "--", SCRIPT), {}, "--trainjob", "My_Job"),
    Case("local-trainjob-leading-dash", ("local", "--trainjob=-x", "--", SCRIPT), {}, "--trainjob", "-x"),
    Case("local-master-port-zero", ("local", "--master-port", "0", "--", SCRIPT), {}, "--master-port", "0"),
    Case("local-master-port-70000", ("local", "--master-port", "70000", "--", SCRIPT), {}, "--master-port", "70000"),
    Case("local-master-port-word", ("local", "--master-port", "abc", "--", SCRIPT), {}, "--master-port", "abc"),
    Case("local-unknown-isolation", ("local", "--isolation", "chroot", "--", SCRIPT), {}, "--isolation", "chroot"),
    Case("local-bad-grace-period-env", ("local", "--", SCRIPT), {"LAUNCHER_GRACE_PERIOD": "10x"},
         "LAUNCHER_GRACE_PERIOD", "10x"),
    Case("local-missing-script", ("local", "--nnodes", "2", "--"), {}, "SCRIPT", None),
]


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PET_", "LAUNCHER_", "EXPORT_")) and k != "JOB_COMPLETION_INDEX"
    }
    env.update(extra)
    return env


def launcher(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=REPO, env=clean_env(env), capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[str, Path]:
    """A script that proves it ran by creating a file."""
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return str(script), marker




# torch starts its agent before it validates (importing torch overlaps the validation), local its
# nodes: their cases run the CLI as a process of its own; the rest in the test's process.
STARTS_FIRST = ("torch", "local")
IN_PROCESS = [case for case in CASES if case.args[0] not in STARTS_FIRST]
AS_PROCESS = [case for case in CASES if case.args[0] in STARTS_FIRST]


def check_refused(case: Case, marker_script: tuple[str, Path], run) -> None:
    if case.needs_no_gpu and gpu_devices() > 0:
        pytest.skip("this machine has GPUs")
    script, marker = marker_script
    args = [script if arg == SCRIPT else arg for arg in case.args]

    result = run(args, case.env)

    assert_one_line_naming(result, case.names, case.value)
    assert not marker.exists(), "the program ran although the input was invalid"


@pytest.mark.unit
@pytest.mark.parametrize("case", IN_PROCESS, ids=[case.id for case in IN_PROCESS])
def test_bad_input_exits_2_with_one_line_naming_it(case: Case, marker_script, cli):
    check_refused(case, marker_script, cli)


@pytest.mark.parametrize("case", AS_PROCESS, ids=[case.id for case in AS_PROCESS])
def test_bad_input_to_a_command_that_starts_processes_first_exits_2_with_one_line_naming_it(case: Case, marker_script):
    check_refused(case, marker_script, launcher)


def test_there_are_at_least_45_cases():
    assert len(CASES) >= 45
    assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"


def test_a_valid_flag_wins_over_a_bad_variable(marker_script):
    """The flag is what counts: a bad LAUNCHER_GRACE_PERIOD is no error when --grace-period is given."""
    script, _ = marker_script
    result = launcher(["plan", "--grace-period", "5", "--", script], {"LAUNCHER_GRACE_PERIOD": "abc"})
    assert result.returncode == 0, result.stderr
    assert '"gracePeriod": 5.0' in result.stdout


def test_a_torchrun_flag_wins_over_a_bad_pet_variable(marker_script):
    script, _ = marker_script
    result = launcher(["plan", "--", "--nnodes", "1", script], {"PET_NNODES": "abc"})
    assert result.returncode == 0, result.stderr
    assert '"nnodes": "1"' in result.stdout


def test_empty_variables_mean_unset(marker_script):
    """The controller's convention: an empty value is the same as no variable at all."""
    script, _ = marker_script
    empty = {name: "" for name in (
        "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
        "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_MAX_RESTARTS",
        "PET_STANDALONE", "LAUNCHER_GRACE_PERIOD", "LAUNCHER_RETRYABLE_EXIT_CODES", "LAUNCHER_LOG_FORMAT",
    )}
    result = launcher(["plan", "--", script], empty)
    assert result.returncode == 0, result.stderr
    assert '"mode": "standalone"' in result.stdout


SECRET_CASES = [
    Case("secret-inside-rdzv-conf", plan(), {"PET_RDZV_CONF": f"token={TOKEN},novalue"}, "PET_RDZV_CONF"),
    Case("secret-as-master-addr", plan(), {"PET_MASTER_ADDR": f"{TOKEN}!"}, "PET_MASTER_ADDR"),
    Case("secret-inside-rdzv-id", plan(), {"PET_RDZV_ID": f"id {TOKEN}"}, "PET_RDZV_ID"),
    Case("secret-inside-flag", ("plan", "--retryable-pattern", f"({TOKEN}", "--", SCRIPT), {},
         "--retryable-pattern"),
]


@pytest.mark.parametrize("case", SECRET_CASES, ids=[case.id for case in SECRET_CASES])
def test_a_bad_value_never_echoes_a_secret(case: Case, marker_script):
    """HF_TOKEN is set in the same run, and the bad value contains it: the line must redact it."""
    script, _ = marker_script
    args = [script if arg == SCRIPT else arg for arg in case.args]

    result = launcher(args, {**case.env, "HF_TOKEN": TOKEN})

    assert_one_line_naming(result, case.names, None)
    assert TOKEN not in result.stdout + result.stderr
