"""The CLI reaches every framework through the registry (launcher/frameworks.py), and core's
interfaces (a job's watch, the delivery observers) are what the layers above plug into. In-process,
but for the lifecycle, which runs in a process of its own."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env
from launcher import cli, frameworks
from launcher.core import report
from launcher.core.outcome import Outcome, classify

PACKAGE = Path(cli.__file__).resolve().parent


def test_every_framework_folder_is_registered_and_every_entry_has_its_folder():
    folders = {path.parent.name for path in PACKAGE.glob("*/command.py")}
    assert folders == {framework.name for framework in frameworks.FRAMEWORKS}
    for framework in frameworks.FRAMEWORKS:
        module = importlib.import_module(framework.command)
        assert getattr(module, "COMMAND", module).NAME == framework.name


def test_the_default_framework_is_registered_and_says_what_the_pod_asks_for():
    assert frameworks.DEFAULT in cli.frameworks()
    assert callable(cli.frameworks()[frameworks.DEFAULT].pod_request)


def test_the_registry_knows_each_frameworks_collectives_as_the_hang_check_sees_them():
    from launcher.status.hang import _in_collective

    frames = {"torch": "/site-packages/torch/distributed/distributed_c10d.py:3000 in all_reduce_coalesced",
              "mpi": "/site-packages/mpi4py/MPI.py:1 in f", "jax": "/jax/experimental/multihost_utils.py:9 in g",
              "xgboost": "/site-packages/xgboost/collective.py:200 in h"}
    assert set(frames) == {framework.name for framework in frameworks.FRAMEWORKS}
    for name, frame in frames.items():
        assert _in_collective((frame,)), name


def test_the_switches_are_every_option_that_takes_no_value():
    switches = cli._switches(cli._parser(cli.frameworks()))
    assert switches == {"-h", "--help", "--version", "--worker", "--json", "--tune", "--accelerate", "--distributed-launch"}


def test_a_new_switch_needs_no_list_kept_by_hand():
    parser = cli._Parser(prog="t")
    sub = parser.add_subparsers(dest="command").add_parser("new")
    sub.add_argument("--dry-run", action="store_true")
    sub.add_argument("--level")
    assert cli._switches(parser) == {"-h", "--help", "--dry-run"}
    assert cli._split(["new", "--dry-run", "prog", "--level", "x"], cli._switches(parser)) == \
        (["new", "--dry-run"], ["prog", "--level", "x"])


@pytest.mark.parametrize("argv, head, rest", [
    (["torch", "--tune", "lora_finetune_single_device", "--config", "c"], ["torch", "--tune"],
     ["lora_finetune_single_device", "--config", "c"]),
    (["mpi", "--worker", "--ssh-port", "2222"], ["mpi", "--worker", "--ssh-port", "2222"], []),
    (["smoke", "--json", "--level", "long"], ["smoke", "--json", "--level", "long"], []),
    (["exec", "--grace-period", "5", "sh", "-c", "true"], ["exec", "--grace-period", "5"], ["sh", "-c", "true"]),
])
def test_split_tells_switches_from_options_with_values(argv, head, rest):
    assert cli._split(argv) == (head, rest)


def _recording(monkeypatch, module: str, attribute: str) -> list:
    calls: list = []
    command = importlib.import_module(module)
    command = getattr(command, "COMMAND", command)  # a RunnerCommand, or the module itself
    monkeypatch.setattr(command, attribute, lambda *args: calls.append(args) or 0)
    return calls


@pytest.mark.parametrize("argv, expected", [
    (["local", "--", "train.py"], "torch"),
    (["local", "--mpi", "intel", "--", "train.py"], "mpi"),
    (["local", "--framework", "jax", "--", "train.py"], "jax"),
    (["local", "--framework", "xgboost", "--", "train.py"], "xgboost"),
])
def test_local_runs_the_framework_asked_for_the_one_whose_options_are_given_else_the_default(
        monkeypatch, argv, expected):
    calls = {name: _recording(monkeypatch, f"launcher.{name}.command", "local")
             for name in ("torch", "mpi", "jax", "xgboost")}
    assert cli.main(argv) == 0
    assert {name: len(made) for name, made in calls.items()} == {name: int(name == expected) for name in calls}


def test_local_keeps_the_options_a_framework_adds_in_their_place():
    local = next(a for a in cli._parser(cli.frameworks())._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["local"]
    flags = [a.option_strings[0] for a in local._actions if a.option_strings][:10]
    assert flags == ["-h", "--framework", "--nnodes", "--nproc-per-node", "--trainjob", "--master-port",
                     "--isolation", "--mpi", "--user", "--rendezvous-timeout"]


def test_smoke_checks_what_the_default_framework_says_the_pod_asks_for(monkeypatch):
    calls = _recording(monkeypatch, "launcher.smoke.job", "run_smoke")
    assert cli.main(["smoke", "--json"]) == 0
    assert calls[0][3] is cli.frameworks()[frameworks.DEFAULT].pod_request


def test_the_pod_request_names_where_the_process_count_came_from(monkeypatch):
    from launcher.smoke.job import PodRequest

    for name in ("PET_NPROC_PER_NODE", "PET_MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    pod_request = cli.frameworks()[frameworks.DEFAULT].pod_request
    assert pod_request() == PodRequest(1, "default", None, "PET_MASTER_ADDR")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "gpu")
    monkeypatch.setenv("PET_MASTER_ADDR", "job-node-0-0.job")
    assert pod_request() == PodRequest("gpu", "PET_NPROC_PER_NODE", "job-node-0-0.job", "PET_MASTER_ADDR")


def test_every_delivery_observer_is_told_redacted_even_when_one_forgets_itself(tmp_path, monkeypatch):
    told: list[tuple[str, str, frozenset[int]]] = []

    def first(outcome: Outcome, codes: frozenset[int]) -> None:
        report.forget_delivery(first)
        told.append(("first", outcome.message, codes))

    def second(outcome: Outcome, codes: frozenset[int]) -> None:
        told.append(("second", outcome.message, codes))

    report.observe_delivery(first)
    report.observe_delivery(second)
    try:
        token = "hf_" + "a" * 34
        monkeypatch.setenv("HF_TOKEN", token)
        failed = classify(3, what=f"train.py --token {token}")
        assert report.deliver(failed, str(tmp_path / "t"), frozenset({138})) == 3
        report.deliver(classify(0), str(tmp_path / "t"), frozenset({138}))
    finally:
        assert report.forget_delivery(second) and not report.forget_delivery(first)
    assert [who for who, _, _ in told] == ["first", "second", "second"]
    assert token not in told[0][1] and told[0][2] == frozenset({138})


# core's lifecycle for one command (exec's command pod) with a stand-in for the status watch (core's
# JobWatch interface), in a process of its own: the supervisor is a PID 1 at heart and tears down
# every process below the one it runs in, which in pytest's own process would be the session's
# servers (moto, the hub stand-in).
LIVE = """
import json, sys
from launcher.core import lifecycle
from launcher.core.exec_job import CommandPod
from launcher.core.outcome import classify


class Watch:
    def __init__(self, hang=None):
        self.hang, self.nodes, self.finished, self.closed = hang, [], False, False

    def rank_env(self):
        return {"WATCHED_BY": "test"}

    def done(self):
        self.finished = True

    def close(self):
        self.closed = True


command, how = json.loads(sys.argv[1]), sys.argv[2]
watch = Watch(classify(138, what="the stand-in for a hang") if how == "hang" else None)


def start(life):
    watch.nodes.append(life.node)
    return watch


code = lifecycle.live(CommandPod(command), {}, None if how == "unwatched" else start)
print(json.dumps({"exitCode": code, "nodes": watch.nodes, "finished": watch.finished, "closed": watch.closed}))
"""


def supervised(command: list[str], how: str, **env: str) -> tuple[dict, str]:
    result = subprocess.run([sys.executable, "-c", LIVE, json.dumps(command), how], capture_output=True,
                            text=True, timeout=120, env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


def test_the_lifecycle_gives_the_command_the_watchs_variables_and_stops_and_closes_the_watch_after(tmp_path):
    seen = tmp_path / "seen"
    ran, _ = supervised(["sh", "-c", f'echo "$WATCHED_BY" > {seen}'], "watched", HOSTNAME="node-a")
    assert (ran["exitCode"], ran["nodes"], ran["finished"], ran["closed"]) == (0, ["node-a"], True, True)
    assert seen.read_text() == "test\n"


def test_a_hang_the_watch_found_is_the_outcome():
    ran, said = supervised(["sh", "-c", "exit 143"], "hang")  # its own exit would be 143
    assert ran["exitCode"] == 138 and "the stand-in for a hang" in said


def test_without_a_watch_nothing_is_watched():
    ran, _ = supervised(["sh", "-c", "exit 3"], "unwatched")
    assert (ran["exitCode"], ran["nodes"]) == (3, [])


@pytest.mark.parametrize("argv, scans", [
    (["torch", "--", "train.py"], False),
    (["plan", "--framework", "mpi", "--", "python", "t.py"], False),
    (["plan", "--framework=jax"], False),
    (["local", "--nnodes", "2", "--", "train.py"], False),
    (["exec", "--", "sh", "-c", "--help"], False),  # words after -- are the command's
    (["testfw", "--", "train.py"], True),
    (["plan", "--framework", "testfw"], True),
    (["plan", "--framework=testfw"], True),
    (["torch", "--help"], True),
    ([], True),
])
def test_only_a_command_line_that_may_name_a_plug_in_pays_for_reading_the_installed_distributions(argv, scans):
    assert cli.may_name_a_plugin(argv) is scans


def test_the_launchers_own_frameworks_are_all_there_is_without_plug_ins():
    assert list(cli.frameworks(plugins=False)) == [framework.name for framework in frameworks.FRAMEWORKS]
