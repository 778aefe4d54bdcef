"""Command line: parse, call, exit. No logic lives here.

The frameworks' subcommands, and what ``plan`` and ``local`` do for each, come from the framework
registry (launcher/frameworks.py, which says what a framework's ``command`` module holds): this
file names none of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, NoReturn

from launcher import __version__
from launcher.core.knobs import KNOBS, Knob, given
from launcher.export.knobs import EXPORT_KNOBS
from launcher.frameworks import DEFAULT, FRAMEWORKS, plugged_in
from launcher.initializers.knobs import INIT_KNOBS
from launcher.smoke.knobs import NODE_KNOBS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


# A framework's command: its command module, or the object it holds as COMMAND
# (launcher.core.runner_command.RunnerCommand), with the attributes launcher/frameworks.py lists.
Command = Any

# The subcommands that are not a framework's.
_OWN_COMMANDS = ("plan", "exec", "local", "smoke", "init", "policy")


def frameworks(plugins: bool = True) -> dict[str, Command]:
    """Each framework's command, by name, in the registry's order (its command module, or the
    ``COMMAND`` object that module holds); the plugged-in frameworks' too
    (launcher.frameworks.plugged_in) unless ``plugins`` is False."""
    registered = FRAMEWORKS + (plugged_in() if plugins else ())
    modules = {framework.name: importlib.import_module(framework.command) for framework in registered}
    return {name: getattr(module, "COMMAND", module) for name, module in modules.items()}


def may_name_a_plugin(argv: list[str]) -> bool:
    """Whether this command line may name a plugged-in framework: its subcommand, its
    ``--framework``, or help that lists them. The launcher's own subcommands with its own
    frameworks never pay for reading the installed distributions."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    own = {framework.name for framework in FRAMEWORKS}
    if not head or head[0] not in (*own, *_OWN_COMMANDS) or {"-h", "--help"} & set(head):
        return True
    for i, word in enumerate(head):
        if word.startswith("--framework="):
            return word.partition("=")[2] not in own
        if word == "--framework":
            return head[i + 1 : i + 2] != [] and head[i + 1] not in own
    return False


def _add_table(parser: argparse.ArgumentParser, title: str, table: dict[str, Knob], prefix: str = "") -> None:
    group = parser.add_argument_group(title)
    for name, knob in table.items():
        group.add_argument(knob.flag, dest=prefix + name, metavar="VALUE", help=f"{knob.help} [env {knob.env}]")


def _add_knobs(parser: argparse.ArgumentParser) -> None:
    _add_table(parser, "launcher options (each also a LAUNCHER_* variable; flags win)", KNOBS)


def _add_export_knobs(parser: argparse.ArgumentParser) -> None:
    _add_table(parser, "export after the job (each also a variable; flags win)", EXPORT_KNOBS)


def _add_framework_knobs(parser: argparse.ArgumentParser, command: Command) -> None:
    if command.KNOBS:
        _add_table(
            parser,
            f"{command.NAME} options (each also a LAUNCHER_* variable; flags win)",
            command.KNOBS,
            f"{command.NAME}_",
        )


def _parser(commands_by_name: dict[str, Command], only_init: bool = False) -> argparse.ArgumentParser:
    """The whole command line; ``only_init``: the ``init`` subcommand alone (an initializer reads
    no framework's module and builds no framework's options: 0.1 s of its start, before its first
    byte)."""
    parser = _Parser(prog="trainer-launcher", description="The in-pod side of distributed training on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"trainer-launcher {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    if only_init:
        _add_init(commands)
        return parser

    for command in commands_by_name.values():
        sub = commands.add_parser(command.NAME, help=command.HELP, usage=command.USAGE)
        command.add_options(sub)
        _add_knobs(sub)
        _add_export_knobs(sub)
        _add_framework_knobs(sub, command)

    planned = [name for name, command in commands_by_name.items() if hasattr(command, "plan")]
    plan = commands.add_parser(
        "plan",
        help="print what would run, as JSON; no side effects",
        usage=f"trainer-launcher plan [--framework {{{','.join(planned)}}}] [OPTIONS] "
        "[-- [FRAMEWORK FLAGS] [PROGRAM ...]]",
    )
    plan.add_argument("--framework", choices=planned, default=DEFAULT)
    _add_knobs(plan)
    _add_export_knobs(plan)

    run = commands.add_parser(
        "exec",
        help="run any command with the same supervision and exit codes",
        usage="trainer-launcher exec [OPTIONS] -- CMD [ARGS...]",
    )
    _add_knobs(run)
    _add_export_knobs(run)

    emulated = [name for name, command in commands_by_name.items() if hasattr(command, "local")]
    local = commands.add_parser(
        "local",
        help="emulate an N-node TrainJob on this machine",
        usage="trainer-launcher local [--framework NAME] --nnodes N [--nproc-per-node P] "
        "[OPTIONS] [--] PROGRAM [ARGS...]",
    )
    local.add_argument(
        "--framework", choices=emulated, default=None, help=f"the TrainJob's framework (default {DEFAULT})"
    )
    local.add_argument("--nnodes", default="2", help="emulated nodes (default 2)")
    local.add_argument(
        "--nproc-per-node", default="1", help="processes per node: a count, auto, cpu or gpu (default 1)"
    )
    local.add_argument(
        "--trainjob", default="local", help="the TrainJob name the pod names derive from (default local)"
    )
    local.add_argument(
        "--master-port", default=None, help="the master (coordinator, tracker) port (default: a free port)"
    )
    local.add_argument(
        "--isolation",
        choices=["auto", "namespaces", "none"],
        default="auto",
        help="per-node hostname and /etc/hosts in namespaces (auto: when root)",
    )
    for command in commands_by_name.values():  # a framework's own options of local, which pick it
        if hasattr(command, "add_local_options"):
            command.add_local_options(local)
    _add_knobs(local)
    _add_export_knobs(local)

    for command in commands_by_name.values():  # plan and local take every framework's options
        _add_framework_knobs(plan, command)
        _add_framework_knobs(local, command)
        if hasattr(command, "add_shared_options"):  # a framework's switches that plan and local take too
            command.add_shared_options(plan)
            command.add_shared_options(local)

    _add_init(commands)

    policy = commands.add_parser(
        "policy",
        help="print the runtimes' Job/JobSet failure policy derived from the exit-code table, and the pod's "
        "grace derived from the launcher's, as JSON",
        usage="trainer-launcher policy [--job NAME] [--max-restarts N] [--retryable-exit-codes CODES] "
        "[--grace-period DURATION]",
    )
    policy.add_argument(
        "--job",
        default="node",
        choices=["node", "launcher", "dataset-initializer", "model-initializer"],
        help="the replicated job (default node)",
    )
    policy.add_argument(
        "--max-restarts", type=int, default=None, metavar="N", help="JobSet restarts for retryable failures"
    )
    for name in ("retryable_exit_codes", "grace_period"):
        knob = KNOBS[name]
        policy.add_argument(knob.flag, dest=name, metavar="VALUE", help=f"{knob.help} [env {knob.env}]")

    smoke = commands.add_parser(
        "smoke",
        help="preflight this node: CPU/GPU, shm, disk, DNS, gloo/NCCL, thresholds",
        usage="trainer-launcher smoke [--json] [--level quick|long] [THRESHOLDS] [OPTIONS]",
    )
    smoke.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")
    _add_table(smoke, "level and thresholds (each also a LAUNCHER_SMOKE_* variable; flags win)", NODE_KNOBS, "smoke_")
    _add_knobs(smoke)
    return parser


def _add_init(commands) -> None:
    init = commands.add_parser(
        "init",
        help="dataset/model initializer: STORAGE_URI -> /workspace/{dataset,model}",
        usage="trainer-launcher init {dataset,model} [OPTIONS]",
    )
    init.add_argument("kind", choices=["dataset", "model"])
    _add_table(init, "initializer options (each also a LAUNCHER_INIT_* variable; flags win)", INIT_KNOBS, "init_")
    _add_knobs(init)


def _switches(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The options of the parser and of every subcommand's that take no value (help, version,
    ``store_true`` flags), read from the parser itself, so a new switch needs no list kept by
    hand. argparse has no public way to list a parser's options: this reads its ``_actions``."""
    found: set[str] = set()
    for action in parser._actions:
        if action.nargs == 0:
            found.update(action.option_strings)
        if isinstance(action.choices, dict):  # the subcommands' parsers, by name
            for sub in action.choices.values():
                if isinstance(sub, argparse.ArgumentParser):
                    found |= _switches(sub)
    return frozenset(found)


def _split(argv: list[str], switches: frozenset[str] | None = None) -> tuple[list[str], list[str]]:
    """The subcommand and its options, then what belongs to the framework's own launcher or the
    command: everything after ``--``, or else from the first word that is neither an option nor
    an option's value. ``switches``: the options that take no value (default: the parser's)."""
    if switches is None:
        switches = _switches(_parser(frameworks()))
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    i = 2 if argv[:1] == ["init"] else 1  # init takes its kind (dataset/model) as a word
    while i < len(argv) and argv[i].startswith("-"):
        takes_value = argv[i] not in switches and "=" not in argv[i]
        i += 2 if takes_value else 1
    return argv[:i], argv[i:]


def run() -> NoReturn:
    """The command's entry point (``trainer-launcher``, ``python -m launcher``): :func:`main`, then
    the process's end. ``init`` ends at once (launcher.core.process_exit: its time is measured
    against cp and s5cmd, and nothing it started is left); every other command through the
    interpreter's usual exit, whose pace the pods of one job emulated by ``local`` were tested
    with (a pod that ended 0.1 s sooner got its peer stopped by ``local`` before that peer had
    judged its own process's ending)."""
    code = main()
    if _is_init(sys.argv[1:]):
        from launcher.core.process_exit import exit_now

        exit_now(code)
    sys.exit(code)


def _is_init(argv: list[str]) -> bool:
    """Whether the command line runs ``init`` (its subcommand comes first: the only option before
    a subcommand is ``--version``, which ends the run)."""
    return argv[:1] == ["init"]


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. An exception that escapes it is the launcher's own bug: it is reported
    as such (exit 70, LauncherError, with the frame), never as the user's program failing."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _dispatch(argv)
    except Exception as error:  # noqa: BLE001 - everything the subcommands did not classify
        import os
        import traceback

        from launcher.core.outcome import internal_error
        from launcher.core.report import deliver

        traceback.print_exc()
        termination_log, codes = os.environ.get("LAUNCHER_TERMINATION_LOG") or None, None
        try:  # the user's retryable set, if it can be read: 70 may be in it
            from launcher.core.settings import LauncherSettings, load

            launcher = load(LauncherSettings)
            termination_log, codes = launcher.termination_log, launcher.retryable_exit_codes
        except Exception:  # noqa: BLE001 - the defaults, then
            pass
        return deliver(internal_error(error, node=os.environ.get("HOSTNAME")), termination_log, codes)


def _dispatch(argv: list[str]) -> int:
    only_init = _is_init(argv)
    commands = {} if only_init else frameworks(plugins=may_name_a_plugin(argv))
    parser = _parser(commands, only_init)
    head, rest = _split(argv, _switches(parser))
    args = parser.parse_args(head)
    overrides = {**given(args, KNOBS), **given(args, EXPORT_KNOBS)}
    if args.command in commands:
        return commands[args.command].run(args, overrides, rest)
    if args.command == "plan":
        return commands[args.framework].plan(args, overrides, rest)
    if args.command == "local":
        claimed = [
            name
            for name, command in commands.items()
            if hasattr(command, "claims_local") and command.claims_local(args)
        ]
        framework = args.framework or (claimed[0] if claimed else DEFAULT)
        return commands[framework].local(args, overrides, rest)
    if args.command == "exec":
        from launcher.core.exec_job import run_exec
        from launcher.export.step import Export

        return run_exec(overrides, rest, Export())
    if args.command == "smoke":
        from launcher.smoke.job import run_smoke

        return run_smoke(overrides, given(args, NODE_KNOBS, "smoke_"), args.json, commands[DEFAULT].pod_request)
    if args.command == "init":
        from launcher.initializers.job import run_init

        return run_init(args.kind, overrides, given(args, INIT_KNOBS, "init_"))
    return _policy(overrides, args.job, args.max_restarts)


def _policy(overrides: dict, job: str, max_restarts: int | None) -> int:
    from launcher.core import failure_policy
    from launcher.core.outcome import ConfigError
    from launcher.core.report import print_plan

    def build(launcher) -> dict:
        if max_restarts is not None and max_restarts < 0:
            raise ConfigError("--max-restarts", max_restarts, "a count of JobSet restarts, 0 or more")
        restarts = failure_policy.MAX_RESTARTS if max_restarts is None else max_restarts
        return failure_policy.policy(job, launcher.retryable_exit_codes, restarts, launcher.grace_period)

    return print_plan(overrides, build)
