"""torch's private elastic API, each use behind a feature check: the one place the launcher
reaches into torch internals.

The agent (launcher/torch/agent.py) runs torchrun's own ``main`` and adjusts five of its private
pieces. Each hook below looks for what it patches; where a torch lacks it, that feature is off,
the agent says so once on stderr ("trainer-launcher: torch 2.4.1: ... is off: ..."), and
everything else runs as it would with plain torchrun. Verified on torch 2.4.1, 2.8.0, 2.13.0 and
2.15.0 (tests/test_matrix_torch.py runs each).

| hook                   | patches                                      | without it                              |
| bind_workers           | subprocess_handler's Popen (2.8 on:          | ranks are not killed with a SIGKILLed   |
|                        | ``Popen``; 2.4: the module's ``subprocess``) | agent (the launcher's teardown still    |
|                        |                                              | kills them)                             |
| publish_final_failures | ``LocalElasticAgent._monitor_workers``       | other nodes hear of a failure when      |
|                        |                                              | torchrun exits, after its teardown, not |
|                        |                                              | before                                  |
| stop_within_grace      | ``PContext.close``'s timeout;                | a rank ignoring SIGTERM holds the node  |
|                        | ``_stop_workers`` through                    | for torchrun's own 30 s                 |
|                        | ``_shutdown(timeout=)`` (torch 2.5+)         |                                         |
| terminate_once         | ``api._terminate_process_handler``           | a second SIGTERM may log a "Logging     |
|                        |                                              | error"                                  |
| keep_rendezvous_store  | ``SimpleElasticAgent._rendezvous`` (the      | the store closes when torchrun returns  |
|                        | agent's ``_store`` after it)                 | on its node: the others may still be    |
|                        |                                              | using it                                |

Also here, read without importing torch: the installed torchrun's flags (:func:`torchrun_flags`),
from the source of ``torch/distributed/run.py``, so flags of a newer torchrun pass through and
flags an older one lacks are refused as it would refuse them.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import signal
import subprocess
import types
from dataclasses import dataclass

from launcher.core import versions

notes = versions.FeatureNotes("torch")  # each said once
feature_off = notes.off


def torch_version() -> str:
    return versions.installed("torch") or "unknown"


# --- the agent's hooks ---------------------------------------------------------------------------


def bind_workers(workers: list, in_child, env: dict[str, str] | None = None, take=None) -> bool:
    """Run ``in_child`` in every rank before it execs (PR_SET_PDEATHSIG), give it ``env`` over what
    torchrun gives it, and append each rank's Popen to ``workers``. ``take(args, kwargs)``: a
    process already started that runs the rank (launcher.torch.ahead), or None. False (and said
    once) where torch's subprocess handler has neither layout; the caller then finds its ranks
    another way (:func:`child_processes`)."""
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as module
    except ImportError:
        module = None
    real = None
    if module is not None and callable(getattr(module, "Popen", None)):
        real, install = module.Popen, lambda popen: setattr(module, "Popen", popen)  # seen from torch 2.8 on
    elif module is not None and getattr(module, "subprocess", None) is subprocess:
        real = subprocess.Popen  # torch 2.4 calls subprocess.Popen through the module's import

        def install(popen) -> None:
            shim = types.ModuleType("subprocess")
            shim.__dict__.update(vars(subprocess), Popen=popen)
            module.subprocess = shim

    if real is None:
        feature_off(
            "binding ranks to the agent's life",
            "torch's subprocess handler has no Popen to wrap; the launcher's teardown still stops them",
        )
        return False

    def popen(*args, **kwargs):
        kwargs.setdefault("preexec_fn", in_child)
        if env and kwargs.get("env") is not None:
            kwargs["env"] = {**kwargs["env"], **env}
        process = (take(args, kwargs) if take is not None else None) or real(*args, **kwargs)
        workers.append(process)
        return process

    install(popen)
    return True


class _Child:
    """A child process seen through psutil, with the two things the agent asks of a Popen."""

    def __init__(self, process):
        self.pid, self._process = process.pid, process

    def poll(self) -> int | None:
        import psutil

        try:
            return 0 if self._process.status() == psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            return 0


def child_processes() -> list:
    """This process's children (torchrun's ranks), for a torch whose Popen cannot be wrapped."""
    import psutil

    return [_Child(child) for child in psutil.Process().children()]


def publish_final_failures(on_final_failure) -> bool:
    """Call ``on_final_failure(failures)`` the moment torchrun's monitor sees a failure it will not
    restart from, before it stops the other local ranks."""
    try:
        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError as error:
        feature_off("telling other nodes before the local teardown", str(error))
        return False
    monitor = getattr(LocalElasticAgent, "_monitor_workers", None)
    if monitor is None or not hasattr(WorkerState, "FAILED"):
        feature_off(
            "telling other nodes before the local teardown",
            "LocalElasticAgent has no _monitor_workers; other nodes hear when torchrun exits",
        )
        return False

    def watched(self, worker_group):
        result = monitor(self, worker_group)
        final = getattr(self, "_remaining_restarts", 0) <= 0
        if final and result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            on_final_failure(result.failures)
        return result

    LocalElasticAgent._monitor_workers = watched
    return True


def stop_within_grace(timeout: int) -> bool:
    """torchrun gives its ranks its shutdown timeout only when it is signalled. When a rank fails,
    the process context stops the others with ``close()``'s default of 30 s, and
    ``LocalElasticAgent._stop_workers`` again with a hardcoded 30 s (torch 2.13 still, pytorch#192815):
    a rank ignoring SIGTERM would hold the job for 30 s whatever the grace. Both follow ``timeout``
    where torch has them. True when the close timeout follows it (the one every path goes through)."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing.api import PContext
    except ImportError as error:
        feature_off("the grace period for ranks ignoring SIGTERM", str(error))
        return False
    close = getattr(PContext, "close", None)
    if close is None or "timeout" not in _parameters(close):
        feature_off(
            "the grace period for ranks ignoring SIGTERM",
            "PContext.close takes no timeout: such ranks wait torchrun's own 30 s",
        )
        return False

    def close_within(self, death_sig=None, timeout: float = timeout) -> None:
        close(self, death_sig, timeout)

    PContext.close = close_within
    shutdown = getattr(LocalElasticAgent, "_shutdown", None)
    # torch 2.4 has no timeout here: its _stop_workers reaches close() through _shutdown(), which
    # the patch above already bounds.
    if hasattr(LocalElasticAgent, "_stop_workers") and shutdown is not None and "timeout" in _parameters(shutdown):

        def stop_workers(self, worker_group, *args, **kwargs) -> None:
            self._shutdown(timeout=getattr(self, "_shutdown_timeout", timeout))

        LocalElasticAgent._stop_workers = stop_workers
    return True


def terminate_once() -> bool:
    """torchrun turns SIGTERM into an exception in its main thread. A second one (the launcher's
    teardown and a peer's stop record may both send one) lands inside its shutdown and leaves a
    "Logging error" traceback in the log. After the first, later ones are ignored (the launcher
    still SIGKILLs what is left after the grace period)."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError as error:
        feature_off("ignoring a second SIGTERM during shutdown", str(error))
        return False
    first = getattr(api, "_terminate_process_handler", None)
    if first is None:
        feature_off("ignoring a second SIGTERM during shutdown", "torch has no _terminate_process_handler")
        return False

    def once(signum, frame) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        first(signum, frame)

    api._terminate_process_handler = once
    return True


def keep_rendezvous_store(keep) -> bool:
    """Call ``keep(store)`` after each rendezvous torchrun's agent joins, with its store (None
    where the agent keeps none), so the caller can hold it. On the node serving it, torchrun's
    TCPStore object owns the server: the server closes the moment that object is freed, which is
    when ``torchrun.main`` returns on a good run, while the other nodes may still be in the exit
    barrier or reading the job's outcomes (launcher.torch.peers). Held, it lives until the agent
    exits."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except ImportError as error:
        feature_off("keeping the job's store up until every node is done with it", str(error))
        return False
    rendezvous = getattr(SimpleElasticAgent, "_rendezvous", None)
    if rendezvous is None:
        feature_off(
            "keeping the job's store up until every node is done with it",
            "SimpleElasticAgent has no _rendezvous; the store may close before the other nodes are done",
        )
        return False

    def rendezvous_kept(self, *args, **kwargs):
        result = rendezvous(self, *args, **kwargs)
        keep(getattr(self, "_store", None))
        return result

    SimpleElasticAgent._rendezvous = rendezvous_kept
    return True


def serves_port(port: int) -> bool | None:
    """Whether this process listens on TCP ``port`` (the node whose torchrun serves the job's
    store). None when it cannot tell."""
    try:
        import psutil

        process = psutil.Process()
        connections = getattr(process, "net_connections", None) or process.connections  # psutil < 6
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections("tcp"))
    except Exception:  # noqa: BLE001 - psutil missing, /proc unreadable
        return None


def _parameters(function) -> set[str]:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return set()


# --- the installed torchrun's grammar, without importing torch -----------------------------------


@dataclass(frozen=True)
class InstalledFlag:
    dest: str
    options: tuple[str, ...]
    takes_value: bool
    kind: str  # str, int or float, as torchrun converts the value
    from_env: bool  # torchrun's env/check_env actions read PET_<DEST> when the flag is absent


@dataclass(frozen=True)
class InstalledTorchrun:
    version: str
    flags: tuple[InstalledFlag, ...]


@functools.lru_cache(maxsize=1)
def torchrun_flags() -> InstalledTorchrun | None:
    """The flags of the torchrun installed beside this interpreter, read from the source of
    ``torch/distributed/run.py``'s ``get_args_parser()`` (its ``add_argument`` calls), so reading a
    command line costs milliseconds rather than ``import torch``. None when torch is not
    installed here (a plan made on a machine without it) or the source does not have that shape."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "distributed", "run.py")
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    parser = next(
        (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "get_args_parser"), None
    )
    if parser is None:
        return None
    flags = [flag for node in ast.walk(parser) if (flag := _flag_of(node)) is not None]
    if not any("--nnodes" in flag.options for flag in flags):
        return None
    return InstalledTorchrun(torch_version(), tuple(flags))


def _flag_of(node: ast.AST) -> InstalledFlag | None:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return None
    options = tuple(arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str))
    if not options or not all(option.startswith("-") for option in options):
        return None  # the positionals (training_script, its args)
    keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
    action = _name(keywords.get("action"))
    kind = _name(keywords.get("type")) or "str"
    dest = keywords.get("dest")
    name = (
        dest.value
        if isinstance(dest, ast.Constant) and isinstance(dest.value, str)
        else next((o for o in options if o.startswith("--")), options[0]).lstrip("-").replace("-", "_")
    )
    switch = action in ("store_true", "store_false", "check_env", "store_const", "count")
    return InstalledFlag(
        name, options, not switch, kind if kind in ("int", "float") else "str", action in ("env", "check_env")
    )


def _name(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return None
