"""Settings + host facts -> the torchrun command line. Pure: no I/O, no clock, no subprocess."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.devices import HostFacts
from launcher.outcome import ConfigError
from launcher.settings import Override, TorchSettings, split_host_port

C10D_DEFAULT_PORT = 29400

# torchrun flags that set what TorchSettings holds: they override PET_* (torchrun's own order).
_SETTING_FLAGS = {
    "nnodes": ("--nnodes",),
    "nproc_per_node": ("--nproc-per-node", "--nproc_per_node"),
    "node_rank": ("--node-rank", "--node_rank"),
    "master_addr": ("--master-addr", "--master_addr"),
    "master_port": ("--master-port", "--master_port"),
    "rdzv_backend": ("--rdzv-backend", "--rdzv_backend"),
    "rdzv_endpoint": ("--rdzv-endpoint", "--rdzv_endpoint"),
    "rdzv_id": ("--rdzv-id", "--rdzv_id"),
    "rdzv_conf": ("--rdzv-conf", "--rdzv_conf"),
    "max_restarts": ("--max-restarts", "--max_restarts"),
    "standalone": ("--standalone",),
}
_FLAG_TO_SETTING = {flag: name for name, flags in _SETTING_FLAGS.items() for flag in flags}
# torchrun options that take no value; every other option takes one.
_SWITCHES = {
    "--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank",
}
# Settings the plan consumes: removed from the child's environment so torchrun sees only the
# explicit flags the plan prints.
CONSUMED_ENV = (
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_MAX_RESTARTS",
    "PET_STANDALONE",
)


@dataclass(frozen=True)
class TorchrunArgs:
    """What the user wrote after ``--``: torchrun flags, then the script and its arguments."""

    overrides: dict[str, Override]  # flags that set a TorchSettings field
    passthrough: tuple[str, ...]  # other torchrun flags, verbatim
    program: tuple[str, ...]  # script (or module) and its arguments


def split_torchrun_args(args: list[str]) -> TorchrunArgs:
    """Split ``[TORCHRUN FLAGS] SCRIPT [ARGS]`` the way torchrun's parser would."""
    overrides: dict[str, Override] = {}
    passthrough: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        flag, eq, inline = arg.partition("=")
        if flag in _SWITCHES and not eq:
            value: str | None = None
            i += 1
        elif eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(flag, None, "a value after it")
            value = args[i + 1]
            i += 2
        setting = _FLAG_TO_SETTING.get(flag)
        if setting == "standalone":
            overrides[setting] = Override(True if value is None else value, flag)
        elif setting:
            overrides[setting] = Override(value, flag)
        else:
            passthrough += [arg] if value is None or eq else [arg, value]
    return TorchrunArgs(overrides, tuple(passthrough), tuple(args[i:]))


@dataclass(frozen=True)
class Wait:
    """What must be reachable before torchrun starts."""

    resolve: str | None = None  # a DNS name that must resolve
    connect: tuple[str, int] | None = None  # a host:port that must accept TCP

    def to_json(self) -> dict:
        return {"resolve": self.resolve, "connect": f"{self.connect[0]}:{self.connect[1]}" if self.connect else None}


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
        }


def resolve_nproc(requested: str | int, host: HostFacts, source: str) -> tuple[int, str]:
    """``auto``/``gpu``/``cpu`` -> a process count, and how it was found."""
    if isinstance(requested, int):
        return requested, source if source.startswith(("PET_", "--")) else "default"
    if requested in ("auto", "gpu") and host.gpu_count > 0:
        return host.gpu_count, f"{source}={requested}: {host.gpu_count} visible GPUs"
    if requested == "gpu":
        raise ConfigError(source, requested, "at least one visible GPU (found no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES hides them)")
    how = f"CPU quota {host.cpus:g}" if host.cpu_quota is not None else f"{host.cpu_affinity} CPUs"
    return host.whole_cpus, f"{source}={requested}: {how}"


def _name(sources: dict[str, str], field_name: str, env: str) -> str:
    return sources.get(field_name) or env


def _stable_rdzv_id(master_addr: str) -> str:
    """Trainer's master is ``<trainjob>-node-0-0.<trainjob>``: the TrainJob name is the part after
    the first dot, the same on every node and every restart of the job. An IP address is used
    whole."""
    bare = master_addr.strip("[]")
    if bare.replace(".", "").isdigit() or ":" in bare:
        name = bare.replace(":", "-")
    else:
        head, _, rest = bare.partition(".")
        name = rest.split(".")[0] if rest else head
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-.")
    return cleaned[:128] or "trainer-launcher"


def plan_torch(
    torch: TorchSettings,
    host: HostFacts,
    run: TorchrunArgs,
    sources: dict[str, str],
) -> TorchPlan:
    """``sources`` maps a setting to the flag or variable that gave it (absent: the default)."""
    min_nodes, max_nodes = torch.nnodes
    nnodes = str(min_nodes) if min_nodes == max_nodes else f"{min_nodes}:{max_nodes}"
    nproc, nproc_source = resolve_nproc(torch.nproc_per_node, host, _name(sources, "nproc_per_node", "PET_NPROC_PER_NODE"))
    if torch.node_rank >= max_nodes:
        raise ConfigError(
            _name(sources, "node_rank", "PET_NODE_RANK"), str(torch.node_rank),
            f"a node rank below the node count {max_nodes} ({_name(sources, 'nnodes', 'PET_NNODES')}={nnodes})",
        )
    shown = {
        "nnodes": _name(sources, "nnodes", "default"),
        "nproc_per_node": nproc_source,
        "node_rank": _name(sources, "node_rank", "default"),
    }
    rendezvous_asked = torch.rdzv_backend not in (None, "static") or torch.rdzv_endpoint is not None
    elastic = min_nodes != max_nodes
    args: list[str]
    if torch.standalone or (max_nodes == 1 and torch.master_addr is None and not rendezvous_asked):
        mode = "standalone"
        args = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)]
        wait = Wait()
        shown["mode"] = _name(sources, "standalone", "one node and no master address")
    elif elastic or rendezvous_asked:
        mode = torch.rdzv_backend if torch.rdzv_backend not in (None, "static") else "c10d"
        endpoint = torch.rdzv_endpoint
        if endpoint is None:
            if torch.master_addr is None:
                raise ConfigError(
                    "PET_MASTER_ADDR", None,
                    f"the master's address (or PET_RDZV_ENDPOINT) for {mode} rendezvous (nnodes {nnodes})",
                )
            endpoint = f"{_bracketed(torch.master_addr)}:{torch.master_port}"
            shown["rdzv_endpoint"] = f"{_name(sources, 'master_addr', 'PET_MASTER_ADDR')}:{_name(sources, 'master_port', 'PET_MASTER_PORT')}"
        else:
            shown["rdzv_endpoint"] = _name(sources, "rdzv_endpoint", "PET_RDZV_ENDPOINT")
        rdzv_host, rdzv_port = split_host_port(endpoint)
        rdzv_port = rdzv_port or C10D_DEFAULT_PORT
        rdzv_id = torch.rdzv_id or _stable_rdzv_id(rdzv_host if torch.master_addr is None else torch.master_addr)
        shown["rdzv_id"] = _name(sources, "rdzv_id", "derived from the master address (the TrainJob name)")
        # No --node-rank: the rendezvous assigns ranks (torchrun warns that it ignores it).
        args = [
            "--nnodes", nnodes, "--nproc-per-node", str(nproc),
            "--rdzv-backend", mode, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
        ]
        if torch.rdzv_conf:
            args += ["--rdzv-conf", torch.rdzv_conf]
        args += ["--max-restarts", str(torch.max_restarts or 0)]
        wait = _wait_for(rdzv_host, rdzv_port, torch.node_rank)
    else:
        mode = "static"
        if torch.master_addr is None:
            raise ConfigError("PET_MASTER_ADDR", None, f"the rank-0 node's address for a {nnodes}-node job")
        args = [
            "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--node-rank", str(torch.node_rank),
            "--rdzv-backend", "static", "--master-addr", torch.master_addr,
            "--master-port", str(torch.master_port),
        ]
        if torch.max_restarts is not None:
            args += ["--max-restarts", str(torch.max_restarts)]
        wait = _wait_for(torch.master_addr, torch.master_port, torch.node_rank)
        shown["master_addr"] = _name(sources, "master_addr", "PET_MASTER_ADDR")
        shown["master_port"] = _name(sources, "master_port", "default")
    if not run.program:
        raise ConfigError("SCRIPT", None, "a training script after the options: trainer-launcher torch [OPTIONS] -- [TORCHRUN FLAGS] SCRIPT [ARGS...]")
    env_set: dict[str, str] = {}
    if not host.omp_num_threads_set:
        # torchrun would set 1 for every rank; give each rank its share of the quota instead.
        env_set["OMP_NUM_THREADS"] = str(max(1, int(host.cpus // nproc)))
        shown["OMP_NUM_THREADS"] = f"{host.cpus:g} CPUs / {nproc} processes"
    return TorchPlan(
        mode=mode,
        nnodes=nnodes,
        nproc_per_node=nproc,
        node_rank=torch.node_rank,
        torchrun_args=tuple(args) + run.passthrough,
        program=run.program,
        env_set=env_set,
        env_unset=CONSUMED_ENV,
        wait=wait,
        sources=shown,
    )


def _bracketed(host: str) -> str:
    """An IPv6 literal needs brackets before a ``:port`` is added."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _wait_for(host: str, port: int, node_rank: int) -> Wait:
    bare = host[1:-1] if host.startswith("[") else host
    # Rank 0 serves the port itself; the others need it up before torchrun dials it.
    return Wait(resolve=bare, connect=(bare, port) if node_rank > 0 else None)
