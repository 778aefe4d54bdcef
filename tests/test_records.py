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


def test_a_stop_key_holding_garbage_leaves_the_claimers_record_standing():
    keys = _Keys()
    keys.values[records.stop_key(0)] = "not json"
    mine = records.StopRecord(generation=0, rank=1, exit_code=1)
    assert records.claim(keys, mine) == (True, mine)
