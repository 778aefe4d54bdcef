"""Command line: parse, call, exit. No logic lives here."""

from __future__ import annotations

import argparse
import json
import sys

from launcher import __version__
from launcher.knobs import INIT_KNOBS, KNOBS, MPI_KNOBS, SMOKE_KNOBS, Override


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _add_knobs(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("launcher options (each also a LAUNCHER_* variable; flags win)")
    for name, knob in KNOBS.items():
        group.add_argument(knob.flag, dest=name, metavar="VALUE", help=f"{knob.help} [env {knob.env}]")


def _add_mpi_knobs(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("MPI options (each also a LAUNCHER_* variable; flags win)")
    for name, knob in MPI_KNOBS.items():
        group.add_argument(knob.flag, dest=f"mpi_{name}", metavar="VALUE", help=f"{knob.help} [env {knob.env}]")


def _overrides(namespace: argparse.Namespace, knobs: dict = KNOBS, prefix: str = "") -> dict:
    return {
        name: Override(getattr(namespace, prefix + name), knob.flag)
        for name, knob in knobs.items()
        if getattr(namespace, prefix + name, None) is not None
    }


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainer-launcher", description="The in-pod side of distributed training on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"trainer-launcher {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    torch = commands.add_parser("torch", help="run torchrun from the PET_* environment, supervised",
                                usage="trainer-launcher torch [OPTIONS] -- [TORCHRUN FLAGS] SCRIPT [ARGS...]")
    _add_knobs(torch)

    plan = commands.add_parser("plan", help="print what would run, as JSON; no side effects",
                               usage="trainer-launcher plan [--framework torch] [OPTIONS] [-- [TORCHRUN FLAGS] [SCRIPT ...]]")
    plan.add_argument("--framework", choices=["torch", "mpi"], default="torch")
    _add_knobs(plan)
    _add_mpi_knobs(plan)

    mpi = commands.add_parser("mpi", help="MPI launcher role (mpirun from the Trainer hostfile), or --worker (sshd)",
                              usage="trainer-launcher mpi [OPTIONS] -- [MPIRUN FLAGS] PROGRAM [ARGS...]\n"
                                    "       trainer-launcher mpi --worker [OPTIONS]")
    mpi.add_argument("--worker", action="store_true", help="run the worker role: sshd on the ssh port with the mounted keys")
    _add_knobs(mpi)
    _add_mpi_knobs(mpi)

    run = commands.add_parser("exec", help="run any command with the same supervision and exit codes",
                              usage="trainer-launcher exec [OPTIONS] -- CMD [ARGS...]")
    _add_knobs(run)

    local = commands.add_parser("local", help="emulate an N-node TrainJob on this machine",
                                usage="trainer-launcher local --nnodes N --nproc-per-node P [OPTIONS] [--] SCRIPT [ARGS...]")
    local.add_argument("--nnodes", default="2", help="emulated nodes (default 2)")
    local.add_argument("--nproc-per-node", default="1", help="processes per node: a count, auto, cpu or gpu (default 1)")
    local.add_argument("--trainjob", default="local", help="the TrainJob name the pod names derive from (default local)")
    local.add_argument("--master-port", default=None, help="the master port (default: a free port)")
    local.add_argument("--isolation", choices=["auto", "namespaces", "none"], default="auto",
                       help="per-node hostname and /etc/hosts in namespaces (auto: when root)")
    local.add_argument("--mpi", choices=["openmpi", "intel", "mpich"], default=None,
                       help="emulate an MPI TrainJob (workers with sshd, a launcher pod) instead of torch; needs root")
    local.add_argument("--user", default="mpiuser", help="with --mpi: the unprivileged user sshd and mpirun run as")
    _add_knobs(local)
    _add_mpi_knobs(local)

    init = commands.add_parser("init", help="dataset/model initializer: STORAGE_URI -> /workspace/{dataset,model}",
                               usage="trainer-launcher init {dataset,model} [OPTIONS]")
    init.add_argument("kind", choices=["dataset", "model"])
    group = init.add_argument_group("initializer options (each also a LAUNCHER_INIT_* variable; flags win)")
    for name, knob in INIT_KNOBS.items():
        group.add_argument(knob.flag, dest=f"init_{name}", metavar="VALUE", help=f"{knob.help} [env {knob.env}]")
    _add_knobs(init)

    policy = commands.add_parser("policy", help="print the runtimes' Job/JobSet failure policy derived from the exit-code table, as JSON",
                                 usage="trainer-launcher policy [--job NAME] [--max-restarts N] [--retryable-exit-codes CODES]")
    policy.add_argument("--job", default="node", choices=["node", "launcher", "dataset-initializer", "model-initializer"],
                        help="the replicated job (default node)")
    policy.add_argument("--max-restarts", type=int, default=None, metavar="N", help="JobSet restarts for retryable failures")
    knob = KNOBS["retryable_exit_codes"]
    policy.add_argument(knob.flag, dest="retryable_exit_codes", metavar="VALUE", help=f"{knob.help} [env {knob.env}]")

    smoke = commands.add_parser("smoke", help="preflight this node: CPU/GPU, shm, disk, DNS, gloo/NCCL, thresholds",
                                usage="trainer-launcher smoke [--json] [THRESHOLDS] [OPTIONS]")
    smoke.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")
    group = smoke.add_argument_group("thresholds (each also a LAUNCHER_SMOKE_* variable; flags win)")
    for name, knob in SMOKE_KNOBS.items():
        group.add_argument(knob.flag, dest=f"smoke_{name}", metavar="VALUE", help=f"{knob.help} [env {knob.env}]")
    _add_knobs(smoke)
    return parser


_SWITCHES = ("-h", "--help", "--version", "--worker", "--json")


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The subcommand and its options, then what belongs to torchrun or the command: everything
    after ``--``, or else from the first word that is neither an option nor an option's value."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    i = 2 if argv[:1] == ["init"] else 1  # init takes its kind (dataset/model) as a word
    while i < len(argv) and argv[i].startswith("-"):
        takes_value = argv[i] not in _SWITCHES and "=" not in argv[i]
        i += 2 if takes_value else 1
    return argv[:i], argv[i:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    head, rest = _split(argv)
    args = _parser().parse_args(head)
    overrides = _overrides(args)
    if args.command == "torch":
        from launcher.torch_job import run_torch

        return run_torch(overrides, rest)
    if args.command == "exec":
        from launcher.exec_job import run_exec

        return run_exec(overrides, rest)
    if args.command == "mpi":
        from launcher import mpi_job

        mpi_overrides = _overrides(args, MPI_KNOBS, "mpi_")
        if args.worker:
            return mpi_job.run_worker(overrides, mpi_overrides)
        return mpi_job.run_mpi(overrides, mpi_overrides, rest)
    if args.command == "smoke":
        from launcher.smoke import run_smoke

        return run_smoke(overrides, _overrides(args, SMOKE_KNOBS, "smoke_"), args.json)
    if args.command == "init":
        from launcher.initializers.job import run_init

        return run_init(args.kind, overrides, _overrides(args, INIT_KNOBS, "init_"))
    if args.command == "local" and args.mpi:
        from launcher.local_mpi import run_local_mpi

        return run_local_mpi(overrides, _overrides(args, MPI_KNOBS, "mpi_"), rest, args.mpi, args.nnodes,
                             args.nproc_per_node, args.trainjob, args.user)
    if args.command == "local":
        from launcher.local import run_local

        return run_local(overrides, rest, args.nnodes, args.nproc_per_node, args.trainjob, args.master_port, args.isolation)
    if args.command == "policy":
        return _policy(overrides, args.job, args.max_restarts)
    if args.framework == "mpi":
        return _plan_mpi(overrides, _overrides(args, MPI_KNOBS, "mpi_"), rest)
    return _plan(overrides, rest)


def _print_json(overrides: dict, build) -> int:
    """``plan`` and ``policy``: print what ``build(launcher settings)`` returns, as JSON. Bad input
    is one line and exit 2, as everywhere; nothing is written to the termination log."""
    from launcher import settings
    from launcher.outcome import LauncherError
    from launcher.report import deliver
    from launcher.settings import LauncherSettings

    launcher = None
    try:
        launcher = settings.load(LauncherSettings, overrides)
        document = build(launcher)
    except LauncherError as error:
        return deliver(error.outcome(), None, launcher.retryable_exit_codes if launcher else None)
    print(json.dumps(document, indent=2))
    return 0


def _plan_mpi(overrides: dict, mpi_overrides: dict, rest: list[str]) -> int:
    from launcher.mpi_job import make_plan

    return _print_json(overrides, lambda launcher: make_plan(mpi_overrides, rest or ["PROGRAM"])[1].to_json())


def _plan(overrides: dict, rest: list[str]) -> int:
    from launcher.torch_job import make_plan

    def build(launcher) -> dict:
        plan, _ = make_plan(rest, require_program=False, launcher=launcher)
        return {**plan.to_json(), "launcher": {
            "rendezvousTimeout": launcher.rendezvous_timeout, "gracePeriod": launcher.grace_period,
            "retryableExitCodes": sorted(launcher.retryable_exit_codes), "logFormat": launcher.log_format,
        }}

    return _print_json(overrides, build)


def _policy(overrides: dict, job: str, max_restarts: int | None) -> int:
    from launcher import failure_policy
    from launcher.outcome import ConfigError

    def build(launcher) -> dict:
        if max_restarts is not None and max_restarts < 0:
            raise ConfigError("--max-restarts", max_restarts, "a count of JobSet restarts, 0 or more")
        restarts = failure_policy.MAX_RESTARTS if max_restarts is None else max_restarts
        return failure_policy.policy(job, launcher.retryable_exit_codes, restarts)

    return _print_json(overrides, build)
