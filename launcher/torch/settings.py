"""What Trainer's torch policy injects (``PET_*``), validated with torchrun's defaults."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import (
    Invalid,
    Settings,
    field,
    int_in,
    parse_bool,
    parse_choice,
    parse_endpoint,
    parse_host,
    parsed,
)

MAX_NODES = 100_000
MAX_NPROC = 1024

_RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CONF_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def parse_nnodes(raw: Any) -> tuple[int, int]:
    """``4`` -> (4, 4); ``2:4`` -> (2, 4), as torchrun's ``--nnodes``."""
    expected = f"a node count N or a range MIN:MAX, 1 <= MIN <= MAX <= {MAX_NODES}"
    if isinstance(raw, tuple):
        return raw
    parts = str(raw).strip().split(":")
    if len(parts) > 2:
        raise Invalid(expected)
    try:
        bounds = [int_in(1, MAX_NODES)(p) for p in parts]
    except Invalid:
        raise Invalid(expected) from None
    low, high = bounds[0], bounds[-1]
    if low > high:
        raise Invalid(expected + f" (MIN {low} is above MAX {high})")
    return low, high


def parse_nproc(raw: Any) -> str | int:
    """``auto``, ``cpu``, ``gpu`` or a process count."""
    text = str(raw).strip().lower()
    if text in ("auto", "cpu", "gpu"):
        return text
    try:
        return int_in(1, MAX_NPROC)(text)
    except Invalid:
        raise Invalid(f"auto, cpu, gpu or a process count from 1 to {MAX_NPROC}") from None


def parse_rdzv_id(raw: Any) -> str:
    text = str(raw).strip()
    if not _RDZV_ID.match(text):
        raise Invalid("1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return text


def parse_rdzv_conf(raw: Any) -> str:
    text = str(raw).strip()
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or not _CONF_KEY.match(key.strip()) or not value.strip():
            raise Invalid("KEY=VALUE[,KEY=VALUE...], e.g. join_timeout=600")
    return text


_backend = parse_choice("static", "c10d", "etcd", "etcd-v2")


class TorchSettings(Settings):
    """What Trainer's torch policy injects (``PET_*``), with torchrun's defaults."""

    nnodes: Annotated[tuple[int, int], NoDecode, parsed(parse_nnodes)] = field(
        "PET_NNODES", (1, 1), "node count, or MIN:MAX for elastic jobs"
    )
    nproc_per_node: Annotated[str | int, NoDecode, parsed(parse_nproc)] = field(
        "PET_NPROC_PER_NODE", 1, "processes per node: auto, cpu, gpu or a count"
    )
    node_rank: Annotated[int, NoDecode, parsed(int_in(0, MAX_NODES - 1))] = field(
        ("PET_NODE_RANK", "JOB_COMPLETION_INDEX"), 0, "this node's rank"
    )
    master_addr: Annotated[str | None, NoDecode, parsed(parse_host)] = field(
        "PET_MASTER_ADDR", None, "the rank-0 node's address"
    )
    master_port: Annotated[int, NoDecode, parsed(int_in(1, 65535, "a port"))] = field(
        "PET_MASTER_PORT", 29500, "the rank-0 node's port"
    )
    rdzv_backend: Annotated[str | None, NoDecode, parsed(_backend)] = field(
        "PET_RDZV_BACKEND", None, "rendezvous backend"
    )
    rdzv_endpoint: Annotated[str | None, NoDecode, parsed(parse_endpoint)] = field(
        "PET_RDZV_ENDPOINT", None, "rendezvous HOST[:PORT]"
    )
    rdzv_id: Annotated[str | None, NoDecode, parsed(parse_rdzv_id)] = field(
        "PET_RDZV_ID", None, "rendezvous id shared by all nodes of the job"
    )
    rdzv_conf: Annotated[str | None, NoDecode, parsed(parse_rdzv_conf)] = field(
        "PET_RDZV_CONF", None, "rendezvous KEY=VALUE,... settings"
    )
    max_restarts: Annotated[int | None, NoDecode, parsed(int_in(0, 10_000))] = field(
        "PET_MAX_RESTARTS", None, "worker group restarts before failing"
    )
    standalone: Annotated[bool, NoDecode, parsed(parse_bool)] = field(
        "PET_STANDALONE", False, "single-node job with a private rendezvous"
    )
