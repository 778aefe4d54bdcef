"""``python accelerate_read.py --out FILE -- WORDS``: what ``accelerate launch WORDS`` means, read by
Accelerate's own code in the user's interpreter, written to FILE as JSON for the launcher
(launcher/torch/accelerate_launch.py), which runs it under the torch agent with the world from ``PET_*``.

Accelerate computes the ranks' environment (mixed precision, FSDP, DeepSpeed, dynamo, FP8,
parallelism) from the flags and the config file, so every option keeps its meaning: this file
calls that code and reports, without launching anything,

- ``given``: the world and torchrun options the user set, each with where it came from (the flag
  as typed, or the config file): those win over ``PET_*``, as a typed torchrun flag does;
- ``env``: the variables Accelerate would add for the ranks (the world's own, MASTER_*, left out:
  torchrun sets them);
- ``program``: the script, its arguments, ``--module``/``--no_python``;
- ``alone``: what ``accelerate launch`` would have started on this node by itself (for ``plan``,
  and the comparison in docs/frameworks/accelerate.md).

Run by path in any interpreter that has accelerate: stdlib and accelerate only, plus the
launcher's stdlib-only ``core/versions.py`` (loaded by path) for the supported range. Accelerate's
``_validate_launch_command`` is private: it is used only inside that range (``1.0`` to ``1.15``
tested), and its shape is checked. Bad input exits 2 with ``{"error": ...}`` in FILE; anything
else that breaks here is this file's bug and exits 70 with a traceback.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import sys

# Run by path, this file's directory is sys.path[0]: its neighbours (accelerate_launch.py, args.py,
# ...) must not stand in for the user's packages.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

# accelerate's dests that say where the processes run and meet, by the torchrun flag each becomes
# (num_processes is the job's total: the launcher divides it by the node count).
WORLD = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")
# accelerate's torchrun options (their torchrun flags: accelerate_launch.TORCHRUN, the same dests).
TORCHRUN = ("rdzv_backend", "rdzv_conf", "max_restarts", "monitor_interval", "role", "tee", "log_dir")
# Variables of the world itself, which torchrun sets for every rank.
WORLD_ENV = ("MASTER_ADDR", "MASTER_PORT")
EX_USAGE, EX_SOFTWARE = 2, 70


class Refusal(Exception):
    """Bad input: ``name`` (a flag, a config file, accelerate), ``value``, what was expected."""

    def __init__(self, name: str, value, expected: str, version: bool = False):
        super().__init__(expected)
        self.name, self.value, self.expected, self.version = name, value, expected, version


def _versions():
    """launcher/core/versions.py, through the runners' loader (launcher/runner/program.py)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner", "program.py")
    spec = importlib.util.spec_from_file_location("_trainer_launcher_program", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the launcher's runner from {path}", path=path)
    program = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    return program.core("versions")


def check_version(say) -> str:
    versions = _versions()
    installed = versions.installed("accelerate")
    if installed is None:
        raise Refusal(
            "accelerate",
            None,
            f"accelerate installed for {sys.executable} (pip install accelerate): `accelerate launch` needs it",
        )
    line = versions.runner_refusal("accelerate", say, installed)
    if line:
        raise Refusal("accelerate", installed, line.split(": expected ", 1)[1], version=True)
    return installed


def parse(words: list[str]):
    """Accelerate's parser over ``words``; its usage errors become one line."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()

    def error(message: str):
        raise Refusal("accelerate launch", " ".join(words), f"arguments accelerate reads ({message})")

    parser.error = error
    args = parser.parse_args(words)
    defaults = vars(parser.parse_args([args.training_script]))
    typed = {dest for dest, value in vars(args).items() if defaults.get(dest) != value}
    return parser, args, typed


def option_of(parser, dest: str) -> str:
    for action in parser._actions:  # argparse's own list: stable since Python 3.2
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return f"--{dest}"


def validate(args):
    """Accelerate's own validation: the config file's values filled in, defaults chosen."""
    from accelerate.commands import launch

    before = copy.copy(vars(args))
    try:
        result = launch._validate_launch_command(args)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as error:
        where = args.config_file or "accelerate launch"
        raise Refusal(
            "accelerate config" if args.config_file else "accelerate launch",
            where,
            f"a launch accelerate accepts ({type(error).__name__}: {error})",
        ) from None
    if not (isinstance(result, tuple) and len(result) == 3):
        raise RuntimeError(
            f"accelerate {launch.__name__}._validate_launch_command returned {type(result).__name__}, "
            "not (args, defaults, mp_from_config_flag)"
        )
    args, defaults, from_config = result
    return args, defaults, from_config, before


def config_path(args, defaults) -> str | None:
    if defaults is None:
        return None
    if args.config_file:
        return args.config_file
    from accelerate.commands.config import default_config_file

    return default_config_file


def mode_of(args, defaults, cuda: bool) -> str:
    if getattr(args, "tpu", False):
        raise Refusal("--tpu", True, "a GPU or CPU launch: TPU pods are not run through torchrun")
    if defaults is not None and str(getattr(defaults, "compute_environment", "")).endswith("AMAZON_SAGEMAKER"):
        raise Refusal("compute_environment", "AMAZON_SAGEMAKER", "LOCAL_MACHINE: a TrainJob's pods are the machines")
    if args.cpu or getattr(args, "use_cpu", False):
        return "cpu"
    if args.use_deepspeed:
        return "deepspeed"
    if args.use_fsdp:
        return "fsdp"
    if args.use_megatron_lm:
        return "megatron_lm"
    return "multi_gpu" if cuda else "cpu"


def ranks_env(args, mode: str, from_config: bool, defaults) -> dict[str, str]:
    """What Accelerate adds to the ranks' environment, computed by Accelerate from a copy of the
    arguments made to look like one node of several (its single-machine port probe and standalone
    switch, which only apply when it runs torchrun itself, stay out of it)."""
    from accelerate.utils import launch as prepare

    probe = copy.copy(args)
    probe.num_machines, probe.machine_rank = max(2, probe.num_machines or 1), 1
    probe.main_process_ip = probe.main_process_ip or "127.0.0.1"
    probe.main_process_port = probe.main_process_port or 29500
    probe.num_processes = max(probe.num_processes or 0, probe.num_machines)
    if mode == "deepspeed":
        probe.deepspeed_multinode_launcher = "standard"  # torchrun's, the one a TrainJob's pods run
        fields = list(defaults.deepspeed_config.keys()) if defaults is not None else []
        probe.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if from_config else []))
        _, env = prepare.prepare_deepspeed_cmd_env(probe)
    elif mode == "cpu":
        # As `--cpu` gives it, also on a node without GPUs where the user did not type it: without
        # ACCELERATE_USE_CPU each rank of a torchrun world would see a world of one.
        probe.mpirun_hostfile, probe.cpu = None, True
        _, env = prepare.prepare_simple_launcher_cmd_env(probe)
    else:
        env = prepare.prepare_multi_gpu_env(probe)
        if not _p2p_ok():
            for name in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
                env.setdefault(name, "1")
    return {name: value for name, value in env.items() if os.environ.get(name) != value and name not in WORLD_ENV}


def _p2p_ok() -> bool:
    try:
        from accelerate.utils import check_cuda_p2p_ib_support
    except ImportError:
        return True
    return bool(check_cuda_p2p_ib_support())


def what_alone_runs(args) -> dict:
    """What ``accelerate launch`` would start by itself on this node, in its own order of launchers:
    it reads no PET_*, so its world is the flags' and config file's, defaults filled in."""
    machines = args.num_machines or 1
    if machines > 1 and not args.main_process_ip:
        return {"processes": 0, "world": 0, "machines": machines, "error": "no main_process_ip for several machines"}
    torchrun = not args.cpu and (args.use_deepspeed or args.use_fsdp or args.use_megatron_lm or args.multi_gpu)
    if not torchrun and not args.mpirun_hostfile:  # the simple launcher: one process
        return {"processes": 1, "world": 1, "machines": 1}
    processes = args.num_processes or 0
    return {"processes": processes // machines, "world": processes, "machines": machines}


def config_keys(path: str | None) -> set[str]:
    """The keys the user's config file sets (accelerate fills in the rest from its defaults)."""
    if path is None or not os.path.isfile(path):
        return set()
    with open(path) as file:
        if path.endswith(".json"):
            data = json.load(file)
        else:
            import yaml  # accelerate's own dependency, how it reads the file

            data = yaml.safe_load(file)
    return set(data) if isinstance(data, dict) else set()


def read(words: list[str], say=lambda line: print(line, file=sys.stderr)) -> dict:
    version = check_version(say)
    parser, args, typed = parse(words)
    args, defaults, mp_from_config, before = validate(args)
    config = config_path(args, defaults)
    keys = config_keys(config)
    given = {}
    for dest in (*WORLD, *TORCHRUN):
        value = getattr(args, dest, None)
        if dest in typed:
            given[dest] = {"value": value, "from": option_of(parser, dest)}
        elif dest in keys and value is not None and before.get(dest) != value:
            given[dest] = {"value": value, "from": f"{dest} in {config}"}
    threads = "num_cpu_threads_per_process" in typed or "num_cpu_threads_per_process" in keys
    import torch

    cuda = torch.cuda.is_available()
    mode = mode_of(args, defaults, cuda)
    if args.module and args.no_python:
        raise Refusal("--module", True, "either --module or --no_python, not both")
    try:
        env = ranks_env(args, mode, mp_from_config, defaults)
    except (ValueError, RuntimeError) as error:  # Accelerate's own refusals (an fp8 it cannot run...)
        raise Refusal("accelerate launch", " ".join(words), f"a launch accelerate accepts ({error})") from None
    if not threads:
        env.pop("OMP_NUM_THREADS", None)  # the launcher's share of the CPUs, not Accelerate's 1
    alone = what_alone_runs(args)
    return {
        "accelerate": version,
        "mode": mode,
        "config": config,
        "given": given,
        "env": dict(sorted(env.items())),
        "program": {
            "script": args.training_script,
            "args": list(args.training_script_args),
            "module": bool(args.module),
            "noPython": bool(args.no_python),
        },
        "alone": alone,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="accelerate_read.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("words", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    words = options.words[1:] if options.words[:1] == ["--"] else options.words
    try:
        warnings: list[str] = []
        document, code = read(words, say=lambda line: warnings.append(line.removeprefix("warning: "))), 0
        document["warnings"] = warnings  # the launcher says them (this file's own output is kept back)
    except Refusal as refusal:
        document = {
            "error": {
                "name": refusal.name,
                "value": refusal.value,
                "expected": refusal.expected,
                "version": refusal.version,
            }
        }
        code = EX_USAGE
    temporary = f"{options.out}.tmp"
    with open(temporary, "w") as out:
        json.dump(document, out, default=str)
    os.replace(temporary, options.out)
    return code


if __name__ == "__main__":
    # A process that reads a line and exits: the cyclic collector would only walk, again and again,
    # the millions of objects accelerate's and torch's imports make (0.8 CPU-s of 2.2).
    import gc

    gc.disable()
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - anything else is this file's bug, said as such (exit 70)
        import traceback

        traceback.print_exc()
        sys.exit(EX_SOFTWARE)
