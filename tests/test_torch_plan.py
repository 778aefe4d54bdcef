"""The pure torch planner: PET_* settings + host facts + the user's torchrun words -> torchrun argv.

Settings are loaded in-process from a monkeypatched environment (every PET_* cleared first), and
the host is a hand-made :class:`HostFacts`, so these tests say exactly which GPUs and CPUs the
"machine" has.
"""

from __future__ import annotations

import json
import os

import pytest

from launcher.core import settings
from launcher.core.devices import Accelerators, HostFacts
from launcher.core.outcome import ConfigError
from launcher.torch.settings import TorchSettings
from launcher.torch.plan import (
    C10D_DEFAULT_PORT, TorchPlan, Wait, plan_torch, resolve_nproc, split_torchrun_args,
)

MASTER = "tj-node-0-0.tj"  # what Trainer injects as PET_MASTER_ADDR for TrainJob "tj"
CONSUMED = (
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_MAX_RESTARTS",
    "PET_STANDALONE",
)


def trainer_env(nnodes: int | str, rank: int, nproc: str = "1") -> dict[str, str]:
    """What Trainer's torch policy injects into node ``rank``."""
    return {
        "PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": MASTER, "PET_MASTER_PORT": "29500",
    }


def host(gpus: int = 0, quota: float | None = None, affinity: int = 8, omp: bool = False,
         accelerators: Accelerators | None = None) -> HostFacts:
    return HostFacts(hostname="tj-node-0-0", gpu_count=gpus, cpu_quota=quota, cpu_affinity=affinity,
                     omp_num_threads_set=omp, accelerators=accelerators)


@pytest.fixture
def make_plan(monkeypatch):
    """Plan with exactly ``env`` (no other PET_*), as ``trainer-launcher torch -- *args`` would."""

    def make(env: dict[str, str] | None = None, args: tuple[str, ...] = ("train.py",),
             facts: HostFacts | None = None, keep_nproc: bool = False, generation: int = 0) -> TorchPlan:
        for name in list(os.environ):
            if name.startswith("PET_") or name == "JOB_COMPLETION_INDEX":
                monkeypatch.delenv(name)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        run = split_torchrun_args(list(args))
        torch = settings.load(TorchSettings, run.overrides)
        sources = {
            name: source for name in TorchSettings.model_fields
            if (source := settings.source_of(TorchSettings, name, run.overrides))
        }
        return plan_torch(torch, facts or host(), run, sources, keep_nproc=keep_nproc, generation=generation)

    return make


def flags_before_script(plan: TorchPlan) -> list[str]:
    return list(plan.torchrun_args)


def value_of(plan: TorchPlan, flag: str) -> str:
    args = flags_before_script(plan)
    assert args.count(flag) == 1, f"{flag} should appear once in {args}"
    return args[args.index(flag) + 1]


# --- modes --------------------------------------------------------------------------------------


def test_one_node_with_nothing_set_is_standalone(make_plan):
    plan = make_plan({})

    assert plan.mode == "standalone"
    assert plan.argv == ("torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", "1", "train.py")
    assert plan.wait == Wait(resolve=None, connect=None)


def test_one_node_with_a_master_address_is_static_and_rank_0_only_waits_for_dns(make_plan):
    plan = make_plan(trainer_env(1, 0))

    assert plan.mode == "static"
    assert plan.argv == (
        "torchrun", "--nnodes", "1", "--nproc-per-node", "1", "--node-rank", "0",
        "--rdzv-backend", "static", "--master-addr", MASTER, "--master-port", "29500", "train.py",
    )
    assert plan.wait.resolve == MASTER
    assert plan.wait.connect is None


def test_rank_2_of_4_is_static_and_waits_for_the_master_port(make_plan):
    plan = make_plan(trainer_env(4, 2))

    assert plan.mode == "static"
    assert value_of(plan, "--nnodes") == "4"
    assert value_of(plan, "--node-rank") == "2"
    assert value_of(plan, "--master-addr") == MASTER
    assert value_of(plan, "--master-port") == "29500"
    assert plan.wait == Wait(resolve=MASTER, connect=(MASTER, 29500), store=(MASTER, 29500))
    assert plan.node_rank == 2


def test_job_completion_index_is_the_node_rank_when_pet_node_rank_is_absent(make_plan):
    env = trainer_env(4, 0)
    del env["PET_NODE_RANK"]
    plan = make_plan({**env, "JOB_COMPLETION_INDEX": "3"})

    assert value_of(plan, "--node-rank") == "3"
    assert plan.wait.connect == (MASTER, 29500)


def test_pet_standalone_wins_over_a_master_address(make_plan):
    plan = make_plan({**trainer_env(1, 0), "PET_STANDALONE": "true"})

    assert plan.mode == "standalone"
    assert "--master-addr" not in plan.argv
    assert plan.wait == Wait()


def test_a_fixed_size_jobs_max_restarts_are_the_launchers_and_torchrun_restarts_nothing_alone(make_plan):
    assert make_plan(trainer_env(2, 1)).max_restarts is None
    for given in ({"PET_MAX_RESTARTS": "3"}, {}):
        args = ("--max-restarts", "3", "t.py") if not given else ("t.py",)
        plan = make_plan({**trainer_env(2, 1), **given}, args=args)
        assert "--max-restarts" not in plan.argv
        assert plan.max_restarts == 3


# --- processes per node -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nproc, facts, expected",
    [
        pytest.param("auto", host(gpus=8, quota=32.0, affinity=64), 8, id="auto-with-8-gpus-is-8"),
        pytest.param("auto", host(gpus=0, quota=3.5, affinity=64), 3, id="auto-without-gpus-is-whole-cpu-quota"),
        pytest.param("auto", host(gpus=0, quota=None, affinity=6), 6, id="auto-without-quota-is-affinity"),
        pytest.param("auto", host(gpus=0, quota=0.5, affinity=6), 1, id="auto-with-half-a-cpu-is-1"),
        pytest.param("cpu", host(gpus=0, quota=6.0, affinity=64), 6, id="cpu-is-the-quota"),
        pytest.param("cpu", host(gpus=8, quota=6.0, affinity=64), 6, id="cpu-ignores-gpus"),
        pytest.param("cpu", host(gpus=0, quota=16.0, affinity=4), 4, id="cpu-quota-capped-by-affinity"),
        pytest.param("gpu", host(gpus=4, quota=2.0), 4, id="gpu-is-the-visible-gpus"),
        pytest.param("GPU", host(gpus=2), 2, id="words-are-case-insensitive"),
        pytest.param("3", host(gpus=8), 3, id="a-count-is-taken-as-is"),
    ],
)
def test_nproc_per_node_resolves_to_a_count(make_plan, nproc, facts, expected):
    plan = make_plan({"PET_NPROC_PER_NODE": nproc}, facts=facts)

    assert plan.nproc_per_node == expected
    assert value_of(plan, "--nproc-per-node") == str(expected)


def test_nproc_gpu_without_a_gpu_is_a_config_error_naming_the_variable(make_plan):
    with pytest.raises(ConfigError) as error:
        make_plan({"PET_NPROC_PER_NODE": "gpu"}, facts=host(gpus=0))
    assert error.value.name == "PET_NPROC_PER_NODE"
    assert error.value.value == "gpu"


@pytest.mark.parametrize(
    "requested, facts, count",
    [
        (4, host(gpus=8), 4),
        ("auto", host(gpus=2, quota=1.0), 2),
        ("auto", host(gpus=0, quota=2.5), 2),
        ("cpu", host(gpus=8, quota=None, affinity=12), 12),
        ("gpu", host(gpus=1), 1),
    ],
)
def test_resolve_nproc(requested, facts, count):
    assert resolve_nproc(requested, facts, "PET_NPROC_PER_NODE")[0] == count


def test_resolve_nproc_says_where_the_count_came_from():
    assert resolve_nproc("auto", host(gpus=8), "PET_NPROC_PER_NODE")[1] == \
        "PET_NPROC_PER_NODE=auto: 8 visible NVIDIA GPUs (/dev/nvidiaN)"
    assert "CPU quota 3.5" in resolve_nproc("cpu", host(quota=3.5), "--nproc-per-node")[1]
    assert resolve_nproc(1, host(), "nproc_per_node")[1] == "default"


# --- nproc when Trainer passed the CPU request (MIG, Neuron, Gaudi) -----------------------------
# Trainer sets PET_NPROC_PER_NODE to the CPU request when no resource name contains "gpu". The
# accelerators are faked as host facts (none exist here; launcher.core.devices counts them, see
# tests/test_devices.py).

TWO_MIG = Accelerators("NVIDIA MIG device", 2, "NVIDIA_VISIBLE_DEVICES")


def test_more_processes_than_visible_accelerators_become_one_per_accelerator(make_plan):
    plan = make_plan({**trainer_env(2, 1), "PET_NPROC_PER_NODE": "8"}, facts=host(gpus=2, accelerators=TWO_MIG))

    assert plan.nproc_per_node == 2
    assert value_of(plan, "--nproc-per-node") == "2"
    assert plan.warnings == (
        "PET_NPROC_PER_NODE=8 but only 2 NVIDIA MIG devices are visible (NVIDIA_VISIBLE_DEVICES): "
        "one process per NVIDIA MIG device; LAUNCHER_KEEP_NPROC=1 keeps 8",)
    assert plan.warnings[0] in plan.sources["nproc_per_node"]


def test_keep_nproc_keeps_the_controllers_number_and_says_so(make_plan):
    plan = make_plan({"PET_NPROC_PER_NODE": "8"}, facts=host(gpus=2, accelerators=TWO_MIG), keep_nproc=True)

    assert plan.nproc_per_node == 8
    assert "kept" in plan.warnings[0] and "LAUNCHER_KEEP_NPROC" in plan.warnings[0]


@pytest.mark.parametrize(
    "env, args, facts, expected",
    [
        pytest.param({"PET_NPROC_PER_NODE": "8"}, ("--nproc-per-node=8", "t.py"), host(gpus=2, accelerators=TWO_MIG), 8,
                     id="a-typed-count-is-the-users-word"),
        pytest.param({"PET_NPROC_PER_NODE": "16"}, ("t.py",), host(quota=16.0), 16, id="a-cpu-node-keeps-its-count"),
    ],
)
def test_nproc_is_fitted_only_when_the_controller_asked_for_more_than_there_are(make_plan, env, args, facts, expected):
    plan = make_plan(env, args=args, facts=facts)
    assert plan.nproc_per_node == expected
    assert plan.warnings == ()


# Issue 36: PET_NPROC_PER_NODE=1 on a pod with 4 visible GPUs (kubeflow/trainer PR #3974: the
# controller counts GPUs by resource name only) ran 1 process and said nothing of the 3 idle GPUs.
FOUR_GPUS = host(gpus=4)  # the facts probe_host gives for 4 /dev/nvidiaN nodes (none exist here)


def test_fewer_processes_than_visible_gpus_from_the_controller_are_kept_with_a_warning(make_plan):
    plan = make_plan({**trainer_env(2, 1), "PET_NPROC_PER_NODE": "1"}, facts=FOUR_GPUS)

    assert plan.nproc_per_node == 1 and value_of(plan, "--nproc-per-node") == "1"
    assert plan.warnings == (
        "PET_NPROC_PER_NODE=1 but 4 NVIDIA GPUs are visible (/dev/nvidiaN): 1 process leaves 3 idle, unless "
        "it uses several. For one process per NVIDIA GPU set the TrainJob's numProcPerNode to 4, or check the "
        "resource name the runtime requests (Trainer counts GPUs only under a name with \"gpu\" in it); to "
        "run 1 on purpose, pass --nproc-per-node 1 to torchrun",)
    assert plan.warnings[0] in plan.sources["nproc_per_node"]


def test_fewer_processes_than_hpus_are_kept_with_a_warning_whatever_the_kind(make_plan):
    plan = make_plan({"PET_NPROC_PER_NODE": "2"}, facts=host(accelerators=Accelerators("Gaudi HPU", 8, "/dev/accel")))

    assert plan.nproc_per_node == 2
    assert plan.warnings[0].startswith("PET_NPROC_PER_NODE=2 but 8 Gaudi HPUs are visible (/dev/accel): "
                                       "2 processes leave 6 idle")


@pytest.mark.parametrize(
    "env, args, expected",
    [
        pytest.param({"PET_NPROC_PER_NODE": "4"}, ("--nproc-per-node", "1", "t.py"), 1,
                     id="a-typed-count-is-the-users-deliberate-choice"),
        pytest.param({"PET_NPROC_PER_NODE": "auto"}, ("t.py",), 4, id="auto-is-one-per-gpu"),
        pytest.param({"PET_NPROC_PER_NODE": "4"}, ("t.py",), 4, id="one-per-gpu"),
    ],
)
def test_no_word_when_every_gpu_has_its_process_or_the_user_typed_the_count(make_plan, env, args, expected):
    plan = make_plan(env, args=args, facts=FOUR_GPUS)
    assert plan.nproc_per_node == expected
    assert plan.warnings == ()


def test_uncountable_neuron_cores_keep_the_count_and_say_why(make_plan):
    neuron = Accelerators("Neuron core", None, "2 /dev/neuronN devices, core count unreadable")
    plan = make_plan({"PET_NPROC_PER_NODE": "32"}, facts=host(accelerators=neuron))

    assert plan.nproc_per_node == 32
    assert "could not be counted" in plan.warnings[0]


def test_auto_is_one_process_per_neuron_core(make_plan):
    neuron = Accelerators("Neuron core", 32, "16 /dev/neuronN devices x sysfs core_count")
    assert make_plan({"PET_NPROC_PER_NODE": "auto"}, facts=host(quota=8.0, accelerators=neuron)).nproc_per_node == 32


# --- OMP_NUM_THREADS ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nproc, facts, threads",
    [
        pytest.param("4", host(quota=16.0, affinity=64), "4", id="16-cpus-4-procs-get-4-threads"),
        pytest.param("2", host(quota=3.5, affinity=64), "1", id="3.5-cpus-2-procs-get-1-thread"),
        pytest.param("1", host(quota=3.5, affinity=64), "3", id="3.5-cpus-1-proc-gets-3-threads"),
        pytest.param("8", host(quota=4.0, affinity=64), "1", id="more-procs-than-cpus-still-1-thread"),
        pytest.param("2", host(quota=None, affinity=12), "6", id="no-quota-uses-affinity"),
        pytest.param("auto", host(gpus=8, quota=64.0, affinity=96), "8", id="8-gpus-64-cpus-get-8-threads"),
    ],
)
def test_each_rank_gets_its_share_of_the_cpus_as_omp_threads(make_plan, nproc, facts, threads):
    plan = make_plan({"PET_NPROC_PER_NODE": nproc}, facts=facts)
    assert plan.env_set["OMP_NUM_THREADS"] == threads


def test_omp_num_threads_set_by_the_user_is_left_alone(make_plan):
    plan = make_plan({"PET_NPROC_PER_NODE": "2"}, facts=host(quota=16.0, omp=True))
    assert "OMP_NUM_THREADS" not in plan.env_set


# --- elastic and c10d rendezvous ----------------------------------------------------------------


def test_min_max_nodes_is_c10d_on_the_master_with_a_stable_id(make_plan):
    plan = make_plan(trainer_env("1:4", 1))

    assert plan.mode == "c10d"
    assert plan.nnodes == "1:4"
    assert value_of(plan, "--nnodes") == "1:4"
    assert value_of(plan, "--rdzv-backend") == "c10d"
    assert value_of(plan, "--rdzv-endpoint") == f"{MASTER}:29500"
    assert value_of(plan, "--rdzv-id") == "tj"
    assert "--max-restarts" not in plan.argv  # nobody set it: torchrun's own default (0) applies
    assert "--master-addr" not in plan.argv
    assert "--node-rank" not in plan.argv  # the rendezvous assigns node ranks
    assert plan.wait == Wait(resolve=MASTER, connect=(MASTER, 29500), store=(MASTER, 29500))


def test_an_ip_master_address_never_becomes_the_rdzv_id(make_plan):
    """Another node may know the same master by name: the id must not depend on the spelling."""
    env = {**trainer_env(2, 1), "PET_MASTER_ADDR": "10.0.0.7", "PET_RDZV_BACKEND": "c10d"}
    plan = make_plan(env)
    assert value_of(plan, "--rdzv-id") == "none"
    assert "default" in plan.sources["rdzv_id"]


def test_the_derived_rdzv_id_is_the_same_on_every_node(make_plan):
    ids = {value_of(make_plan(trainer_env("2:4", rank)), "--rdzv-id") for rank in range(4)}
    assert ids == {"tj"}


def test_elastic_rank_0_only_waits_for_dns(make_plan):
    plan = make_plan(trainer_env("1:4", 0))
    assert plan.wait == Wait(resolve=MASTER, connect=None, store=(MASTER, 29500))


def test_elastic_max_restarts_and_rdzv_conf_are_passed_on(make_plan):
    plan = make_plan({**trainer_env("2:4", 1), "PET_MAX_RESTARTS": "3", "PET_RDZV_CONF": "join_timeout=900"})

    assert value_of(plan, "--max-restarts") == "3"
    assert value_of(plan, "--rdzv-conf") == "join_timeout=900"


def test_c10d_endpoint_without_a_port_uses_the_c10d_default_port(make_plan):
    plan = make_plan({**trainer_env(2, 1), "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "rdzv-host"})

    assert plan.mode == "c10d"
    assert value_of(plan, "--rdzv-endpoint") == "rdzv-host"
    assert plan.wait == Wait(resolve="rdzv-host", connect=("rdzv-host", C10D_DEFAULT_PORT),
                             store=("rdzv-host", C10D_DEFAULT_PORT))
    assert C10D_DEFAULT_PORT == 29400


def test_c10d_endpoint_with_a_port_waits_on_that_port(make_plan):
    plan = make_plan({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_RDZV_BACKEND": "c10d",
                      "PET_RDZV_ENDPOINT": "rdzv-host:1234"})

    assert plan.wait == Wait(resolve="rdzv-host", connect=("rdzv-host", 1234), store=("rdzv-host", 1234))
    assert value_of(plan, "--rdzv-id") == "none"  # never derived from how this node spells the endpoint


def test_pet_rdzv_id_is_honoured(make_plan):
    plan = make_plan({**trainer_env("1:4", 1), "PET_RDZV_ID": "my-run-7"})
    assert value_of(plan, "--rdzv-id") == "my-run-7"


@pytest.mark.parametrize("master", ["fd00::1", "[fd00::1]"])
def test_elastic_with_an_ipv6_master_waits_on_the_master_port(make_plan, master):
    """torchrun reads fd00::1:29500 as host fd00::1, port 29500; the launcher's wait must agree,
    or every node waits for a DNS name that cannot exist until the rendezvous timeout."""
    plan = make_plan({**trainer_env("1:4", 1), "PET_MASTER_ADDR": master})

    assert plan.wait == Wait(resolve="fd00::1", connect=("fd00::1", 29500), store=("fd00::1", 29500))


def test_elastic_without_any_address_is_a_config_error(make_plan):
    with pytest.raises(ConfigError) as error:
        make_plan({"PET_NNODES": "1:4"})
    assert error.value.name == "PET_MASTER_ADDR"


def test_node_rank_at_or_above_the_node_count_is_a_config_error(make_plan):
    with pytest.raises(ConfigError) as error:
        make_plan(trainer_env(4, 4))
    assert error.value.name == "PET_NODE_RANK"


def test_no_script_is_a_config_error(make_plan):
    with pytest.raises(ConfigError) as error:
        make_plan({}, args=("--tee", "3"))
    assert error.value.name == "SCRIPT"


# --- an explicit rendezvous is the user's choice ------------------------------------------------


def test_an_endpoint_without_a_backend_is_torchruns_static_master(make_plan):
    """torchrun reads static + --rdzv-endpoint as the master's host:port; so does the plan."""
    plan = make_plan({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_RDZV_ENDPOINT": "master.example:4321"})

    assert plan.mode == "static"
    assert value_of(plan, "--node-rank") == "1"
    assert value_of(plan, "--rdzv-endpoint") == "master.example:4321"
    assert "--master-addr" not in plan.argv
    assert plan.wait == Wait(resolve="master.example", connect=("master.example", 4321),
                             store=("master.example", 4321))


def test_an_explicit_static_backend_stays_static_for_an_elastic_node_count(make_plan):
    plan = make_plan(trainer_env("1:2", 1), args=("--rdzv-backend=static", "t.py"))
    assert plan.mode == "static"
    assert value_of(plan, "--rdzv-backend") == "static"


def test_a_static_endpoint_without_a_port_is_a_config_error_naming_it(make_plan):
    with pytest.raises(ConfigError) as error:
        make_plan({"PET_NNODES": "2"}, args=("--rdzv-backend=static", "--rdzv-endpoint=master", "t.py"))
    assert error.value.name == "--rdzv-endpoint"


def test_an_etcd_server_is_waited_for_on_every_node_at_its_default_port(make_plan):
    plan = make_plan({**trainer_env(2, 0), "PET_RDZV_BACKEND": "etcd-v2", "PET_RDZV_ENDPOINT": "etcd.example"})
    assert plan.wait == Wait(resolve="etcd.example", connect=("etcd.example", 2379))


def test_one_node_with_only_a_master_port_is_static_on_torchruns_default_address(make_plan):
    plan = make_plan({}, args=("--master-port=1234", "t.py"))

    assert plan.mode == "static"
    assert value_of(plan, "--master-addr") == "127.0.0.1"
    assert value_of(plan, "--master-port") == "1234"


@pytest.mark.parametrize("env", [{}, trainer_env(2, 1), trainer_env("1:2", 1)], ids=["standalone", "static", "c10d"])
def test_pet_max_restarts_rdzv_id_and_conf_reach_torchrun_in_every_mode(make_plan, env):
    plan = make_plan({**env, "PET_MAX_RESTARTS": "3", "PET_RDZV_ID": "run-7", "PET_RDZV_CONF": "join_timeout=900"})

    if ":" in env.get("PET_NNODES", ""):  # elastic: torchrun's restarts are its new rendezvous
        assert value_of(plan, "--max-restarts") == "3"
    else:  # the launcher's, on every node at once
        assert "--max-restarts" not in plan.argv and plan.max_restarts == 3
    assert value_of(plan, "--rdzv-id") == "run-7"  # torchrun also names its log directory after it
    assert value_of(plan, "--rdzv-conf") == "join_timeout=900"


def test_a_typed_node_rank_reaches_a_c10d_torchrun_which_ignores_it_as_before(make_plan):
    plan = make_plan(trainer_env("1:2", 1), args=("--node_rank=1", "t.py"))
    assert plan.mode == "c10d"
    assert value_of(plan, "--node-rank") == "1"


def test_a_script_named_like_a_flag_after_dashdash_keeps_its_dashdash(make_plan):
    plan = make_plan({}, args=("--", "-weird.py", "--lr", "1"))

    assert plan.program == ("-weird.py", "--lr", "1")
    assert plan.argv[-4:] == ("--", "-weird.py", "--lr", "1")


# --- the user's torchrun flags ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--nproc-per-node", "3", "train.py"), id="dash-separated"),
        pytest.param(("--nproc_per_node=3", "train.py"), id="underscore-with-equals"),
        pytest.param(("--nproc_per_node", "3", "train.py"), id="underscore-separate-value"),
    ],
)
def test_a_user_flag_overrides_the_env_and_is_not_duplicated(make_plan, args):
    plan = make_plan({**trainer_env(2, 1, nproc="8")}, args=args)

    assert value_of(plan, "--nproc-per-node") == "3"
    assert not any(arg.startswith("--nproc_per_node") for arg in plan.argv)
    assert plan.sources["nproc_per_node"] == args[0].partition("=")[0]


def test_a_user_master_port_overrides_the_env(make_plan):
    plan = make_plan(trainer_env(2, 1), args=("--master-port=1234", "train.py"))

    assert value_of(plan, "--master-port") == "1234"
    assert not any(arg.startswith("--master-port=") for arg in plan.argv)
    assert plan.wait.connect == (MASTER, 1234)


def test_a_user_standalone_switch_wins_over_the_trainer_env(make_plan):
    plan = make_plan(trainer_env(1, 0), args=("--standalone", "train.py"))

    assert plan.mode == "standalone"
    assert plan.argv.count("--standalone") == 1
    assert plan.program == ("train.py",)


def test_torchrun_flags_the_launcher_does_not_plan_pass_through_in_order(make_plan):
    plan = make_plan({}, args=("--tee", "3", "--log_dir", "/x", "--monitor-interval=1", "train.py", "--lr", "0.1"))

    assert plan.argv[-9:] == ("--tee", "3", "--log-dir", "/x", "--monitor-interval", "1", "train.py", "--lr", "0.1")
    assert plan.program == ("train.py", "--lr", "0.1")


@pytest.mark.parametrize(
    "args, passthrough, program",
    [
        pytest.param(("-m", "pkg.train", "--epochs", "2"), ("--module",), ("pkg.train", "--epochs", "2"),
                     id="module-switch"),
        pytest.param(("--no-python", "echo", "hi"), ("--no-python",), ("echo", "hi"), id="no-python-switch"),
        pytest.param(("--tee", "3", "-m", "pkg.train"), ("--tee", "3", "--module"), ("pkg.train",),
                     id="value-flag-then-switch"),
        pytest.param(("--tee", "3", "--", "train.py", "--nnodes", "5"), ("--tee", "3"),
                     ("train.py", "--nnodes", "5"), id="dashdash-separates-script-args"),
        pytest.param(("train.py", "--nnodes", "5", "--standalone"), (), ("train.py", "--nnodes", "5", "--standalone"),
                     id="flags-after-the-script-belong-to-the-script"),
    ],
)
def test_split_finds_the_script(args, passthrough, program):
    run = split_torchrun_args(list(args))

    assert run.passthrough == passthrough
    assert run.program == program
    assert run.overrides == {}


def test_split_collects_setting_flags_with_their_spelling():
    run = split_torchrun_args(["--nnodes=2:4", "--node_rank", "1", "--standalone", "--tee", "3", "train.py"])

    assert {name: (o.value, o.source) for name, o in run.overrides.items()} == {
        "nnodes": ("2:4", "--nnodes"),
        "node_rank": ("1", "--node_rank"),
        "standalone": (True, "--standalone"),
    }
    assert run.passthrough == ("--tee", "3")
    assert run.program == ("train.py",)


def test_split_rejects_a_value_flag_with_nothing_after_it():
    with pytest.raises(ConfigError) as error:
        split_torchrun_args(["--nnodes"])
    assert error.value.name == "--nnodes"


def test_script_args_that_look_like_flags_stay_with_the_script(make_plan):
    plan = make_plan({}, args=("train.py", "--nnodes", "5", "--nproc-per-node", "7"))

    assert plan.mode == "standalone"
    assert plan.nproc_per_node == 1
    assert plan.program == ("train.py", "--nnodes", "5", "--nproc-per-node", "7")
    assert flags_before_script(plan) == ["--standalone", "--nnodes", "1", "--nproc-per-node", "1"]


def test_a_module_is_found_as_the_program(make_plan):
    plan = make_plan(trainer_env(2, 1), args=("-m", "pkg.train", "--epochs", "2"))

    assert plan.argv[-4:] == ("--module", "pkg.train", "--epochs", "2")
    assert plan.program == ("pkg.train", "--epochs", "2")


# --- what the plan hands to the child -----------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="standalone"),
        pytest.param(trainer_env(4, 2), id="static"),
        pytest.param(trainer_env("1:4", 1), id="c10d"),
    ],
)
def test_consumed_pet_variables_are_unset_for_torchrun(make_plan, env):
    plan = make_plan(env)
    assert set(CONSUMED) <= set(plan.env_unset)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="standalone"),
        pytest.param(trainer_env(4, 2), id="static"),
        pytest.param({**trainer_env("1:4", 1), "PET_RDZV_CONF": "join_timeout=900"}, id="c10d"),
    ],
)
def test_the_plan_is_json(make_plan, env):
    plan = make_plan(env, args=("--tee", "3", "train.py", "--lr", "0.1"))
    data = json.loads(json.dumps(plan.to_json()))

    assert data["framework"] == "torch"
    assert data["mode"] == plan.mode
    assert data["argv"] == list(plan.argv)
    assert data["env"] == {"set": plan.env_set, "unset": list(plan.env_unset)}
    assert data["nprocPerNode"] == plan.nproc_per_node


# --- the NCCL flight recorder ------------------------------------------------------------------


def test_the_flight_recorder_is_on_by_default_under_both_names_with_a_per_job_dump_path(make_plan, monkeypatch):
    for name in [n for n in os.environ if n.startswith(("TORCH_FR_", "TORCH_NCCL_"))]:
        monkeypatch.delenv(name)
    for name, value in trainer_env(2, 1).items():
        monkeypatch.setenv(name, value)
    run = split_torchrun_args(["train.py"])
    torch = settings.load(TorchSettings, run.overrides)
    sources = {name: source for name in TorchSettings.model_fields
               if (source := settings.source_of(TorchSettings, name, run.overrides))}
    plan = plan_torch(torch, host(), run, sources, user_env=dict(os.environ))

    env = plan.to_json()["env"]["set"]
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # The TrainJob's own directory (its name comes from Trainer's master address), one file per rank.
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/tmp/trainer-launcher-fr/tj/rank_"
    # Only the current names: torch warns from every rank about the old ones.
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


def test_flight_recorder_settings_the_user_made_win_under_either_name(make_plan):
    base = make_plan({})  # loads settings the same way; reuse its inputs for a plan per user env
    run = split_torchrun_args(["train.py"])
    torch = settings.load(TorchSettings, run.overrides)
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/data/fr_"}
    plan = plan_torch(torch, host(), run, {}, user_env=user)

    env = plan.env_set
    # Set under the old names: the plan sets neither name of those two settings, so torch reads the user's.
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
                 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        assert name not in env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"  # the one they left alone keeps the default
    assert plan_torch(torch, host(), run, {}, user_env={"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}).env_set.get(
        "TORCH_NCCL_DUMP_ON_TIMEOUT") is None
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in base.env_set  # no environment given: nothing planned


# --- python -m torch.distributed.launch (launcher/torch/legacy_launch.py) --------------------------

def test_legacy_launch_takes_use_env_from_the_flags_only():
    from launcher.torch import legacy_launch

    line = legacy_launch.read(["--nproc-per-node", "2", "--use_env", "train.py", "--lr", "1"])
    assert (line.torchrun_words, line.use_env) == (("--nproc-per-node", "2", "train.py", "--lr", "1"), True)
    line = legacy_launch.read(["--nproc-per-node", "2", "train.py", "--use-env"])  # the script's own flag
    assert (line.torchrun_words, line.use_env) == (("--nproc-per-node", "2", "train.py", "--use-env"), False)


def test_legacy_launch_puts_use_env_among_the_flags_before_a_closing_double_dash():
    from launcher.torch import legacy_launch

    line = legacy_launch.LegacyLine(("x",), True)
    assert line.module_args(("--nnodes", "1", "--"), ("-weird.py",)) == ["--nnodes", "1", "--use-env", "--", "-weird.py"]
    assert legacy_launch.LegacyLine(("x",), False).module_args(("--nnodes", "1"), ("t.py",)) == ["--nnodes", "1", "t.py"]


def test_legacy_launch_refuses_no_python_without_use_env_as_the_module_does():
    from launcher.torch import legacy_launch

    with pytest.raises(ConfigError, match="--no-python=True: expected --use-env with it"):
        legacy_launch.read(["--no-python", "./run.sh"])
    assert legacy_launch.read(["--no-python", "--use-env", "./run.sh"]).use_env


# --- restarts in place ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, args, flag, first",
    [
        pytest.param(trainer_env(2, 1), ("t.py",), "--master-port", "29500", id="static"),
        pytest.param(trainer_env(2, 1), ("--master-port", "2000", "t.py"), "--master-port", "2000", id="typed-port"),
        pytest.param({**trainer_env(2, 1), "PET_RDZV_BACKEND": "c10d"}, ("t.py",), "--rdzv-endpoint",
                     "tj-node-0-0.tj:29500", id="c10d"),
        pytest.param({**trainer_env(2, 1), "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "rdzv-host"}, ("t.py",),
                     "--rdzv-endpoint", "rdzv-host", id="c10d-default-port"),
    ],
)
def test_each_generation_meets_at_a_store_of_its_own_and_waits_for_it(make_plan, env, args, flag, first):
    """A restart in place must never join the last generation's store, which may still be serving
    the nodes that leave it: generation g's store listens g ports above the first one's."""
    plans = [make_plan(env, args=args, generation=g) for g in (0, 1, 2)]
    assert value_of(plans[0], flag) == first
    ports = [plan.wait.store[1] for plan in plans]
    assert ports[1] == ports[0] + 1 and ports[2] == ports[0] + 2
    assert [plan.wait.connect[1] for plan in plans] == ports  # node 1 waits for this generation's store
    assert value_of(plans[2], flag).rpartition(":")[2] == str(ports[2])
    assert all("--max-restarts" not in plan.argv for plan in plans)


def test_an_etcd_rendezvous_gets_a_new_id_per_generation_not_a_new_port(make_plan):
    env = {**trainer_env(2, 1), "PET_RDZV_BACKEND": "etcd-v2", "PET_RDZV_ENDPOINT": "etcd.example:2379",
           "PET_RDZV_ID": "job"}
    plan = make_plan(env, generation=2)
    assert value_of(plan, "--rdzv-endpoint") == "etcd.example:2379"
    assert value_of(plan, "--rdzv-id") == "job-2"


def test_a_port_without_room_for_the_restarts_is_one_line_naming_it(make_plan):
    with pytest.raises(ConfigError, match=r"PET_MASTER_PORT='65535': expected a port with room for 1 restarts"):
        make_plan({**trainer_env(2, 1), "PET_MASTER_PORT": "65535"}, generation=1)
