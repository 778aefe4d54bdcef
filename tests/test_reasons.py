"""Reasons are values: one table (launcher/core/reasons.py), each reason with its exit code or the
rule that gives it, retryability decided by is_retryable alone, outcomes made in one file.

The source tests read launcher/ itself: a reason spelled as a string outside the table, or an
Outcome built by hand outside launcher/core/outcome.py, is a second source of truth in waiting.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from launcher.core import failure_policy
from launcher.core.outcome import Outcome, classify, is_retryable, terminated
from launcher.core.reasons import CAUSE, DEFAULT_RETRYABLE_EXIT_CODES, PROGRAM, SIGNAL, Reason, Reasons

LAUNCHER = REPO / "launcher"
# Run by path in the user's interpreter, where the package may not import: they load the table by
# path (launcher/xgboost/run.py: reasons = load_sibling(".../core/reasons.py", ...)) if they name a reason.
BY_PATH_RUNNERS = ("jax/run.py", "xgboost/run.py", "runner/")
# The same words in someone else's vocabulary, not a reason of ours.
OTHER_VOCABULARIES = {
    ("initializers/s3.py", "NotFound"): "an S3 error code, mapped to Reasons.NOT_FOUND",
    ("status/intake.py", "NotFound"): "the reason of a Kubernetes Status reply",
    ("core/failure_policy.py", "Failed"): "a Job's podReplacementPolicy, which JobSet's in-place restart demands",
}


def launcher_sources() -> dict[str, ast.Module]:
    return {str(path.relative_to(LAUNCHER)): ast.parse(path.read_text()) for path in sorted(LAUNCHER.rglob("*.py"))}


def permanent(exit_code: int, codes: frozenset[int]) -> bool:
    """What the runtimes' podFailurePolicy does with a container that exited ``exit_code``: the
    first matching onExitCodes rule wins; FailJob fails the Job at once, anything else is retried."""
    for rule in failure_policy.pod_failure_policy("node", codes)["rules"]:
        on_codes = rule.get("onExitCodes")
        if on_codes is not None and (exit_code in on_codes["values"]) == (on_codes["operator"] == "In"):
            return rule["action"] == "FailJob"
    return False


# --- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", Reasons.all(), ids=str)
def test_every_reason_has_one_exit_code_or_one_rule_for_it(reason):
    assert (reason.code is None) != (reason.rule is None)
    if reason.code is not None:
        assert list(reason.codes) == [reason.code] and reason.exit_code() == reason.code
    else:
        assert reason.rule in (PROGRAM, SIGNAL, CAUSE) and len(reason.codes) > 1
    assert Reasons.named(reason) is reason


def test_a_reason_with_neither_or_both_is_refused():
    with pytest.raises(ValueError):
        Reason("Nothing")
    with pytest.raises(ValueError):
        Reason("Both", 2, PROGRAM)


def test_a_reason_with_a_code_of_its_own_takes_no_other_and_a_rule_needs_one():
    with pytest.raises(ValueError):
        Reasons.PEER_LOST.exit_code(1)
    with pytest.raises(ValueError):
        Reasons.FAILED.exit_code()
    assert Reasons.FAILED.exit_code(3) == 3


def test_the_names_are_the_ones_users_have_always_seen():
    assert {str(r): r.code for r in Reasons.all() if r.code is not None} == {
        "Succeeded": 0, "Stopped": 0, "NodeFault": 138, "PeerLost": 138, "Hang": 138, "RendezvousTimeout": 138,
        "RendezvousFailed": 138, "LauncherError": 70, "ConfigError": 2, "UnsupportedVersion": 2,
        "CommandNotFound": 127, "NotExecutable": 126, "HostKeyMismatch": 2, "DuplicateProcessId": 2,
        "Misconfigured": 2, "StorageUnavailable": 138, "LeaseTimeout": 138, "LeaseLost": 138,
        "LocalIOError": 138, "StorageError": 2, "NotFound": 2, "AuthFailed": 2, "BadRequest": 2,
        "NoCredentials": 2, "UnsafePath": 2, "PathClash": 2, "BadArchive": 2, "PermissionDenied": 2,
        "ReadOnlyFileSystem": 2, "NoSpace": 2, "BadPath": 2, "ExportFailed": 138, "ExportRejected": 2,
    }
    assert {str(r): r.rule for r in Reasons.all() if r.rule is not None} == {
        "Failed": PROGRAM, "RetryableExit": PROGRAM, "Signaled": SIGNAL, "Killed": SIGNAL, "Crashed": SIGNAL,
        "OutOfMemory": SIGNAL, "Terminated": SIGNAL, "PeerFailed": CAUSE, "RestartAsked": PROGRAM,
    }


@pytest.mark.parametrize("codes", [DEFAULT_RETRYABLE_EXIT_CODES, frozenset({1, 70}), frozenset()],
                         ids=["default", "1-and-70", "none"])
@pytest.mark.parametrize("reason", Reasons.all(), ids=str)
def test_for_every_code_of_every_reason_the_table_and_the_runtimes_policy_agree(reason, codes):
    for code in reason.codes:
        assert reason.retryable(codes, code) is is_retryable(code, codes)
        assert permanent(code, codes) is (code != 0 and not is_retryable(code, codes)), (reason, code)


def test_a_reason_is_its_name_wherever_a_string_goes():
    reason = Reasons.PEER_LOST
    assert json.dumps({"reason": reason}) == '{"reason": "PeerLost"}'
    assert f"({reason})" == "(PeerLost)" and type(str(reason)) is str
    assert reason == "PeerLost" and "PeerLost" in {reason}


def test_an_outcome_read_back_carries_the_tables_reason_and_an_unknown_one_as_it_came():
    sent = Outcome.of(Reasons.HANG, "no progress for 600s")
    read = Outcome.from_json(sent.to_json(DEFAULT_RETRYABLE_EXIT_CODES))
    assert read == sent and read.reason is Reasons.HANG
    newer = Outcome.from_json({"exitCode": 138, "reason": "SomethingNewer", "message": "m"})
    assert newer.reason == "SomethingNewer"


@pytest.mark.parametrize("returncode", range(-64, 256))
def test_every_classified_outcome_carries_a_code_its_reason_allows(returncode):
    for evidence in (None, "NCCL communicator was aborted"):
        outcome = classify(returncode, evidence=evidence)
        assert outcome.exit_code in outcome.reason.codes, outcome


@pytest.mark.parametrize("signum", [s for s in signal.Signals if s < 65])
def test_terminated_carries_a_code_its_reason_allows(signum):
    outcome = terminated(signum)
    assert outcome.exit_code in outcome.reason.codes and outcome.exit_code == 128 + signum


def test_the_table_loads_by_path_without_the_package(tmp_path):
    """As the runners load it in the user's interpreter, and crash.py (which they load) with it."""
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_trainer_launcher_crash', {str(LAUNCHER / 'core' / 'crash.py')!r})\n"
        "crash = importlib.util.module_from_spec(spec); spec.loader.exec_module(crash)\n"
        "assert 'launcher' not in sys.modules, 'the package was imported'\n"
        "print(crash.REASON, crash.INTERNAL_ERROR, sys.modules['_trainer_launcher_reasons'].Reasons.UNSUPPORTED_VERSION)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["LauncherError", "70", "UnsupportedVersion"]), done.stderr


# --- the source: one file builds outcomes, each name spelled once -----------------------------


def test_outcomes_are_built_in_one_file_only():
    built = {}
    for path, tree in launcher_sources().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            # Outcome(...) by hand, or replace(outcome, reason=...) that remakes one.
            if called == "Outcome" or (called == "replace" and "reason" in {k.arg for k in node.keywords}):
                built.setdefault(path, []).append(node.lineno)
    assert set(built) <= {"core/outcome.py"}, built


def test_outcome_of_is_given_a_reason_of_the_table_never_a_string():
    spelled = [f"{path}:{node.lineno}" for path, tree in launcher_sources().items() for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "of" and node.args
               and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))]
    assert not spelled


def test_each_reason_name_is_spelled_once_in_the_launcher():
    where: dict[str, list[str]] = {reason: [] for reason in Reasons.all()}
    for path, tree in launcher_sources().items():
        if path.startswith(BY_PATH_RUNNERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in where and (path, node.value) not in OTHER_VOCABULARIES:
                where[node.value].append(f"{path}:{node.lineno}")
    # Once, in the table; everywhere else the value (Reasons.X) stands for it.
    assert {name: found for name, found in where.items()
            if len(found) != 1 or not found[0].startswith("core/reasons.py:")} == {}


def test_the_other_vocabularies_excused_above_are_still_there():
    sources = launcher_sources()
    for path, name in OTHER_VOCABULARIES:
        assert any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(sources[path])), (path, name)


def test_the_by_path_runners_name_no_reason_as_a_string():
    for path in (LAUNCHER / "jax" / "run.py", LAUNCHER / "xgboost" / "run.py", *sorted((LAUNCHER / "runner").glob("*.py"))):
        literals = {n.value for n in ast.walk(ast.parse(Path(path).read_text())) if isinstance(n, ast.Constant)}
        assert not literals & set(Reasons.all()), path
