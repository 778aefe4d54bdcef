"""``trainer-launcher testfw [OPTIONS] -- PROGRAM [ARGS...]``: run PROGRAM as one of ``TESTFW_WORLD``
processes, after ``TESTFW_PEER`` (HOST:PORT) accepts connections when it is set.

All it does is the framework's part (its variables, its plan, the variables its program gets);
validation, the wait, supervision, the status reports, hang detection and the exit table are the
launcher's core and services, reached through their public modules.
"""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic_settings import NoDecode

from launcher import status
from launcher.core import lifecycle, settings
from launcher.core.exec_job import CommandPod, node_name
from launcher.core.knobs import Knob, Override
from launcher.core.outcome import ConfigError
from launcher.core.settings import Invalid, Settings, field, int_in, parsed, split_host_port

NAME = "testfw"
HELP = "the test suite's framework (tests/plugin)"
USAGE = "trainer-launcher testfw [OPTIONS] -- PROGRAM [ARGS...]"
KNOBS: dict[str, Knob] = {}


def parse_peer(raw) -> tuple[str, int]:
    if isinstance(raw, tuple):
        return raw
    host, port = split_host_port(str(raw).strip())
    if not host or port is None or not 1 <= port <= 65535:
        raise Invalid("HOST:PORT of the peer to wait for, a port from 1 to 65535")
    return host, port


class TestFwSettings(Settings):
    world: Annotated[int, NoDecode, parsed(int_in(1, 64, "a process count"))] = field(
        "TESTFW_WORLD", 1, "processes in the job")
    peer: Annotated[tuple[str, int] | None, NoDecode, parsed(parse_peer)] = field(
        "TESTFW_PEER", None, "HOST:PORT to wait for before the program starts")


def add_options(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    return lifecycle.live(TestFwPod(rest), overrides, status.start_watch)


class TestFwPod(CommandPod):
    """The framework's part of the pod's life: its plan and its wait; the rest is core's command pod."""

    name = NAME

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        self.testfw = settings.load(TestFwSettings)
        if not self.command:
            raise ConfigError("PROGRAM", None, f"a program after --: {USAGE}")
        self.env = {**settings.environ(), "TESTFW_WORLD_SIZE": str(self.testfw.world)}
        return lifecycle.Planned(None, node_name(), "", sends=True)

    def awaits(self, life: lifecycle.Life) -> lifecycle.Awaited:
        return lifecycle.Awaited(connect=self.testfw.peer)
