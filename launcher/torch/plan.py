"""Settings + host facts + the user's torchrun words -> the torchrun command line.
Pure: no I/O, no clock, no subprocess.

Two rules shape the command line:

- **The user's words win.** Every torchrun flag the user typed reaches torchrun with the value the
  user typed (``auto``/``cpu``/``gpu`` for ``--nproc-per-node`` become a count, see
  :func:`resolve_nproc`). The launcher fills in only flags the user did not type, from ``PET_*``.
- **What torchrun would do, made explicit.** The rendezvous is chosen as torchrun chooses it (an
  explicit ``--rdzv-backend`` is kept; static with ``--rdzv-endpoint`` uses that endpoint as the
  master), except where torchrun could only hang: an elastic ``MIN:MAX`` node count with no backend
  gets c10d on the master.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.core.devices import Accelerators, HostFacts, resolve_nproc
from launcher.core.knobs import Override
from launcher.core.lifecycle import generation_port
from launcher.core.outcome import ConfigError
from launcher.status import flight
from launcher.torch import args as torchrun_args
from launcher.torch.args import CommandLine, Given
from launcher.torch.settings import TorchSettings

C10D_DEFAULT_PORT = 29400
ETCD_DEFAULT_PORT = 2379
MASTER_PORT_DEFAULT = 29500  # torchrun's --master-port default
# torchrun's own --rdzv-id default: a plan that names no id means what torchrun means.
DEFAULT_RDZV_ID = "none"

# torchrun flags that set what TorchSettings holds; the launcher plans them (flags beat PET_*).
OWNED = tuple(TorchSettings.model_fields)
# The order a plan writes the flags it plans; the user's other flags follow in the user's order.
_ORDER = (
    "standalone",
    "nnodes",
    "nproc_per_node",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "master_addr",
    "master_port",
    "max_restarts",
)
assert set(_ORDER) == set(OWNED)
# The variables behind the owned flags: removed from torchrun's environment, so it sees only the
# flags the plan prints. torchrun's other PET_* variables stay and keep their meaning.
CONSUMED_ENV = tuple(f"PET_{dest.upper()}" for dest in OWNED)
# PyTorch's NCCL flight recorder, on unless the user set it: each setting's names, the current one
# first (torch 2.8 renamed TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE to
# TORCH_FR_*; newer torch still reads the old names, with a deprecation warning from every rank),
# and the launcher's value. The user's value under any name wins; the plan sets the current name.
FR_BUFFER_SIZE = "2000"  # entries in each rank's ring of recent collectives (PyTorch's advice)
FLIGHT_RECORDER = (
    (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), FR_BUFFER_SIZE),
    (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
    (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), None),  # the dump prefix, per job
)
# Trainer's master is <trainjob>-node-0-0.<trainjob>[.<domain>]: the TrainJob name is its head.
_TRAINER_MASTER = re.compile(r"^(?P<trainjob>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-node-0-0(\.|$)")


@dataclass(frozen=True)
class TorchrunArgs:
    """What the user wrote after ``--``: torchrun flags, then the script and its arguments."""

    given: dict[str, Given]  # every flag typed: dest -> value as typed, option matched
    program: tuple[str, ...]  # script (or module, or executable) and its arguments

    @property
    def overrides(self) -> dict[str, Override]:
        """The typed flags that set a TorchSettings field (they beat PET_*, as in torchrun)."""
        return {dest: Override(typed.value, typed.option) for dest, typed in self.given.items() if dest in OWNED}

    @property
    def passthrough(self) -> tuple[str, ...]:
        """The typed flags the launcher does not plan, as the plan writes them."""
        return tuple(torchrun_args.render(self.given, [d for d in self.given if d not in OWNED]))


def split_torchrun_args(args: list[str], require_program: bool = False) -> TorchrunArgs:
    """Split ``[TORCHRUN FLAGS] SCRIPT [ARGS]`` exactly as torchrun's parser would."""
    line: CommandLine = torchrun_args.read(args, require_program=require_program)
    return TorchrunArgs(line.given, line.program)


@dataclass(frozen=True)
class Wait:
    """What must be reachable before torchrun starts."""

    resolve: str | None = None  # a DNS name that must resolve
    connect: tuple[str, int] | None = None  # a host:port that must accept TCP
    store: tuple[str, int] | None = None  # the rendezvous' TCPStore, which the nodes share

    def to_json(self) -> dict:
        return {"resolve": self.resolve, "connect": _host_port(self.connect), "store": _host_port(self.store)}


@dataclass(frozen=True)
class TorchPlan:
    mode: str  # standalone | static | c10d (or another rendezvous backend)
    nnodes: str
    nproc_per_node: int
    node_rank: int
    torchrun_args: tuple[str, ...]
    program: tuple[str, ...]
    env_set: dict[str, str]
    env_unset: tuple[str, ...]
    wait: Wait
    sources: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # what the launcher changed that a user should hear about
    # torchrun's --max-restarts, where the launcher restarts in place (a job of a fixed size)
    max_restarts: int | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        return ("torchrun", *self.torchrun_args, *self.program)

    def to_json(self) -> dict:
        return {
            "framework": "torch",
            "mode": self.mode,
            "nnodes": self.nnodes,
            "nprocPerNode": self.nproc_per_node,
            "nodeRank": self.node_rank,
            "argv": list(self.argv),
            "env": {"set": self.env_set, "unset": list(self.env_unset)},
            "wait": self.wait.to_json(),
            "sources": self.sources,
            "warnings": list(self.warnings),
        }


def fit_to_accelerators(nproc: int, source: str, host: HostFacts, keep: bool) -> tuple[int, str | None]:
    """Trainer sets PET_NPROC_PER_NODE to the CPU request when no resource name contains "gpu"
    (MIG slices, Neuron, Gaudi). One process per visible accelerator is then what the job means;
    ``keep`` (LAUNCHER_KEEP_NPROC) keeps the number. Fewer processes than accelerators are kept,
    with a note: a process may use several, but more often the count missed them. Only the
    controller's variable is fitted or noted: a ``--nproc-per-node`` the user typed is taken as
    typed, and is how a user runs fewer on purpose. Returns the count and a note, if any."""
    accelerators = host.accelerator
    if source != "PET_NPROC_PER_NODE" or accelerators is None:
        return nproc, None
    if accelerators.count is None:
        return nproc, (
            f"PET_NPROC_PER_NODE={nproc} kept: {accelerators.kind}s are visible but could not be "
            f"counted ({accelerators.how})"
        )
    if nproc < accelerators.count:
        return nproc, _idle_accelerators(nproc, accelerators.count, accelerators)
    if nproc == accelerators.count:
        return nproc, None
    if keep:
        return nproc, (
            f"PET_NPROC_PER_NODE={nproc} kept although only {accelerators.count} {accelerators.kind}s "
            f"are visible (LAUNCHER_KEEP_NPROC)"
        )
    return accelerators.count, (
        f"PET_NPROC_PER_NODE={nproc} but only {accelerators.count} {accelerators.kind}s are visible "
        f"({accelerators.how}): one process per {accelerators.kind}; LAUNCHER_KEEP_NPROC=1 keeps {nproc}"
    )


def _idle_accelerators(nproc: int, count: int, accelerators: Accelerators) -> str:
    kind = accelerators.kind
    processes = f"{nproc} process leaves" if nproc == 1 else f"{nproc} processes leave"
    return (
        f"PET_NPROC_PER_NODE={nproc} but {count} {kind}s are visible ({accelerators.how}): {processes} "
        f"{count - nproc} idle, unless {'it uses' if nproc == 1 else 'each uses'} several. For one process per "
        f"{kind} set the TrainJob's numProcPerNode to {count}, or check the resource name the runtime requests "
        f'(Trainer counts GPUs only under a name with "gpu" in it); to run {nproc} on purpose, pass '
        f"--nproc-per-node {nproc} to torchrun"
    )


def _name(sources: dict[str, str], field_name: str, env: str) -> str:
    return sources.get(field_name) or env


def trainjob_rdzv_id(master_addr: str | None, source: str | None) -> tuple[str, str]:
    """The c10d rendezvous id when none is given: the same on every node whatever each node calls
    the master. Only Trainer's PET_MASTER_ADDR qualifies (identical in every pod), and only when it
    has Trainer's shape, from which the TrainJob name is read; anything else gets torchrun's
    default. An address a node was handed on its own command line never does: one node may be
    given a name and another an IP for the same master."""
    if source == "PET_MASTER_ADDR" and master_addr and (match := _TRAINER_MASTER.match(master_addr)):
        return match["trainjob"], "the TrainJob name in PET_MASTER_ADDR"
    return DEFAULT_RDZV_ID, "torchrun's default (no PET_RDZV_ID, and no Trainer PET_MASTER_ADDR to name the job)"


def torch_endpoint(text: str, default_port: int | None) -> tuple[str, int | None]:
    """``HOST[:PORT]`` split as torchrun's parse_rendezvous_endpoint splits it: a bracketed whole is
    an IPv6 host; otherwise the text after the last colon is the port."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        host, port = text, None
    else:
        host, colon, port = text.rpartition(":")
        if not colon:
            host, port = text, None
    bare = host[1:-1] if len(host) > 1 and host.startswith("[") and host.endswith("]") else host
    if port is None:
        return bare, default_port
    return bare, int(port) if port.isdigit() else -1


@dataclass(frozen=True)
class _Rendezvous:
    mode: str
    fill: dict[str, str | bool]  # flags the launcher fills in (the user's typed ones still win)
    wait: Wait
    shown: dict[str, str]


def plan_torch(
    torch: TorchSettings,
    host: HostFacts,
    run: TorchrunArgs,
    sources: dict[str, str],
    keep_nproc: bool = False,
    user_env: Mapping[str, str] | None = None,
    generation: int = 0,
) -> TorchPlan:
    """``sources`` maps a setting to the flag or variable that gave it (absent: the default).
    ``user_env``: the environment torchrun will inherit, for the settings the plan leaves to the
    user when set (None: unknown, so the plan sets none of them). ``generation``: which start in
    place of the job this plans (launcher.core.lifecycle), each with a store of its own."""
    torch = for_generation(torch, sources, generation)
    min_nodes, max_nodes = torch.nnodes
    nnodes = str(min_nodes) if min_nodes == max_nodes else f"{min_nodes}:{max_nodes}"
    nproc_name = sources.get("nproc_per_node", "default")
    nproc, nproc_source = resolve_nproc(torch.nproc_per_node, host, nproc_name)
    nproc, nproc_note = fit_to_accelerators(
        nproc, nproc_name if isinstance(torch.nproc_per_node, int) else "", host, keep_nproc
    )
    if torch.node_rank >= max_nodes:
        raise ConfigError(
            _name(sources, "node_rank", "PET_NODE_RANK"),
            str(torch.node_rank),
            f"a node rank below the node count {max_nodes} ({_name(sources, 'nnodes', 'PET_NNODES')}={nnodes})",
        )
    shown = {
        "nnodes": _name(sources, "nnodes", "default"),
        "nproc_per_node": f"{nproc_source}; {nproc_note}" if nproc_note else nproc_source,
        "node_rank": _name(sources, "node_rank", "default"),
    }
    rendezvous = _rendezvous(torch, sources, nnodes)
    shown.update(rendezvous.shown)
    fill: dict[str, str | bool] = {"nnodes": nnodes, "nproc_per_node": str(nproc), **rendezvous.fill}
    if rendezvous.mode == "standalone":
        fill["nnodes"] = "1"  # each node its own job: a standalone store never admits a second node
    # A job of a fixed size restarts in place through the launcher, every node at once; torchrun
    # restarts nothing on its own there. An elastic one keeps torchrun's restarts: each is a new
    # rendezvous that nodes may join or leave.
    elastic = min_nodes != max_nodes
    for dest in ("rdzv_id", "rdzv_conf", *(("max_restarts",) if elastic else ())):  # set anywhere
        value = getattr(torch, dest)
        if value is not None:
            fill[dest] = str(value)
    # A later generation's store is elsewhere: the plan writes where, whatever the user typed.
    dropped = (*(() if elastic else ("max_restarts",)), *(_MOVED if generation else ()))
    typed = {dest: given for dest, given in run.given.items() if dest not in dropped}
    if "nproc_per_node" in typed:  # a count torchrun reads the same; auto/cpu/gpu resolved as above
        typed["nproc_per_node"] = Given(str(nproc), typed["nproc_per_node"].option)
    planned = {**fill, **{dest: t for dest, t in typed.items() if dest in OWNED}}
    order = [dest for dest in _ORDER if dest in planned] + [dest for dest in typed if dest not in OWNED]
    flags = tuple(torchrun_args.render({**planned, **typed}, order))
    if not run.program:
        raise ConfigError(
            "SCRIPT",
            None,
            "a training script after the options: "
            "trainer-launcher torch [OPTIONS] -- [TORCHRUN FLAGS] SCRIPT [ARGS...]",
        )
    program = tuple(torchrun_args.program_argv(run.program))
    _check_reads_back(flags + program, typed, planned, run.program)
    env_set: dict[str, str] = {}
    if not host.omp_num_threads_set:
        # torchrun would set 1 for every rank; give each rank its share of the quota instead.
        env_set["OMP_NUM_THREADS"] = str(max(1, int(host.cpus // nproc)))
        shown["OMP_NUM_THREADS"] = f"{host.cpus:g} CPUs / {nproc} processes"
    if user_env is not None:
        job, _ = trainjob_rdzv_id(torch.master_addr, sources.get("master_addr"))
        env_set.update(flight_recorder_env(user_env, flight.directory(None if job == DEFAULT_RDZV_ID else job)))
    return TorchPlan(
        mode=rendezvous.mode,
        nnodes=nnodes if rendezvous.mode != "standalone" or "nnodes" in typed else "1",
        nproc_per_node=nproc,
        node_rank=torch.node_rank,
        torchrun_args=flags + program[: len(program) - len(run.program)],
        program=run.program,
        env_set=env_set,
        env_unset=CONSUMED_ENV,
        wait=rendezvous.wait,
        sources=shown,
        warnings=(nproc_note,) if nproc_note else (),
        max_restarts=None if elastic else torch.max_restarts,
    )


# Where a generation's store is: what a restart in place moves.
_MOVED = ("master_port", "rdzv_endpoint", "rdzv_id")


def for_generation(torch: TorchSettings, sources: dict[str, str], generation: int) -> TorchSettings:
    """The settings of the job's ``generation``-th start in place. Its store listens ``generation``
    ports above the first one's (the last generation's may still be serving the nodes that are
    leaving it, and a node must never join the old one); an etcd rendezvous, whose server is not
    ours, gets a new id instead."""
    if not generation:
        return torch
    port_name = _name(sources, "master_port", "PET_MASTER_PORT")
    update: dict = {"master_port": generation_port(torch.master_port, generation, port_name)}
    backend = torch.rdzv_backend or ""
    if backend.startswith("etcd"):
        update["rdzv_id"] = f"{torch.rdzv_id or DEFAULT_RDZV_ID}-{generation}"
    elif torch.rdzv_endpoint is not None:
        host, port = torch_endpoint(torch.rdzv_endpoint, C10D_DEFAULT_PORT)
        name = _name(sources, "rdzv_endpoint", "PET_RDZV_ENDPOINT")
        if port is not None and port > 0:
            update["rdzv_endpoint"] = f"{_bracketed(host)}:{generation_port(port, generation, name)}"
    return torch.model_copy(update=update)


def flight_recorder_env(user_env: Mapping[str, str], directory: str) -> dict[str, str]:
    """The flight recorder's variables for the ranks: each setting the user set none of the names
    of, under its current name; dumps go to ``directory``."""
    planned: dict[str, str] = {}
    for names, value in FLIGHT_RECORDER:
        if not any(name in user_env for name in names):
            planned[names[0]] = value or f"{directory}/{flight.FILE_PREFIX}"
    return planned


def _rendezvous(torch: TorchSettings, sources: dict[str, str], nnodes: str) -> _Rendezvous:
    """Which rendezvous, what the launcher fills in for it, and what to wait for."""
    min_nodes, max_nodes = torch.nnodes
    backend = torch.rdzv_backend
    backend_source = _name(sources, "rdzv_backend", "PET_RDZV_BACKEND")
    if torch.standalone:
        return _Rendezvous(
            "standalone", {"standalone": True}, Wait(), {"mode": _name(sources, "standalone", "PET_STANDALONE")}
        )
    if backend is None and min_nodes != max_nodes:
        # torchrun's static default cannot admit a varying node count: it would wait for MAX.
        return _dynamic("c10d", torch, sources, nnodes, "an elastic node count with no rendezvous backend given")
    if backend in (None, "static"):
        if max_nodes == 1 and torch.rdzv_endpoint is None and "master_port" not in sources:
            # torchrun does the same: a private c10d store on a free port.
            return _Rendezvous(
                "standalone", {"standalone": True}, Wait(), {"mode": "one node and no master port or endpoint"}
            )
        return _static(torch, sources, nnodes, backend_source if backend else "default (torchrun's static rendezvous)")
    return _dynamic(backend, torch, sources, nnodes, backend_source)


def _static(torch: TorchSettings, sources: dict[str, str], nnodes: str, backend_source: str) -> _Rendezvous:
    """torchrun's static rendezvous: node rank as given; the master is the endpoint when there is
    one (torchrun reads it so), else master address and port."""
    fill: dict[str, str | bool] = {"node_rank": str(torch.node_rank), "rdzv_backend": "static"}
    shown = {"mode": backend_source}
    if torch.rdzv_endpoint is not None:
        endpoint_name = _name(sources, "rdzv_endpoint", "PET_RDZV_ENDPOINT")
        host, port = torch_endpoint(torch.rdzv_endpoint, None)
        if port is None:
            raise ConfigError(
                endpoint_name,
                torch.rdzv_endpoint,
                "HOST:PORT: static rendezvous takes the master's port from the endpoint",
            )
        fill["rdzv_endpoint"] = torch.rdzv_endpoint
        shown["master"] = f"{endpoint_name} (static: the endpoint is the master)"
    else:
        master = torch.master_addr
        if master is None:
            if torch.nnodes[1] > 1:
                raise ConfigError("PET_MASTER_ADDR", None, f"the rank-0 node's address for a {nnodes}-node job")
            master = "127.0.0.1"  # torchrun's default, and right on one node
        host, port = torch_endpoint(_bracketed(master), torch.master_port)
        fill["master_addr"] = master
        fill["master_port"] = str(torch.master_port)
        shown["master_addr"] = _name(sources, "master_addr", "default")
        shown["master_port"] = _name(sources, "master_port", "default")
    return _Rendezvous("static", fill, _wait_for(host, port, rank_zero_serves=torch.node_rank == 0, store=True), shown)


def _dynamic(backend: str, torch: TorchSettings, sources: dict[str, str], nnodes: str, why: str) -> _Rendezvous:
    """c10d, etcd: nodes meet at an endpoint under a shared id; the rendezvous assigns node ranks."""
    shown = {"mode": why}
    endpoint = torch.rdzv_endpoint
    if endpoint is None:
        if torch.master_addr is None:
            raise ConfigError(
                "PET_MASTER_ADDR",
                None,
                f"the master's address (or PET_RDZV_ENDPOINT) for {backend} rendezvous (nnodes {nnodes})",
            )
        endpoint = f"{_bracketed(torch.master_addr)}:{torch.master_port}"
        shown["rdzv_endpoint"] = (
            f"{_name(sources, 'master_addr', 'PET_MASTER_ADDR')}:{_name(sources, 'master_port', 'default')}"
        )
    else:
        shown["rdzv_endpoint"] = _name(sources, "rdzv_endpoint", "PET_RDZV_ENDPOINT")
    if torch.rdzv_id is not None:
        rdzv_id = torch.rdzv_id
        shown["rdzv_id"] = _name(sources, "rdzv_id", "PET_RDZV_ID")
    else:
        rdzv_id, shown["rdzv_id"] = trainjob_rdzv_id(torch.master_addr, sources.get("master_addr"))
    etcd = backend.startswith("etcd")
    host, port = torch_endpoint(endpoint, ETCD_DEFAULT_PORT if etcd else C10D_DEFAULT_PORT)
    fill: dict[str, str | bool] = {"rdzv_backend": backend, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id}
    # c10d: the node whose address is the endpoint serves the store (rank 0 under Trainer);
    # etcd is a server of its own that every node needs.
    return _Rendezvous(
        backend,
        fill,
        _wait_for(host, port, rank_zero_serves=torch.node_rank == 0 and not etcd, store=backend == "c10d"),
        shown,
    )


def _check_reads_back(argv: tuple[str, ...], typed: dict[str, Given], planned: dict, program: tuple[str, ...]) -> None:
    """torchrun must read from the plan what the user and the plan meant; argparse has quirks
    (``--`` handling changed between Python versions), so the plan is read back to be sure."""
    line = torchrun_args.read(list(argv))
    values = {dest: str(t.value) for dest, t in line.given.items()}
    meant = {
        dest: str(v.value if isinstance(v, Given) else v) for dest, v in {**planned, **typed}.items() if v is not False
    }
    if line.program != program or values != meant:
        raise ConfigError(
            "torchrun flags",
            " ".join(argv),
            "a command line torchrun reads back unchanged (please report this as a bug)",
        )


def _host_port(address: tuple[str, int] | None) -> str | None:
    return f"{_bracketed(address[0])}:{address[1]}" if address else None


def _bracketed(host: str) -> str:
    """An IPv6 literal needs brackets before a ``:port`` is added."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _wait_for(host: str, port: int | None, rank_zero_serves: bool, store: bool = False) -> Wait:
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    # The serving node opens the port itself; the others need it up before torchrun dials it.
    return Wait(
        resolve=bare,
        connect=None if rank_zero_serves or port is None else (bare, port),
        store=(bare, port) if store and port is not None else None,
    )
