"""What Trainer's JAX policy injects into the ``node`` container, validated.

Upstream (pkg/runtime/framework/plugins/jax, v2.3.0) sets ``JAX_NUM_PROCESSES`` to numNodes,
``JAX_PROCESS_ID`` to the pod's Job completion index and ``JAX_COORDINATOR_ADDRESS`` to
``<trainjob>-node-0-0.<trainjob>:29500``: one JAX process per pod, process 0 serving the
coordination service.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core import settings
from launcher.core.knobs import Override
from launcher.core.settings import (
    Invalid,
    Settings,
    field,
    int_in,
    knob_field,
    parse_bool,
    parse_host,
    parsed,
    split_host_port,
)
from launcher.jax.knobs import JAX_KNOBS

MAX_PROCESSES = 100_000

_jax_knob = functools.partial(knob_field, JAX_KNOBS)


def parse_coordinator(raw: Any) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6): JAX needs the port, it binds it on process 0."""
    expected = (
        "HOST:PORT of process 0's coordinator: a DNS name or IP address (IPv6 in brackets, [fd00::1]:29500) "
        "and a port from 1 to 65535"
    )
    if isinstance(raw, tuple):
        return raw
    text = str(raw).strip()
    try:
        host, port = split_host_port(text)
        parse_host(host)
    except Invalid:
        raise Invalid(expected) from None
    if port is None or not 1 <= port <= 65535:
        raise Invalid(expected)
    return host, port


class JaxSettings(Settings):
    """Trainer's JAX variables and the JAX role's own knobs."""

    num_processes: Annotated[int, NoDecode, parsed(int_in(1, MAX_PROCESSES, "a process count"))] = field(
        "JAX_NUM_PROCESSES", 1, "JAX processes in the job, one per pod"
    )
    process_id: Annotated[int, NoDecode, parsed(int_in(0, MAX_PROCESSES - 1, "a process id"))] = field(
        ("JAX_PROCESS_ID", "JOB_COMPLETION_INDEX"), 0, "this pod's JAX process id"
    )
    coordinator: Annotated[tuple[str, int] | None, NoDecode, parsed(parse_coordinator)] = field(
        "JAX_COORDINATOR_ADDRESS", None, "process 0's coordination service, HOST:PORT"
    )
    # Read only to leave the user's choice alone; JAX itself validates it.
    cpu_collectives: str | None = field(
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION", None, "JAX's cross-process collectives on CPU"
    )
    initialize: Annotated[bool, NoDecode, parsed(parse_bool)] = _jax_knob("initialize", True)


def load_jax(overrides: dict[str, Override] | None = None) -> JaxSettings:
    """JaxSettings, with the checks that span two variables, each still one ConfigError line."""
    expected = "HOST:PORT of process 0's coordinator {when} (Trainer sets <trainjob>-node-0-0.<trainjob>:29500)"
    return settings.load_member(
        JaxSettings, overrides, ("process_id", "num_processes", "a process id"), ("coordinator", expected)
    )
