"""The exit-code table: what a failed rank (or a signal to the launcher) becomes, for Kubernetes.

The exit code is what a runtime's podFailurePolicy and JobSet failurePolicy act on; retryable is
decided from it and the retryable set (``is_retryable``), and the termination message is what
``kubectl describe`` shows.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from launcher.core.outcome import (
    LAST_LINES, aborted_on, last_lines,
    DEFAULT_RETRYABLE_EXIT_CODES, Outcome, RootCause, classify, evidence_regex, is_retryable, terminated,
)


def retryable(outcome: Outcome, codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES) -> bool:
    return is_retryable(outcome.exit_code, codes)


# --- classify -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "returncode, exit_code, retryable",
    [
        pytest.param(3, 3, False, id="exit-3-is-permanent"),
        pytest.param(1, 1, False, id="exit-1-is-permanent"),
        pytest.param(2, 2, False, id="exit-2-is-permanent"),
        pytest.param(127, 127, False, id="exit-127-is-permanent"),
        pytest.param(-9, 137, True, id="sigkill-is-137-retryable"),
        pytest.param(-15, 143, True, id="sigterm-is-143-retryable"),
        pytest.param(-2, 130, True, id="sigint-is-130-retryable"),
        pytest.param(-11, 139, False, id="sigsegv-is-139-permanent"),
        pytest.param(-6, 134, False, id="sigabrt-is-134-permanent"),
        pytest.param(-1, 129, False, id="sighup-is-129-permanent"),
        pytest.param(138, 138, True, id="exit-138-is-retryable"),
        pytest.param(137, 137, True, id="exit-137-is-retryable"),
        pytest.param(143, 143, True, id="exit-143-is-retryable"),
    ],
)
def test_default_table(returncode, exit_code, retryable):
    outcome = classify(returncode)
    assert (outcome.exit_code, is_retryable(outcome.exit_code, DEFAULT_RETRYABLE_EXIT_CODES)) == (exit_code, retryable)


def test_default_retryable_codes_are_trainer_v1s():
    assert DEFAULT_RETRYABLE_EXIT_CODES == {130, 137, 138, 143}


def test_success_is_exit_0_and_not_a_failure():
    outcome = classify(0)
    assert (outcome.exit_code, retryable(outcome), outcome.reason) == (0, False, "Succeeded")


@pytest.mark.parametrize("crash", [signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGBUS])
def test_a_crash_signal_is_a_permanent_crash_under_the_default_set(crash):
    code = 128 + crash
    outcome = classify(-crash)

    assert outcome.exit_code == code
    assert retryable(outcome) is False
    assert outcome.reason == "Crashed"
    assert crash.name in outcome.message


def test_a_crash_whose_code_the_user_lists_is_retried_as_the_policy_will():
    # The policy sees only 139; it cannot tell a SIGSEGV from a rank that exited 139, so neither can we.
    outcome = classify(-signal.SIGSEGV, retryable_codes=frozenset({139}))
    assert (outcome.exit_code, outcome.reason, retryable(outcome, frozenset({139}))) == (139, "Crashed", True)


def test_a_crash_signal_with_hardware_evidence_is_a_node_fault():
    outcome = classify(-11, evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.")
    assert (outcome.exit_code, retryable(outcome), outcome.reason) == (138, True, "NodeFault")


@pytest.mark.parametrize("returncode", [1, 3, 2, 134, -6, -9, -11, 255])
def test_evidence_of_a_node_fault_makes_any_failure_138_retryable(returncode):
    evidence = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)"
    outcome = classify(returncode, evidence=evidence)

    assert outcome.exit_code == 138
    assert retryable(outcome) is True
    assert outcome.reason == "NodeFault"
    assert outcome.evidence == evidence


def test_a_custom_retryable_set_replaces_the_default():
    only_3 = frozenset({3})

    assert retryable(classify(3, retryable_codes=only_3), only_3) is True
    assert classify(3, retryable_codes=only_3).reason == "RetryableExit"
    assert retryable(classify(-9, retryable_codes=only_3), only_3) is False
    assert classify(-9, retryable_codes=only_3).exit_code == 137
    assert retryable(classify(138, retryable_codes=only_3), only_3) is False


def test_success_is_never_retryable_whatever_the_set():
    assert is_retryable(0, frozenset({0, 1})) is False


def test_a_killed_rank_says_which_signal_and_keeps_its_root_cause():
    cause = RootCause(node="tj-node-0-1", rank=5, local_rank=1, signal="SIGKILL")
    outcome = classify(-9, root_cause=cause, what="rank 5")

    assert outcome.message == "rank 5 was killed by SIGKILL"
    assert outcome.reason == "Killed"
    assert outcome.root_cause == cause


def test_an_exit_says_its_code():
    assert classify(3, what="rank 0").message == "rank 0 exited with code 3"


# --- terminated ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signum, exit_code, retryable",
    [
        pytest.param(signal.SIGTERM, 143, True, id="sigterm-pod-deleted"),
        pytest.param(signal.SIGINT, 130, True, id="sigint-ctrl-c"),
        pytest.param(signal.SIGHUP, 129, False, id="sighup"),
    ],
)
def test_terminated_with_the_default_set(signum, exit_code, retryable):
    outcome = terminated(signum)

    assert (outcome.exit_code, is_retryable(outcome.exit_code, DEFAULT_RETRYABLE_EXIT_CODES), outcome.reason) == (
        exit_code, retryable, "Terminated")
    assert signum.name in outcome.message


def test_terminated_follows_a_custom_retryable_set():
    assert retryable(terminated(signal.SIGTERM), frozenset({1})) is False
    assert retryable(terminated(signal.SIGHUP), frozenset({129})) is True


# --- the termination message --------------------------------------------------------------------


def big_outcome(char: str = "x") -> Outcome:
    return Outcome(
        exit_code=138,
        reason="NodeFault",
        message=char * 100_000,
        root_cause=RootCause(node="tj-node-0-3", rank=27, local_rank=3, exit_code=None, signal="SIGABRT"),
        evidence=char * 100_000,
        extra={"lastLines": [char * 5_000] * 5, "failedRanks": list(range(64))},
    )


@pytest.mark.parametrize("char", ["x", "é", "\u2603", '"'], ids=["ascii", "latin1", "snowman", "quote"])
def test_termination_message_fits_kubernetes_4096_bytes_and_keeps_the_essentials(char):
    text = big_outcome(char).termination_message(DEFAULT_RETRYABLE_EXIT_CODES)

    assert len(text.encode()) <= 4096
    data = json.loads(text)
    assert data["exitCode"] == 138
    assert data["retryable"] is True
    assert data["reason"] == "NodeFault"
    assert data["rootCause"] == {"node": "tj-node-0-3", "rank": 27, "localRank": 3, "exitCode": None,
                                 "signal": "SIGABRT"}
    assert data["message"].startswith(char * 10)


def test_a_small_termination_message_is_complete():
    outcome = classify(3, root_cause=RootCause(node="n", rank=0, exit_code=3), what="rank 0").with_extra(
        failedRanks=[0])
    data = json.loads(outcome.termination_message(DEFAULT_RETRYABLE_EXIT_CODES))

    assert data == {
        "retryable": False, "exitCode": 3, "reason": "Failed", "message": "rank 0 exited with code 3",
        "rootCause": {"node": "n", "rank": 0, "localRank": None, "exitCode": 3, "signal": None},
        "failedRanks": [0],
    }
    assert Outcome.from_json(data) == outcome


def test_a_message_read_back_is_judged_by_the_readers_retryable_set():
    message = classify(3).termination_message(frozenset({3}))
    assert json.loads(message)["retryable"] is True
    outcome = Outcome.from_json(json.loads(message))
    assert json.loads(outcome.termination_message(DEFAULT_RETRYABLE_EXIT_CODES))["retryable"] is False


# --- node-fault evidence ------------------------------------------------------------------------

NODE_FAULT_LINES = [
    "[rank3]:[E1122 10:15:02.123456 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) "
    "ran for 600024 milliseconds before timing out.",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
    "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
    "store by key '0', but store->get('0') got error: Connection reset by peer",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:18:00): 48, pid=7781, name=python, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 6, subpartition 0.",
    "tj-node-0-2:1203:1390 [0] NCCL INFO NET/IB : Got completion from peer 10.0.3.7<45117> with error 12, "
    "opcode 0, len 0, vendor err 129",
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
]

ORDINARY_LINES = [
    "loss 0.5",
    "Epoch 3: accuracy 0.9",
    "tj-node-0-0:812:812 [0] NCCL INFO Bootstrap : Using eth0:10.0.1.5<0>",
    "tj-node-0-0:812:1020 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.5<0>",
    "NCCL INFO comm 0x55d5c3a0 rank 0 nranks 16 cudaDev 0 busId 18000 - Init COMPLETE",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ValueError: connection string must not be empty",
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, Graphics Exception: ESR 0x405840=0x0",
]


@pytest.mark.parametrize("line", NODE_FAULT_LINES, ids=lambda line: line[:40])
def test_node_fault_lines_are_evidence(line):
    assert evidence_regex().search(line)


@pytest.mark.parametrize("line", ORDINARY_LINES, ids=lambda line: line[:40])
def test_ordinary_lines_are_not_evidence(line):
    assert not evidence_regex().search(line)


def test_a_user_pattern_adds_to_the_built_in_evidence():
    line = "__main__.MyRetryableError: the object store flaked"

    assert not evidence_regex().search(line)
    assert evidence_regex("MyRetryableError").search(line)
    assert evidence_regex("MyRetryableError").search(NODE_FAULT_LINES[0])
    assert not evidence_regex("MyRetryableError").search("loss 0.5")


# --- what a native abort printed, at a glance -------------------------------------------------

NCCL_ABORT = (Path(__file__).parent / "fixtures" / "nccl_watchdog_abort.txt").read_text().splitlines()  # an H200's


def test_last_lines_leave_out_native_stack_frames_and_blank_lines():
    last = last_lines(NCCL_ABORT)["lastLines"]
    assert len(last) == LAST_LINES and last[-1].startswith("Compile with `TORCH_USE_CUDA_DSA`")
    assert last_lines(["@ 0x7f3a2b1c  absl::Frame", "  @     0x55d1 main", "", "ValueError: x"]) == {"lastLines": ["ValueError: x"]}
    assert last_lines(["frame #0: c10::Error", ""]) == {}


def test_the_exception_a_native_abort_threw_is_its_what_line():
    assert aborted_on(NCCL_ABORT).endswith("terminated with exception: CUDA error: device-side assert triggered")
    assert aborted_on(["terminate called without an active exception"]) is None
    assert len(aborted_on([f"  what():  {'x' * 2000}"])) <= 500
