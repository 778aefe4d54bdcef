"""The launcher's two records (launcher/runner/report.py): what a process reports to its launcher
and the stop record the pods share, as the launcher reads them back. The transports that carry
them (torch's store, JAX's key-value store, XGBoost's board, MPI's reports) are tested with their
frameworks, in real runs; here, what any of them hands over."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st
from conftest import REPO

from launcher.runner import report as records


def test_a_report_written_by_the_runner_reads_back_whole(tmp_path):
    path = str(tmp_path / "report.json")
    stop = records.StopRecord(generation=2, node="pod-0-1", node_rank=1, rank=3, local_rank=1, exit_code=139,
                              signal="SIGSEGV", error="x" * 5000)
    written = records.report("stopped", 139, rank=0, local_rank=0, node="pod-0-0", stopped_by=stop.to_json())
    assert records.write(path, written)
    assert not os.path.exists(path + ".tmp")
    got = records.Report.read(path)
    assert got is not None and (got.ending, got.exit_code, got.rank, got.node) == ("stopped", 139, 0, "pod-0-0")
    assert got.stopped_by is not None and got.stopped_by.generation == 2 and got.stopped_by.signal == "SIGSEGV"
    assert len(got.stopped_by.error) == records.TEXT_LIMIT  # cut where it was written


def test_the_runner_writes_it_from_the_users_interpreter_loaded_by_path(tmp_path):
    """The runners load report.py by path in an interpreter that may not have the launcher
    importable: it needs nothing but the standard library."""
    path = tmp_path / "report.json"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_r', {str(REPO / 'launcher/runner/report.py')!r})\n"
        "module = sys.modules['_r'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        f"module.write({str(path)!r}, module.report('refused', 2, reason='UnsupportedVersion', error='jax 0.3'))\n"
        "assert not [name for name in sys.modules if name.startswith('launcher')]\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, cwd=tmp_path)
    got = records.Report.read(str(path))
    assert got is not None and (got.ending, got.reason, got.error) == ("refused", "UnsupportedVersion", "jax 0.3")


@pytest.mark.parametrize("data", [
    None, [], "failed", {"ending": "finished"}, {"exitCode": 1},
])
def test_what_is_not_a_report_is_none(data):
    assert records.Report.parse(data) is None


def test_a_reports_fields_of_the_wrong_type_are_dropped_not_trusted():
    got = records.Report.parse({"ending": "failed", "exitCode": 300, "rank": True, "node": 7, "error": "",
                                "stoppedBy": {"node": "x"}})
    assert got == records.Report(ending="failed")


def test_an_unknown_ending_is_refused_where_it_is_written():
    with pytest.raises(ValueError, match="ending 'finished'"):
        records.report("finished", 0)


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"generation": "1"}), json.dumps({"generation": True})])
def test_what_is_not_a_stop_record_is_none(text):
    assert records.StopRecord.parse(text) is None


class _Keys:
    """The contract a transport keeps (first value under a key stays), as a dict: the real ones
    (torch's TCPStore, JAX's store, XGBoost's board) are exercised in their frameworks' runs."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def claim(self, key: str, value: str) -> str:
        return self.values.setdefault(key, value)


def test_the_first_stop_record_of_a_generation_wins_and_a_new_generation_starts_afresh():
    keys = _Keys()
    first = records.StopRecord(generation=0, rank=3, exit_code=1)
    second = records.StopRecord(generation=0, rank=0, exit_code=138)
    assert records.claim(keys, first) == (True, first)
    assert records.claim(keys, second) == (False, first)
    restarted = records.StopRecord(generation=1, rank=0, exit_code=138)
    assert records.claim(keys, restarted) == (True, restarted)


def test_a_stop_key_holding_another_generations_record_leaves_the_claimers_record_standing():
    keys = _Keys()
    keys.values[records.stop_key(1)] = records.StopRecord(generation=0, rank=3, exit_code=1).dumps()
    mine = records.StopRecord(generation=1, rank=1, exit_code=138)
    assert records.claim(keys, mine) == (True, mine)


def test_a_stop_key_holding_garbage_leaves_the_claimers_record_standing():
    keys = _Keys()
    keys.values[records.stop_key(0)] = "not json"
    mine = records.StopRecord(generation=0, rank=1, exit_code=1)
    assert records.claim(keys, mine) == (True, mine)


# --- hostile input: what any peer or torn file may hold ----------------------------------------

_FIELDS = ["ending", "exitCode", "rank", "localRank", "node", "signal", "at", "error", "where", "reason", "peer",
           "stoppedBy", "ranks", "generation", "nodeRank", "outcome"]
_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.sampled_from(
    [*records.ENDINGS, "SIGSEGV", "SIGNOPE"])
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=6), inner,
                                                                max_size=6),
    max_leaves=20)


def _typed_stop(record: records.StopRecord) -> None:
    assert type(record.generation) is int
    assert all(v is None or type(v) is int for v in (record.node_rank, record.rank, record.local_rank))
    assert record.exit_code is None or 0 <= record.exit_code <= 255
    assert all(v is None or isinstance(v, str) for v in (record.node, record.signal, record.error))
    assert record.outcome is None or isinstance(record.outcome, dict)
    assert record.returncode is None or type(record.returncode) is int


def _typed(report: records.Report) -> None:
    assert report.ending in records.ENDINGS
    assert all(v is None or type(v) is int for v in (report.rank, report.local_rank))
    assert report.exit_code is None or 0 <= report.exit_code <= 255
    assert report.at is None or type(report.at) in (int, float)
    texts = (report.node, report.signal, report.error, report.where, report.reason, report.peer)
    assert all(v is None or (isinstance(v, str) and len(v) <= records.TEXT_LIMIT) for v in texts)
    assert report.returncode is None or type(report.returncode) is int
    if report.stopped_by is not None:
        _typed_stop(report.stopped_by)
    for each in report.ranks:
        _typed(each)
        assert each.ranks == ()  # one level: a rank runs no ranks of its own


@given(_JSON)
def test_any_decoded_report_is_a_typed_report_or_nothing(value):
    """What the launcher reads from a runner's file or a rank's line, whatever it holds: a report
    whose every field has its type, or None; never an exception."""
    report = records.Report.parse(value)
    if report is not None:
        _typed(report)


@given(_JSON | st.text(max_size=40) | st.binary(max_size=40))
def test_any_stop_key_value_is_a_typed_record_or_nothing(value):
    """What a peer, or a stranger, left under the stop key: a typed record, or None."""
    if isinstance(value, (dict, list, int, float, bool, type(None))) and not isinstance(value, str):
        value = json.dumps(value)
    record = records.StopRecord.parse(value)
    if record is not None:
        _typed_stop(record)
