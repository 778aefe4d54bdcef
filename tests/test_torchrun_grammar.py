"""Whatever a user passes to torchrun, torchrun reads the same meaning from the launcher's plan.

torchrun's own parser (``torch.distributed.run.get_args_parser()``) is the oracle. A seeded
generator writes command lines from that parser's flags (so a flag a new torch adds is generated
too, and the table check below fails until launcher.torch.args knows it): every flag, dash and
underscore spellings, abbreviations, ``--flag=value`` and ``--flag value``, short clusters
(``-mt3``), ``-m``/``--no-python``/``--run-path``, ``--``, and script arguments that look like
torchrun flags; a few carry values torchrun refuses. The corpus spans three environments (none;
what Trainer injects, with and without extra PET_* variables; the Kubeflow SDK's container backend,
whose flags come without any PET_*). torchrun parses the user's command line in the user's
environment and the planned one in the environment the plan gives torchrun: the script, its
arguments and every flag the user typed must agree, and so must every value the launcher does not
fill in itself (LAUNCHER_FILLED).

The last test runs the SDK's exact static command as two real nodes on this machine.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import pytest

from conftest import RANKS, Job, clean_env, free_port, launcher, rank_reports
from launcher.torch import args as torchrun_args
from launcher.core import devices
from launcher.core.devices import HostFacts
from launcher.core.outcome import ConfigError
from launcher.torch.job import make_plan
from launcher.torch.plan import OWNED, TorchPlan

torchrun = pytest.importorskip("torch.distributed.run")

SEED = 20240610
CASES_PER_ENV = 260
HOST = HostFacts(hostname="node", gpu_count=0, cpu_quota=4.0, cpu_affinity=8, omp_num_threads_set=False)
WHOLE_CPUS = 4  # what auto and cpu resolve to on HOST
# Flags the launcher fills in from PET_* (or its own rules) when the user did not type them. Every
# other value torchrun reads, typed or from PET_*, must come out the same.
LAUNCHER_FILLED = {"nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "rdzv_backend",
                   "rdzv_endpoint", "rdzv_id", "standalone"}
TRAINER = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500"}


@contextmanager
def environment(env: dict[str, str]):
    """Exactly ``env``: torchrun's parser reads PET_* when it is built, the launcher when it plans."""
    with mock.patch.dict(os.environ, env, clear=True):
        yield


@functools.lru_cache(maxsize=None)
def _torch_parser(env: tuple[tuple[str, str], ...], suppress_defaults: bool) -> argparse.ArgumentParser:
    with environment(dict(env)):
        parser = torchrun.get_args_parser()
    parser.exit_on_error = False
    parser.error = lambda message: (_ for _ in ()).throw(ValueError(message))  # no usage on stderr, no exit
    if suppress_defaults:  # then the namespace holds only what the command line set
        for action in parser._actions:
            action.default = argparse.SUPPRESS
    return parser


def torch_parser(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """torchrun's parser as built in the current environment (it reads PET_* when it is built)."""
    return _torch_parser(tuple(sorted(os.environ.items())), suppress_defaults)


def torch_reads(argv: list[str]) -> argparse.Namespace | None:
    try:
        return torch_parser().parse_args(argv)
    except (ValueError, argparse.ArgumentError, SystemExit):
        return None


def typed_by_user(argv: list[str]) -> set[str]:
    """The flags the command line itself set, by torchrun's own parser."""
    return set(vars(torch_parser(suppress_defaults=True).parse_args(argv))) - {"training_script", "training_script_args"}


def planned(argv: list[str], env: dict[str, str]) -> TorchPlan:
    with environment(env), mock.patch.object(devices, "probe_host", lambda host_env: HOST):
        return make_plan(list(argv))[0]


# --- the table against torch's parser -------------------------------------------------------------


def test_the_flag_table_is_torchruns_parser_flag_for_flag():
    """launcher.torch.args.FLAGS must list what torchrun's parser declares; a new torch flag
    fails here until the table has it (the message says which)."""
    from torch.distributed.argparse_util import check_env, env

    parser = torchrun.get_args_parser()
    kinds = {int: "int", float: "float"}
    declared = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        declared[action.dest] = torchrun_args.Flag(
            action.dest, tuple(action.option_strings), takes_value=action.nargs != 0,
            kind=kinds.get(action.type, "str"), choices=tuple(action.choices or ()),
            from_env=isinstance(action, (env, check_env)))
    assert {flag.dest: flag for flag in torchrun_args.FLAGS} == declared
    help_action = next(a for a in parser._actions if a.dest == "help")
    assert tuple(help_action.option_strings) == torchrun_args.HELP
    # The grammar argparse applies: same switches on the parser and the same two positionals.
    assert (parser.allow_abbrev, parser.prefix_chars, parser.fromfile_prefix_chars) == (True, "-", None)
    positionals = [(a.dest, a.nargs) for a in parser._actions if not a.option_strings]
    assert positionals == [("training_script", None), ("training_script_args", argparse.REMAINDER)]


def test_the_owned_flags_are_torchrun_flags_read_from_pet_variables():
    assert set(OWNED) <= {flag.dest for flag in torchrun_args.FLAGS if flag.from_env}


# --- the generated corpus -----------------------------------------------------------------------


def all_options(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions for option in action.option_strings]


def abbreviations(option: str, options: list[str]) -> list[str]:
    """Prefixes argparse expands to ``option`` (exactly one option string starts with them)."""
    if not option.startswith("--"):
        return []
    return [option[:k] for k in range(3, len(option))
            if sum(1 for other in options if other.startswith(option[:k])) == 1]


STRINGS = ["0", "3", "0:1,1:2", "/tmp/logs", "x=1,y=2", "a,,b", "SIGTERM,SIGUSR1", "with space", "", "-leading", "-1"]
SCRIPT_ARGS = ["--lr", "0.1", "--nnodes", "5", "-m", "--standalone", "--", "x=1", "-t", "3", "--nproc_per_node=8",
               "positional", "--rdzv-backend", "c10d", "-h"]


@dataclass
class Case:
    argv: list[str]
    env: dict[str, str]
    valid: bool  # built to be a command line the launcher accepts (values in its domains)
    label: str


class Generator:
    """Seeded command lines from torchrun's own parser."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        parser = torchrun.get_args_parser()
        self.options = all_options(parser)
        self.actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
        # Each option's abbreviations, found once (every worker builds the corpus to collect it).
        self.shortened = {dest: [abbreviation for option in action.option_strings
                                 for abbreviation in abbreviations(option, self.options)]
                          for dest, action in self.actions.items()}

    def spelling(self, dest: str) -> str:
        action, shortened = self.actions[dest], self.shortened[dest]
        if shortened and self.random.random() < 0.25:
            return self.random.choice(shortened)
        return self.random.choice(action.option_strings)

    def value(self, dest: str, garbage: bool) -> str:
        action, pick = self.actions[dest], self.random.choice
        if action.choices:
            return pick(list(action.choices) + (["bogus"] if garbage else []))
        if action.type is int:
            return pick(["0", "1", "2", "7"] + (["abc", "-1", "1.5"] if garbage else []))
        if action.type is float:
            return pick(["0.1", "1", "2.5"] + (["fast"] if garbage else []))
        return pick(STRINGS if garbage else [s for s in STRINGS if s and not s.startswith("-")])

    def tokens(self, dest: str, value: str | bool) -> list[str]:
        option = self.spelling(dest)
        if value is True:
            return [option]
        forms = ["space", "equals"] + (["attached"] if len(option) == 2 and value else [])
        form = self.random.choice(forms)
        if form == "space":
            return [option, value]
        return [f"{option}={value}"] if form == "equals" else [f"{option}{value}"]

    def owned(self, env: dict[str, str], sdk_rank: int | None) -> dict[str, str | bool]:
        """Flags the launcher plans, with values in its domains and consistent with ``env``."""
        r = self.random
        typed: dict[str, str | bool] = {}
        pet_rank = int(env.get("PET_NODE_RANK", "0"))
        if r.random() < 0.25:
            typed["nproc_per_node"] = r.choice(["1", "2", "3", "auto", "cpu"])
        if r.random() < 0.2:
            typed["max_restarts"] = r.choice(["0", "2", "5"])
        if r.random() < 0.1:
            typed["rdzv_conf"] = "join_timeout=900"
        if r.random() < 0.1:
            typed["rdzv_id"] = r.choice(["run-7", "job.1"])
        if sdk_rank is not None:
            return typed
        if r.random() < 0.1:
            typed["standalone"] = True
            return typed
        if r.random() < 0.3:
            typed["nnodes"] = r.choice([n for n in ("1", "2", "4", "1:2", "2:4", "2:2") if int(n.split(":")[-1]) > pet_rank])
        if r.random() < 0.25:
            typed["rdzv_backend"] = r.choice(["static", "c10d", "etcd-v2"])
        if r.random() < 0.25:
            typed["rdzv_endpoint"] = r.choice(["node-0:29500", "10.0.0.5:29400", "[fd00::1]:1234", "localhost:2379"])
        if r.random() < 0.2:
            typed["master_addr"] = r.choice(["10.0.0.5", "master.example"])
        if r.random() < 0.2:
            typed["master_port"] = r.choice(["29500", "1234"])
        max_nodes = int(str(typed.get("nnodes", env.get("PET_NNODES", "1"))).split(":")[-1])
        if r.random() < 0.2:
            typed["node_rank"] = str(r.randrange(max_nodes))
        dynamic = typed.get("rdzv_backend", "static") != "static"
        has_master = "master_addr" in typed or "PET_MASTER_ADDR" in env or "rdzv_endpoint" in typed
        if (dynamic or max_nodes > 1) and not has_master:
            typed["rdzv_endpoint"] = "node-0:29500"  # the launcher refuses a multi-node job without a master
        return typed

    def case(self, env: dict[str, str], label: str, sdk_rank: int | None = None) -> Case:
        r = self.random
        garbage = r.random() < 0.15
        typed = self.owned(env, sdk_rank)
        others = [d for d in self.actions if d not in OWNED and d not in ("module", "no_python", "run_path")]
        for dest in r.sample(others, r.randrange(0, 5)):
            typed[dest] = True if self.actions[dest].nargs == 0 else self.value(dest, garbage)
        launch = r.choice(["script", "script", "module", "no_python", "run_path"])
        if launch != "script":
            typed[launch] = True
        argv: list[str] = []
        if sdk_rank is not None:
            host = "job-node-0" if sdk_rank == 0 else "10.89.0.5"
            argv += ["--nproc_per_node=1", "--nnodes=2", f"--node-rank={sdk_rank}", "--rdzv-backend=static",
                     f"--rdzv-endpoint={host}:29500"]
        groups = [self.tokens(dest, value) for dest, value in typed.items()]
        if typed.get("module") and typed.get("tee") and r.random() < 0.4:
            # -m joins -t's value in one short cluster, as argparse allows: -mt3
            groups = [self.tokens(d, v) for d, v in typed.items() if d not in ("module", "tee")] + [[f"-mt{typed['tee']}"]]
        r.shuffle(groups)
        for group in groups:
            argv += group
        for dest in [d for d in typed if d not in OWNED and typed[d] is not True]:
            if r.random() < 0.05:  # an earlier value the later one replaces
                argv[0:0] = self.tokens(dest, self.value(dest, False))
        program = {"script": ["train.py"], "module": ["pkg.train"], "no_python": ["echo"], "run_path": ["/abs/train.py"]}[launch]
        if r.random() < 0.2:
            argv.append("--")
            if r.random() < 0.2:
                program = ["-weird.py"]
        argv += program + r.sample(SCRIPT_ARGS, r.randrange(0, 6))
        return Case(argv, env, not garbage, label)


def corpus() -> list[Case]:
    gen = Generator(SEED)
    cases = []
    for i in range(CASES_PER_ENV):
        cases.append(gen.case({}, "no PET_*"))
        rank = i % 2
        extra = {"PET_MAX_RESTARTS": "3", "PET_RDZV_CONF": "join_timeout=900", "PET_TEE": "3"} if i % 3 == 0 else {}
        cases.append(gen.case({**TRAINER, "PET_NODE_RANK": str(rank), **extra}, "Trainer's PET_*"))
        cases.append(gen.case({}, "the SDK's flags, no PET_*", sdk_rank=rank))
    return cases


CORPUS = corpus()


def test_the_corpus_is_large_and_covers_the_grammar():
    joined = [" ".join(case.argv) for case in CORPUS]
    assert len(CORPUS) >= 500
    for needle in ("--max_restarts", "--max-restarts", "--nproc_per_node=", "-m ", "--no-python", "--no_python",
                   "--run-path", " -- ", "-mt", "--nn "):
        assert any(needle in line for line in joined), f"no generated command line has {needle!r}"
    spelled = {option for case in CORPUS for arg in case.argv for option in [arg.partition("=")[0]]}
    for flag in torchrun_args.FLAGS:
        assert spelled & set(flag.options), f"{flag.spelling} is never generated"


def test_the_launcher_reads_every_command_line_as_torchrun_does():
    """Same refusals, same script and arguments, same flag values (the launcher's reader is
    argparse with torchrun's table, so abbreviations and clusters agree by construction; this
    checks the table and the reader's bookkeeping)."""
    refused = 0
    for case in CORPUS:
        with environment({}):
            expected = torch_reads(case.argv)
        try:
            line = torchrun_args.read(case.argv)
        except ConfigError:
            line = None
        assert (line is None) == (expected is None), f"{case.argv}: torchrun {'refuses' if expected is None else 'accepts'} it"
        if line is None:
            refused += 1
            continue
        assert list(line.program) == [expected.training_script, *expected.training_script_args], case.argv
        with environment({}):
            actions = {a.dest: a for a in torch_parser()._actions}
        for dest, typed in line.given.items():
            action = actions[dest]
            converted = True if action.nargs == 0 else action.type(typed.value) if action.type else typed.value
            assert vars(expected)[dest] == converted, f"{case.argv}: {dest}"
        with environment({}):
            assert set(line.given) == typed_by_user(case.argv), case.argv
    assert 0 < refused < len(CORPUS) // 3  # some refusals are exercised, most lines are valid


def test_torchrun_reads_the_users_meaning_from_every_plan():
    checked = 0
    for case in CORPUS:
        if not case.valid:
            continue
        with environment(case.env):
            users = torch_reads(case.argv)
            if users is None:
                continue  # torchrun itself refuses it: the reader test covers refusals
            typed = typed_by_user(case.argv)
        plan = planned(case.argv, case.env)
        ours_env = {k: v for k, v in case.env.items() if k not in plan.env_unset} | plan.env_set
        with environment(ours_env):
            ours = torch_parser().parse_args([*plan.torchrun_args, *plan.program])
        why = f"\n  user:  {case.argv} ({case.label})\n  plan:  {list(plan.argv)}"
        assert ours.training_script == users.training_script, why
        assert ours.training_script_args == users.training_script_args, why
        for dest in vars(users):
            if dest in ("training_script", "training_script_args"):
                continue
            if dest == "nproc_per_node" and dest in typed and not users.nproc_per_node.isdigit():
                assert ours.nproc_per_node == str(WHOLE_CPUS), why  # auto/cpu: the CPU quota, resolved
            elif dest == "nproc_per_node" and dest in typed:
                assert int(ours.nproc_per_node) == int(users.nproc_per_node), why
            elif dest == "max_restarts" and plan.max_restarts is not None:
                # A job of a fixed size: the launcher restarts every node at once; torchrun restarts nothing.
                assert (ours.max_restarts, plan.max_restarts) == (0, users.max_restarts), why
            elif dest in typed or dest not in LAUNCHER_FILLED:
                assert getattr(ours, dest) == getattr(users, dest), f"{dest} differs:{why}"
        assert_same_rendezvous(users, ours, plan, typed, why)
        checked += 1
    assert checked >= 500


def assert_same_rendezvous(users: argparse.Namespace, ours: argparse.Namespace, plan: TorchPlan, typed: set, why: str):
    """Where the launcher fills in, it fills in what torchrun would have used."""
    if plan.mode == "standalone":
        assert ours.standalone, why
        return
    assert torchrun.parse_min_max_nnodes(ours.nnodes) == torchrun.parse_min_max_nnodes(users.nnodes), why
    if plan.mode == "static":
        assert ours.rdzv_backend == "static" and ours.node_rank == users.node_rank, why
        master = users.rdzv_endpoint or f"{users.master_addr}:{users.master_port or 29500}"
        assert torchrun.get_rdzv_endpoint(ours) == master, why
    else:
        assert ours.rdzv_backend == plan.mode and ours.rdzv_endpoint, why


# --- point 3: the SDK's explicit static rendezvous ---------------------------------------------------


def sdk_flags(rank: int, endpoint_host: str, port: int = 29500) -> list[str]:
    """What the Kubeflow SDK's container backend runs on node ``rank`` (no PET_* at all)."""
    return ["--nproc_per_node=1", "--nnodes=2", f"--node-rank={rank}", "--rdzv-backend=static",
            f"--rdzv-endpoint={endpoint_host}:{port}"]


@pytest.mark.parametrize("rank, host", [(0, "job-node-0"), (1, "10.89.0.5")], ids=["node-0-by-name", "node-1-by-ip"])
def test_the_sdks_static_rendezvous_stays_static_with_its_node_rank_and_master(rank, host):
    plan = planned([*sdk_flags(rank, host), "/tmp/train.py"], {})

    assert plan.mode == "static"
    assert plan.node_rank == rank
    assert plan.argv == ("torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                         "--rdzv-backend", "static", "--rdzv-endpoint", f"{host}:29500", "/tmp/train.py")
    assert plan.wait.resolve == host
    assert plan.wait.connect == (None if rank == 0 else (host, 29500))  # node 0 serves the port
    assert "--rdzv-endpoint" in plan.sources["master"]


def test_a_c10d_rendezvous_id_never_depends_on_how_a_node_names_the_master():
    by_name = planned(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=job-node-0:29400", "t.py"], {})
    by_ip = planned(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.89.0.5:29400", "t.py"], {})
    trainer = [planned(["t.py"], {**TRAINER, "PET_NNODES": "1:2", "PET_NODE_RANK": str(r)}) for r in (0, 1)]

    assert by_name.argv[by_name.argv.index("--rdzv-id") + 1] == by_ip.argv[by_ip.argv.index("--rdzv-id") + 1]
    assert {p.argv[p.argv.index("--rdzv-id") + 1] for p in trainer} == {"tj"}
    assert trainer[0].sources["rdzv_id"] == "the TrainJob name in PET_MASTER_ADDR"


def test_max_restarts_reach_a_standalone_job_as_the_launchers_restarts():
    """Point 4's example: --max_restarts=2 used to vanish from a one-node plan. It is the launcher's
    to do now (restarts in place), as on every job of a fixed size; torchrun restarts nothing."""
    plan = planned(["--max_restarts=2", "train.py"], {})
    assert plan.mode == "standalone"
    assert plan.max_restarts == 2 and "--max-restarts" not in plan.argv


def test_the_sdks_two_node_static_command_runs_as_two_real_nodes(tmp_path, report_dir):
    """The SDK's exact command line on two nodes of this machine, without PET_*: node 0 knows the
    master by name (localhost), node 1 by address (127.0.0.1). Both meet in one world of two."""
    port = free_port()
    env = clean_env(REPORT_DIR=str(report_dir))
    started = time.monotonic()
    nodes = [Job(launcher("torch", "--", *sdk_flags(rank, host, port), RANKS), env, tmp_path, f"node{rank}")
             for rank, host in ((1, "127.0.0.1"), (0, "localhost"))]  # the worker first, as a container may start
    try:
        codes = [node.wait(240) for node in nodes]
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.process.kill()
                node.process.wait()
    elapsed = time.monotonic() - started
    logs = f"\nnode 1:\n{nodes[0].stderr[-3000:]}\nnode 0:\n{nodes[1].stderr[-3000:]}"
    assert codes == [0, 0], logs
    reports = rank_reports(report_dir)
    assert sorted(reports) == [0, 1], logs
    assert {r["world_size"] for r in reports.values()} == {2}
    assert {r["group_rank"] for r in reports.values()} == {0, 1}  # the node ranks the SDK gave
    assert {r["allreduce"] for r in reports.values()} == {3.0}
    assert "static rendezvous, node 1 of 2" in nodes[0].stderr, logs
    # The old plan (c10d, an id per spelling of the master) met only the 600 s join timeout.
    assert elapsed < 180, f"took {elapsed:.0f}s"
