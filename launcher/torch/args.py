"""torchrun's command-line grammar as data, and a reader that splits a command line exactly as
torchrun does, without importing torch.

:data:`FLAGS` mirrors ``torch.distributed.run.get_args_parser()`` (tests/test_torchrun_grammar.py
checks it against the installed torch, flag by flag). :func:`read` builds an argparse parser with
the same option strings, the same value/switch shape and the same two positionals, so
abbreviations (``--nn 2``), short clusters (``-mt3``), ``--flag=value`` and ``--`` mean here what
they mean to torchrun: the grammar is argparse's own, only the table is ours. Values are kept as
the user typed them, so a flag the user wrote can reach torchrun with the same value.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.core.outcome import ConfigError

TORCH_CHECKED = "2.13"  # the torch whose parser this table was last checked against


@dataclass(frozen=True)
class Flag:
    dest: str
    options: tuple[str, ...]  # in torchrun's order
    takes_value: bool = True
    kind: str = "str"  # how torchrun converts the value: str, int or float
    choices: tuple[str, ...] = ()
    from_env: bool = True  # torchrun also reads PET_<DEST> when the flag is absent

    @property
    def spelling(self) -> str:
        """How a plan writes the flag: its first long option."""
        return next(option for option in self.options if option.startswith("--"))


def _value(dest: str, *options: str, kind: str = "str", choices: tuple[str, ...] = (), from_env: bool = True) -> Flag:
    return Flag(dest, options, True, kind, choices, from_env)


def _switch(dest: str, *options: str) -> Flag:
    return Flag(dest, options, takes_value=False)


FLAGS: tuple[Flag, ...] = (
    _value("nnodes", "--nnodes"),
    _value("nproc_per_node", "--nproc-per-node", "--nproc_per_node"),
    _value("rdzv_backend", "--rdzv-backend", "--rdzv_backend"),
    _value("rdzv_endpoint", "--rdzv-endpoint", "--rdzv_endpoint"),
    _value("rdzv_id", "--rdzv-id", "--rdzv_id"),
    _value("rdzv_conf", "--rdzv-conf", "--rdzv_conf"),
    _switch("standalone", "--standalone"),
    _value("max_restarts", "--max-restarts", "--max_restarts", kind="int"),
    _value("monitor_interval", "--monitor-interval", "--monitor_interval", kind="float"),
    _value("start_method", "--start-method", "--start_method", choices=("spawn", "fork", "forkserver")),
    _value("event_log_handler", "--event-log-handler", "--event_log_handler"),
    _value("role", "--role"),
    _switch("module", "-m", "--module"),
    _switch("no_python", "--no-python", "--no_python"),
    _switch("run_path", "--run-path", "--run_path"),
    _value("log_dir", "--log-dir", "--log_dir"),
    _value("redirects", "-r", "--redirects"),
    _value("tee", "-t", "--tee"),
    _value("local_ranks_filter", "--local-ranks-filter", "--local_ranks_filter"),
    _value("duplicate_stdout_filters", "--duplicate-stdout-filters", "--duplicate_stdout_filters"),
    _value("duplicate_stderr_filters", "--duplicate-stderr-filters", "--duplicate_stderr_filters"),
    _value("node_rank", "--node-rank", "--node_rank", kind="int"),
    _value("master_addr", "--master-addr", "--master_addr"),
    _value("master_port", "--master-port", "--master_port", kind="int"),
    _value("local_addr", "--local-addr", "--local_addr"),
    _value("logs_specs", "--logs-specs", "--logs_specs", from_env=False),
    _value(
        "numa_binding",
        "--numa-binding",
        "--numa_binding",
        choices=("node", "socket", "exclusive", "core-complex"),
        from_env=False,
    ),
    _value("signals_to_handle", "--signals-to-handle", "--signals_to_handle"),
    _value("shutdown_timeout", "--shutdown-timeout", "--shutdown_timeout", kind="int"),
    _switch("virtual_local_rank", "--virtual-local-rank", "--virtual_local_rank"),
)
BY_DEST = {flag.dest: flag for flag in FLAGS}


@functools.lru_cache(maxsize=1)
def grammar() -> tuple[dict[str, Flag], str]:
    """The flags of the torchrun installed here (launcher.torch.compat reads them from its source,
    without importing torch), by dest, and the torch they come from. A flag of a newer torchrun
    than our table's passes through; one the installed torchrun lacks is refused as torchrun
    would refuse it. Without torch here (a plan made elsewhere), our table: torch {TORCH_CHECKED}."""
    from launcher.torch import compat

    installed = compat.torchrun_flags()
    if installed is None:
        return BY_DEST, TORCH_CHECKED
    flags = {}
    for found in installed.flags:
        known = BY_DEST.get(found.dest)
        flags[found.dest] = Flag(
            found.dest, found.options, found.takes_value, found.kind, known.choices if known else (), found.from_env
        )
    return flags, installed.version


def flag(dest: str) -> Flag:
    """A flag by dest: the installed torchrun's, else our table's (a flag the plan writes)."""
    return grammar()[0].get(dest) or BY_DEST[dest]


# argparse's own -h/--help: part of the grammar (``--he`` abbreviates it), never run by the launcher.
HELP = ("-h", "--help")
_PLACEHOLDER = "SCRIPT"


@dataclass(frozen=True)
class Given:
    """A flag the user typed: its value as typed (True for a switch) and the option it matched."""

    value: str | bool
    option: str


@dataclass(frozen=True)
class CommandLine:
    """A torchrun command line, read: the flags typed (last one wins, first position kept), then
    the script (or module, or executable) and its arguments."""

    given: dict[str, Given]
    program: tuple[str, ...]


class _Refused(Exception):
    """argparse refused the command line; the message is argparse's."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise, never print usage and exit
        raise _Refused(message)


class _Record(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        typed = Given(True if self.nargs == 0 else values, option_string or self.dest)
        if self.dest in grammar()[0]:
            _check_type(grammar()[0][self.dest], typed)  # every occurrence, as torchrun converts each one
        namespace.given[self.dest] = typed


@functools.lru_cache(maxsize=1)  # parse_args leaves a parser as it found it; build it once
def _parser() -> argparse.ArgumentParser:
    # The same construction torchrun uses (allow_abbrev, prefix '-'), so argparse tokenises alike.
    parser = _Parser(prog="torchrun", add_help=False, exit_on_error=False)
    parser.add_argument(*HELP, dest="help", action=_Record, nargs=0, default=argparse.SUPPRESS)
    for known in grammar()[0].values():
        parser.add_argument(
            *known.options,
            dest=known.dest,
            action=_Record,
            nargs=None if known.takes_value else 0,
            default=argparse.SUPPRESS,
        )
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def read(args: list[str] | tuple[str, ...], require_program: bool = True) -> CommandLine:
    """Read ``[TORCHRUN FLAGS] SCRIPT [ARGS]`` as torchrun would; a refusal is one ConfigError line."""
    args = list(args)
    try:
        namespace = _parser().parse_args(args, argparse.Namespace(given={}))
        program = (namespace.training_script, *namespace.training_script_args)
    except (argparse.ArgumentError, _Refused) as refusal:
        # Python 3.12.8+ raises ArgumentError(None, ...) where older ones call error(): same text.
        if isinstance(refusal, argparse.ArgumentError) and refusal.argument_name is not None:
            raise _flag_error(refusal) from None
        message = refusal.message if isinstance(refusal, argparse.ArgumentError) else str(refusal)
        if not message.startswith("the following arguments are required"):
            raise _line_error(message) from None
        if require_program:
            raise ConfigError(
                "SCRIPT",
                None,
                "a training script after the torchrun flags: "
                "trainer-launcher torch [OPTIONS] -- [TORCHRUN FLAGS] SCRIPT [ARGS...]",
            ) from None
        # Only the script is missing (argparse checks values first): read the flags alone.
        return CommandLine(read([*args, _PLACEHOLDER]).given, ())
    given = namespace.given
    if "help" in given:
        raise ConfigError(
            "torchrun flag",
            given["help"].option,
            "flags to run with; torchrun's own help is: python -m torch.distributed.run --help",
        )
    return CommandLine(given, program)


def _check_type(flag: Flag, typed: Given) -> None:
    """torchrun's own conversions (int(), float(), choices), as one line instead of its usage dump."""
    if not flag.takes_value:
        return
    value = str(typed.value)
    try:
        {"int": int, "float": float, "str": str}[flag.kind](value)
    except ValueError:
        raise ConfigError(
            typed.option,
            value,
            f"{'an integer' if flag.kind == 'int' else 'a number'} (torchrun reads {flag.spelling} with {flag.kind}())",
        ) from None
    if flag.choices and value not in flag.choices:
        raise ConfigError(typed.option, value, "one of " + ", ".join(flag.choices))


def _flag_error(error: argparse.ArgumentError) -> ConfigError:
    found = next((f for f in grammar()[0].values() if "/".join(f.options) == error.argument_name), None)
    name = found.spelling if found else str(error.argument_name)
    if "ignored explicit argument" in error.message:
        value = error.message.split("'", 1)[1].rsplit("'", 1)[0]
        return ConfigError(name, value, f"no value: {name} is a switch")
    return ConfigError(name, None, "a value after it")


def _line_error(message: str) -> ConfigError:
    if message.startswith("ambiguous option: "):
        option, _, matches = message.removeprefix("ambiguous option: ").partition(" could match ")
        return ConfigError("torchrun flag", option, f"one torchrun flag, but it abbreviates several: {matches}")
    if message.startswith("unrecognized arguments: "):
        unknown = message.removeprefix("unrecognized arguments: ").split(" ")[0]
        return ConfigError(
            "torchrun flag",
            unknown,
            f"a flag the torchrun of torch {grammar()[1]} knows "
            f"(torchrun: error: {message}); "
            "put the script's own flags after the script",
        )
    return ConfigError("torchrun flags", None, message)


def render(given: Mapping[str, Given | str | bool], order: list[str]) -> list[str]:
    """Flags as a plan writes them: ``--flag value``, or ``--flag=value`` when the value could be
    mistaken for an option (or is empty), ``--flag`` for a switch."""
    argv: list[str] = []
    for dest in order:
        value = given[dest]
        value = value.value if isinstance(value, Given) else value
        written = flag(dest)
        if not written.takes_value:
            if value:
                argv.append(written.spelling)
        elif str(value) == "" or str(value).startswith("-"):
            argv.append(f"{written.spelling}={value}")
        else:
            argv += [written.spelling, str(value)]
    return argv


def program_argv(program: tuple[str, ...]) -> list[str]:
    """The script and its arguments, written so torchrun reads them back unchanged."""
    if not program:
        return []
    plain = list(program)
    if not program[0].startswith("-") and _reads_back(plain, program):
        return plain
    return ["--", *program]


def _reads_back(argv: list[str], program: tuple[str, ...]) -> bool:
    try:
        return read(argv).program == program
    except ConfigError:
        return False
