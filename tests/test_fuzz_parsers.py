"""The launcher's parsers, fuzzed: the MPI hostfile, torchrun's argv, a ``python ...`` command
line, the storage URI and the address forms of the settings. For any input: the right answer or
one ConfigError line, never another exception; and what the launcher writes back (a hostfile for
mpirun, torchrun flags, a runner's command line) reads back as the same thing.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from hypothesis import example, given, strategies as st

from fuzz import ENV_CHARACTERS
from launcher.core import python_argv
from launcher.core.outcome import ConfigError
from launcher.core.settings import Invalid, parse_endpoint, parse_host, split_host_port
from launcher.initializers.uri import SCHEMES, parse_storage_uri, redact_uri
from launcher.mpi.hostfile import Host, MAX_SLOTS, parse_hostfile, render
from launcher.runner import program
from launcher.torch import args as torch_args

pytestmark = pytest.mark.fuzz

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
HOSTNAME = st.lists(LABEL, min_size=1, max_size=4).map(".".join)
IPV4 = st.ip_addresses(v=4).map(str)
HOSTFILE_LINE = st.one_of(
    st.text(ENV_CHARACTERS, max_size=60),
    st.tuples(HOSTNAME | IPV4, st.integers(-2, MAX_SLOTS + 2)).map(lambda h: f"{h[0]} slots={h[1]}"),
    st.tuples(HOSTNAME | IPV4, st.integers(-2, MAX_SLOTS + 2)).map(lambda h: f"{h[0]}:{h[1]}"),
    st.sampled_from(["# comment", "", "   ", "host slots=2 max_slots=4", "[::1] slots=2", "::1:2",
                     "host slots=", "host slots=1x", "host:", ":2", "host:2 extra", "a slots=٣"]),
)


def one_line(error: ConfigError) -> str:
    line = str(error)
    assert "\n" not in line and line.strip(), repr(line)
    return line


# --- the MPI hostfile ----------------------------------------------------------------------------


@given(st.lists(HOSTFILE_LINE, max_size=8).map("\n".join))
@example("a slots=٣")  # a digit that is not ASCII
@example("::1:2")
def test_any_hostfile_text_gives_hosts_or_one_line(text):
    try:
        hosts = parse_hostfile(text, "/etc/mpi/hostfile")
    except ConfigError as error:
        assert "/etc/mpi/hostfile" in one_line(error)
        return
    assert hosts and all(1 <= h.slots <= MAX_SLOTS for h in hosts)
    assert len({h.name.lower() for h in hosts}) == len(hosts)


@given(st.lists(st.tuples(HOSTNAME | IPV4, st.integers(1, MAX_SLOTS)), min_size=1, max_size=8,
                unique_by=lambda h: h[0].lower()),
       st.sampled_from(["openmpi", "hydra"]))
def test_a_hostfile_the_launcher_writes_reads_back_as_the_same_hosts(hosts, flavor):
    wanted = tuple(Host(name, slots) for name, slots in hosts)
    assert parse_hostfile(render(wanted, flavor), "rendered") == wanted


# --- torchrun's argv -----------------------------------------------------------------------------

FLAG_WORDS = st.sampled_from(sorted({option for flag in torch_args.grammar()[0].values() for option in flag.options}))
ARGV_WORD = st.one_of(FLAG_WORDS, FLAG_WORDS.map(lambda f: f + "="), st.text(ENV_CHARACTERS, max_size=12),
                      st.sampled_from(["--", "-", "train.py", "-m", "pkg.mod", "1", "2:4", "gpu", "auto", "c10d",
                                       "--nproc", "--nnodes=", "-h"]))


@given(st.lists(ARGV_WORD, max_size=8))
@example(["--nproc-per-node=gpu", "--nnodes", "1:2", "train.py", "--lr", "3"])
@example(["--nnodes"])
def test_any_torchrun_argv_is_read_or_refused_in_one_line(words):
    try:
        read = torch_args.read(words)
    except ConfigError as error:
        one_line(error)
        return
    # Written back as the plan writes it, torchrun reads the same flags and the same program.
    again = torch_args.read([*torch_args.render(read.given, list(read.given)),
                             *torch_args.program_argv(read.program)])
    assert {k: v.value for k, v in again.given.items()} == {k: v.value for k, v in read.given.items()}
    assert again.program == read.program


# --- a python command line -----------------------------------------------------------------------

PY_WORD = st.one_of(st.sampled_from(["-u", "-B", "-uB", "-m", "-c", "-W", "error", "-X", "dev", "-Xdev", "-Werror",
                                     "--", "-", "train.py", "pkg.mod", "print(1)", "--check-hash-based-pycs",
                                     "always", "--help", "-V", "-E", "-I", "-mpkg", "-cpass"]),
                    st.text(ENV_CHARACTERS, max_size=10))


@given(st.sampled_from(["python", "python3", "/usr/bin/python3.12", "bash"]), st.lists(PY_WORD, max_size=8))
@example("python", ["--check-hash-based-pycs", "--", "error"])  # "--" as an option's value, not the end
@example("python", ["--", "-u"])  # a script named -u
def test_a_python_command_parsed_and_put_back_together_is_the_same_command(interpreter, words):
    command = python_argv.parse([interpreter, *words])
    if command is None:
        return
    # The runner goes between the options and the target: the parts must add up to the command.
    rebuilt = [command.interpreter, *command.options, *command.target_argv(), *command.args]
    assert python_argv.parse(rebuilt) == command
    # and the runner, given what follows it, reads back the same program
    assert program.parse_target([*command.target_argv(), *command.args]) == \
        (command.kind, command.target, list(command.args))


# --- the storage URI -----------------------------------------------------------------------------

URI = st.one_of(
    st.text(ENV_CHARACTERS, max_size=80),
    st.tuples(st.sampled_from([*SCHEMES, "ftp", "S3", "hf", ""]), st.text(ENV_CHARACTERS, max_size=60))
    .map(lambda p: f"{p[0]}://{p[1]}"),
    st.tuples(st.sampled_from(SCHEMES), st.text(st.characters(codec="ascii"), min_size=1, max_size=12))
    .map(lambda p: f"{p[0]}://user:{p[1]}@host/path"),
)


@given(URI)
@example("s3://AKIA:hunter2secret@bucket/key")
@example("https://u:p%40ss@host/x")
@example("HF://:0000@/0000")  # found by CI: a password in an hf:// owner; the same text as its path
def test_any_storage_uri_is_parsed_or_refused_in_one_line_and_shown_without_its_password(raw):
    try:
        password = urlsplit(raw).password or ""
    except ValueError:  # no URI at all: nothing to hide
        password = ""
    if raw.count(password) > 1:
        password = ""  # the same text elsewhere in the URI (its path) is no secret shown
    try:
        uri = parse_storage_uri(raw)
    except ConfigError as error:
        line = one_line(error)
        assert "STORAGE_URI" in line
        if len(password) >= 4:
            assert password not in line.split("expected", 1)[0].replace(redact_uri(raw), ""), line
        return
    if len(password) >= 4:
        assert password not in uri.shown


# --- addresses -----------------------------------------------------------------------------------


@given(st.one_of(st.text(ENV_CHARACTERS, max_size=40),
                 st.tuples(HOSTNAME | IPV4 | st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
                           st.integers(-1, 70000).map(str) | st.sampled_from(["", "٣", "0x50", "+80", " 80"]))
                 .map(lambda p: f"{p[0]}:{p[1]}")))
@example("host:٣")  # a digit, but not one a resolver or torchrun reads
def test_any_endpoint_is_accepted_with_a_real_port_or_refused(text):
    try:
        endpoint = parse_endpoint(text)
    except Invalid:
        return
    host, port = split_host_port(endpoint)
    parse_host(host)
    if port is not None:
        written = endpoint.rsplit(":", 1)[1]
        assert written.isascii() and written.isdigit() and 1 <= int(written) <= 65535, endpoint


# --- an export's manifest, as a file:// destination finds it ----------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)


@given(st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode()),
                 st.lists(st.fixed_dictionaries({"path": JSON}), max_size=3).map(
                     lambda files: json.dumps({"files": files}).encode())))
@example(b'{"files": [{"path": "a", "size": 1}]}')
def test_any_manifest_in_a_destination_is_read_as_files_by_path_or_refused(tmp_path_factory, data):
    from launcher.export.file import _read_manifest

    path = tmp_path_factory.mktemp("manifest") / "m.json"
    path.write_bytes(data)
    found = _read_manifest(str(path))
    assert found is None or all(isinstance(key, str) and entry["path"] == key for key, entry in found.items())
