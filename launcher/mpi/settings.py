"""The MPI launcher's and worker's knobs, and the variables Trainer's MPI policy sets."""

from __future__ import annotations

import functools
import os
import re
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import Invalid, Settings, int_in, knob_field, parse_bool, parse_choice, parse_host, parsed
from launcher.mpi.knobs import MPI_KNOBS

_mpi_knob = functools.partial(knob_field, MPI_KNOBS)


def parse_globs(raw: Any) -> tuple[str, ...]:
    items = tuple(item.strip() for item in str(raw).split(",") if item.strip())
    if not items or any(not re.fullmatch(r"[A-Za-z0-9_*?\[\]!-]+", item) for item in items):
        raise Invalid("comma-separated variable names or globs, e.g. NCCL_*,MY_FLAG")
    return items


class MpiSettings(Settings):
    """The MPI launcher's and worker's knobs, and the variables Trainer's MPI policy sets."""

    hostfile: str = _mpi_knob(
        "hostfile",
        "/etc/mpi/hostfile",
        "OMPI_MCA_orte_default_hostfile",
        "PRTE_MCA_prte_default_hostfile",
        "I_MPI_HYDRA_HOST_FILE",
        "HYDRA_HOST_FILE",
    )
    default_slots: Annotated[int | None, NoDecode, parsed(int_in(1, 4096, "a slot count"))] = _mpi_knob(
        "default_slots", None, "OMPI_MCA_orte_set_default_slots", "PRTE_MCA_prte_set_default_slots"
    )
    implementation: Annotated[str, NoDecode, parsed(parse_choice("auto", "openmpi", "intel", "mpich"))] = _mpi_knob(
        "implementation", "auto"
    )
    mpirun: str | None = _mpi_knob("mpirun", None)
    ssh_port: Annotated[int, NoDecode, parsed(int_in(1, 65535, "a port"))] = _mpi_knob("ssh_port", 2222)
    ssh_auth_mount_path: str = _mpi_knob("ssh_auth_mount_path", os.path.expanduser("~/.ssh"))
    ssh_dir: str = _mpi_knob("ssh_dir", os.path.expanduser("~/.trainer-launcher/ssh"))
    ssh_host_key_checking: Annotated[str, NoDecode, parsed(parse_choice("pinned", "off"))] = _mpi_knob(
        "ssh_host_key_checking", "pinned"
    )
    ssh_listen_address: Annotated[str | None, NoDecode, parsed(parse_host)] = _mpi_knob("ssh_listen_address", None)
    export: Annotated[tuple[str, ...], NoDecode, parsed(parse_globs)] = _mpi_knob("export", ("*",))
    export_deny: Annotated[tuple[str, ...], NoDecode, parsed(parse_globs)] = _mpi_knob("export_deny", ())
    abort_on_exception: Annotated[bool, NoDecode, parsed(parse_bool)] = _mpi_knob("abort_on_exception", True)
