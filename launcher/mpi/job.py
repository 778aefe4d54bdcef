"""``trainer-launcher mpi``: the MPI launcher role (hostfile -> mpirun, supervised) and, with
``--worker``, the worker role (private key copies -> sshd on port 2222, supervised)."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import replace

from launcher import k8s, status
from launcher.core import judge, lifecycle, log, settings, versions
from launcher.core.exec_job import CommandPod, node_name
from launcher.core.outcome import (
    PEER_LOSS_PATTERN,
    ConfigError,
    LauncherError,
    Outcome,
    Reasons,
    RootCause,
    WaitTimeout,
    evidence_regex,
    rank_verdict,
    signal_name,
    stopped,
)
from launcher.core.settings import HostEnv, LauncherSettings, Override
from launcher.core.supervisor import Child
from launcher.export.step import Export
from launcher.mpi import lost, ssh
from launcher.mpi.detect import MpiImpl, detect, find_libmpi
from launcher.mpi.hostfile import Host, parse_hostfile
from launcher.mpi.plan import MpiFacts, MpiPlan, hostfile_option, known_hosts_text, plan_mpi, split_mpirun_args
from launcher.mpi.rank import REPORT_ENV
from launcher.mpi.reports import RankReports, facing_address
from launcher.mpi.settings import MpiSettings
from launcher.runner.report import Report

# How the MPIs name the rank that brought the job down (MPI_Abort, as `python -m mpi4py` calls it).
_ABORT_RANK = (
    re.compile(r"MPI_ABORT was invoked on rank (\d+)"),  # Open MPI
    # Open MPI's "exited with non-zero status ... The first process to do so was: Process name:
    # [[35711,1],1]" (4) or "[prterun-<host>-<pid>@1,1]" (5): the rank is the last number.
    re.compile(r"The first process to do so was:\s*Process name:\s*\[.*,(\d+)\]"),
    re.compile(r"Abort\(\d+\) on node \d+ \(rank (\d+)"),  # MPICH, Intel MPI
)
# A rank a signal ended, as mpirun says it: its signal's number, and its rank and host where said.
_SIGNALED = (
    # Open MPI 4 and 5: "... noticed that process rank 1 with PID 123 on node h exited on signal 11".
    re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) exited on\s+signal (?P<sig>\d+)"),
    # Intel MPI's own handler in the rank: "python:123 terminated with signal 11 at PC=...".
    re.compile(r"\S+:\d+ terminated with signal (?P<sig>\d+) at PC="),
    # MPICH's hydra, below its banner's "EXIT CODE: 9" (the signal's number, which exits 9 too):
    # "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)". An exit(9) has no such line.
    re.compile(r"TERMINATED WITH THE EXIT STRING: .*\(signal (?P<sig>\d+)\)"),
)
_FAILED_HOST = (
    re.compile(r"rank \d+ with PID \d+ on node (\S+)"),  # Open MPI 5
    re.compile(r"RUNNING AT (\S+)"),  # hydra's BAD TERMINATION banner
    re.compile(r"on node (\S+) exited on signal"),  # Open MPI
)
# ssh's own words when it refuses a worker's host key under the pin, with the name it looked up
# ("[host]:port" for a port other than 22): the key it got differs from the pinned one, or is of a
# type the pin has none of.
_HOST_KEY_REFUSED = (
    re.compile(r"Host key for (\S+) has changed and you have requested strict checking"),
    re.compile(r"No \S+ host key is known for (\S+) and you have requested strict checking"),
)
_HOST_KEY_FAILED = "Host key verification failed"
# How long mpirun has to end the job once a rank reported its failure (at least the launcher's grace).
MPIRUN_ABORT_GRACE = 10.0
# Verdicts read from mpirun's exit code alone, which a worker pod's loss overrides (launcher.mpi.lost).
_MPIRUN_CODE = (Reasons.SUCCEEDED, Reasons.FAILED, Reasons.RETRYABLE_EXIT, Reasons.PEER_LOST)


def read_hosts(mpi: MpiSettings, mpi_overrides: dict[str, Override]) -> tuple[Host, ...]:
    source = settings.source_of(MpiSettings, "hostfile", mpi_overrides) or "/etc/mpi/hostfile"
    try:
        with open(mpi.hostfile, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ConfigError(source, mpi.hostfile, f"a readable hostfile ({error.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(source, mpi.hostfile, "a UTF-8 text hostfile") from None
    return parse_hostfile(text, mpi.hostfile, mpi.default_slots)


def facts(rest: list[str], impl: MpiImpl) -> MpiFacts:
    import importlib.util

    host = settings.load(HostEnv)
    _, program = split_mpirun_args(rest)
    return MpiFacts(
        is_root=os.geteuid() == 0,
        hostname=host.hostname or socket.gethostname(),
        python=sys.executable,
        has_mpi4py=importlib.util.find_spec("mpi4py") is not None,
        program_path=shutil.which(program[0]) if program else None,
        libmpi=find_libmpi(impl.launcher) if impl.flavor == "openmpi" else None,
    )


def make_plan(
    mpi_overrides: dict[str, Override], rest: list[str], launcher: LauncherSettings
) -> tuple[MpiSettings, MpiPlan]:
    """Read the MPI settings and the hostfile, detect the MPI, plan the run. A hostfile option in
    the mpirun flags (the SDK's `mpirun --hostfile /etc/mpi/hostfile ...`) names the hostfile."""
    # The ranks check their own mpi4py too (launcher.mpi.rank): their interpreter may be another.
    versions.check("python", "mpi4py", allow=launcher.allow_untested_versions)
    if option := hostfile_option(split_mpirun_args(rest)[0]):
        mpi_overrides = {**mpi_overrides, "hostfile": Override(option[1], f"mpirun {option[0]}")}
    mpi = settings.load(MpiSettings, mpi_overrides)
    hosts = read_hosts(mpi, mpi_overrides)
    impl = detect(mpi.mpirun, mpi.implementation, settings.source_of(MpiSettings, "mpirun", mpi_overrides) or "mpirun")
    sources = {"hostfile": settings.source_of(MpiSettings, "hostfile", mpi_overrides) or "default"}
    plan = plan_mpi(
        mpi,
        impl,
        hosts,
        rest,
        settings.environ(),
        facts(rest, impl),
        sources,
        watch_hangs=launcher.hang_timeout > 0,
        restarts=launcher.max_restarts > 0,
    )
    return mpi, plan


def run_mpi(launcher_overrides: dict[str, Override], mpi_overrides: dict[str, Override], rest: list[str]) -> int:
    return lifecycle.live(
        MpiPod(mpi_overrides, rest), launcher_overrides, status.start_watch, Export(), k8s.in_place_restart
    )


class MpiPod(CommandPod):
    """The launcher role: the hostfile and ssh's files written, every worker's sshd waited for,
    then mpirun, supervised. A worker's host key that ssh refused, else the ranks' failure reports
    when they send them, else mpirun's output names the root cause.

    A restart in place (LAUNCHER_MAX_RESTARTS) starts mpirun again here, over the workers' sshd,
    which serves on (:class:`MpiWorkerPod`): each start waits for the workers again, and its ranks
    report to a listener of their own, so a late report of an earlier start is never this one's."""

    name = "mpi"

    def __init__(self, mpi_overrides: dict[str, Override], rest: list[str]):
        super().__init__([])
        self.mpi_overrides, self.rest = mpi_overrides, rest
        self.reports: RankReports | None = None
        self.refused: list[str | None] = []
        self.base_env: dict[str, str] = {}  # mpirun's environment before each start's own variables
        self.lost: lost.LostWorkers | None = None  # this start's watch for a worker pod's loss
        self.rejoining: str | None = None  # this start waits for the lost worker pod's replacement
        self.stuck = False  # mpirun outlived a rank's failure report by its grace: the launcher stopped it

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        mpi, plan = make_plan(self.mpi_overrides, self.rest, life.launcher)
        ssh.install_keys(mpi.ssh_auth_mount_path, mpi.ssh_dir, _mount_source(self.mpi_overrides))
        if plan.known_hosts_path is not None:
            public_key = ssh.mounted_public_key(mpi.ssh_auth_mount_path, mpi.ssh_dir, _mount_source(self.mpi_overrides))
            ssh.write_private(plan.known_hosts_path, known_hosts_text(public_key))
        ssh.write_private(plan.hostfile_path, plan.hostfile_text, 0o644)
        ssh.write_private(plan.ssh_config_path, plan.ssh_config_text)
        ssh.write_private(plan.ssh_wrapper_path, plan.ssh_wrapper_text, 0o700)
        if plan.known_hosts_path is None:
            knob = settings.source_of(MpiSettings, "ssh_host_key_checking", self.mpi_overrides)
            log.warning(
                f"mpi: {knob or 'LAUNCHER_SSH_HOST_KEY_CHECKING'}=off: ssh accepts any host key from the "
                "workers, so a host on the pod network could pose as one"
            )
        self.mpi_plan, self.command = plan, list(plan.argv)
        self.base_env = {**settings.environ(), **plan.env_set}
        # Where the ranks in the workers' pods reach this one (the failure reports, the hang's stacks).
        self.facing = facing_address(plan.wait_hosts, plan.ssh_port)
        summary = (
            f"mpi: {plan.impl.name} {plan.impl.major or ''} on {len(plan.hosts)} hosts, "
            f"{plan.ranks if plan.ranks is not None else 'user-set'} ranks: {' '.join(plan.argv[:8])} ..."
        )
        # This pod sends the job's status. The ranks may run in the workers' pods, which cannot reach
        # a relay here: their status URL is left alone, and a hang's stacks come from them over the
        # board at the facing address.
        watch = {"relays": False, "board_at": self.facing if plan.wait_hosts else None}
        return lifecycle.Planned(plan, node_name(), summary, sends=True, watch=watch)

    def awaits(self, life: lifecycle.Life) -> lifecycle.Awaited:
        """Every worker's sshd accepts; after a worker pod was lost, its replacement's within
        LAUNCHER_REJOIN_TIMEOUT, as the pods of the other frameworks hold for theirs."""
        self.rejoining = lost.pod_lost_before(life)
        if self.rejoining is not None:
            life.deadline = time.monotonic() + life.launcher.rejoin_timeout
        return lifecycle.Awaited(hosts=life.plan.wait_hosts, port=life.plan.ssh_port)

    def wait_failed(self, life: lifecycle.Life, error: LauncherError) -> Outcome:
        if self.rejoining is not None and isinstance(error, WaitTimeout):
            return lost.not_back(self.rejoining, life.launcher.rejoin_timeout, str(error)).on_node(life.node)
        return super().wait_failed(life, error)

    def go(self, life: lifecycle.Life) -> None:
        own: dict[str, str] = {}  # this start's: where its ranks report, which start it is
        if life.plan.rank_reports:
            try:
                self.reports = RankReports(*self.facing)
            except OSError as error:
                log.warning(
                    f"mpi: no listener for the ranks' failure reports ({error.strerror or error}); "
                    "the failing rank is named from mpirun's output only"
                )
                own[REPORT_ENV] = ""
            else:
                life.closing(self.reports.close)
                own.update(self.reports.env)
        if life.max_restarts:
            own.update(lifecycle.restart_env(life.generation))
        # First in order, not last: MPICH 5.0.2's mpiexec loses the last variable of its environment
        # on the way to remote ranks (seen in tests/test_mpi.py); the plan's own, never exported, end
        # it. And ours in value.
        self.env = {**own, **self.base_env, **own}
        super().go(life)
        if self.lost is not None:
            life.supervisor.line_observers.remove(self.lost)
            self.lost = None
        if self.child is not None:
            self.lost = lost.LostWorkers(self.child)
            life.supervisor.line_observers.append(self.lost)
        if self.reports is not None and self._unstuck not in life.supervisor.tickers:
            self.life = life
            life.supervisor.tickers.append(self._unstuck)

    def _unstuck(self) -> None:
        """A rank reported its failure (it aborts the job next), and mpirun still runs after the
        grace: Open MPI 5's prterun once waited for ever after a second start's MPI_Abort (CI,
        1 run in 4,000 tests). The launcher stops it; the report is the verdict."""
        reports, child, supervisor = self.reports, self.child, self.life.supervisor
        if reports is None or reports.first_at is None or child is None or child.returncode is not None:
            return
        grace = max(self.life.launcher.grace_period, MPIRUN_ABORT_GRACE)
        if self.stuck or supervisor.teardown_started is not None or time.monotonic() < reports.first_at + grace:
            return
        self.stuck = True
        first = reports.received[0]
        log.warning(
            f"mpi: mpirun has not ended the job {grace:g}s after rank {first.rank} on {first.node} reported its "
            "failure; stopping it"
        )
        supervisor.begin_teardown()

    restarts_in_place = True

    def restart(self, life: lifecycle.Life) -> None:
        """The last start's listener closes: its ranks are gone, and what still comes to it is
        stale. The next start's mpirun, listener and verdict are its own."""
        if self.reports is not None:
            self.reports.close()
        self.reports, self.refused, self.stuck = None, [], False

    def restarts_after(self, life: lifecycle.Life, outcome: Outcome) -> bool:
        """After a lost worker pod too, unless LAUNCHER_REJOIN_TIMEOUT is 0: the next start's
        mpirun reaches its replacement's sshd by the same name, once it serves (awaits)."""
        return outcome.reason != Reasons.PEER_LOST or life.launcher.rejoin_timeout > 0

    def own_words(self, line: str) -> bool:
        return mpirun_own_words(line)

    def root_cause(self, child: Child, cause: RootCause) -> RootCause:
        if any(_HOST_KEY_FAILED in line for line in child.tail):
            self.refused.append(refused_host(child.tail))
        received = self.reports.received if self.reports is not None else None
        return root_cause(self.mpi_plan, child, cause, received)

    def conclude(self, life: lifecycle.Life, own: Outcome) -> Outcome:
        if self.reports is not None and self.stuck:  # mpirun's ending is the launcher's doing
            own = rank_verdict(self.reports.received[0], life.launcher.retryable_exit_codes)
        if self.reports is not None:
            own = with_reported_error(own, self.reports.received, life.launcher)
        if self.refused and own.exit_code != 0:
            return host_key_refused(self.refused[0])
        # A worker pod lost, whatever mpirun's code (Open MPI 5's is 0): the job's verdict, over
        # mpirun's code only. Not where a signal ended a rank (its own crash or kill, said by its
        # watcher or mpirun), nor where the launcher ended the job (a hang, this pod stopped).
        signaled = own.root_cause is not None and own.root_cause.signal is not None
        if self.lost is not None and own.reason in _MPIRUN_CODE and not signaled:
            self.lost.name_gone(life.plan.wait_hosts, life.plan.ssh_port)
            return self.lost.outcome(f"mpirun on {life.node}") or own
        return own


def _mount_source(mpi_overrides: dict[str, Override]) -> str:
    return settings.source_of(MpiSettings, "ssh_auth_mount_path", mpi_overrides) or "LAUNCHER_SSH_AUTH_MOUNT_PATH"


def refused_host(lines: Iterable[str]) -> str | None:
    """The worker whose host key ssh refused, as the hostfile names it, from mpirun's output."""
    for line in lines:
        for pattern in _HOST_KEY_REFUSED:
            if match := pattern.search(line):
                looked_up = match[1]
                bracketed = re.fullmatch(r"\[(.+)\]:\d+", looked_up)
                return bracketed[1] if bracketed else looked_up
    return None


def host_key_refused(host: str | None) -> Outcome:
    """Permanent: the worker serves a key other than the Secret's (its sshd has keys of its own,
    or the name reached another host); a restart meets the same key, so the runtimes' policy
    fails the job at once rather than retrying into it."""
    who = host or "a worker (ssh did not say which)"
    return Outcome.of(
        Reasons.HOST_KEY_MISMATCH,
        f"ssh refused {who}: its host key does not match the mounted Secret's key, which the worker "
        f"role's sshd serves (a worker whose own sshd has host keys of its own needs "
        f"LAUNCHER_SSH_HOST_KEY_CHECKING=off)",
        RootCause(node=host) if host else None,
    )


def mpirun_own_words(line: str) -> bool:
    """mpirun's output is every rank's: a peer's loss in it is some rank's echo, nobody's own words
    (the failing rank's own are in its report: with_reported_error)."""
    return not PEER_LOSS_PATTERN.search(line)


def with_reported_error(outcome: Outcome, received: list[Report], launcher: LauncherSettings) -> Outcome:
    """The root-cause rank's own words (its exception) and every rank that reported a failure. The
    others' "connection closed/reset by peer" (gloo under DeepSpeed, NCCL) is never evidence about
    it (mpirun_own_words); its own error is, when it exited with a code of its own: a fault, or a
    peer it lost itself."""
    cause = outcome.root_cause
    if not received or cause is None:
        return outcome
    own = next((report for report in received if report.rank == cause.rank), None)
    if own is not None and own.error and outcome.reason in (Reasons.FAILED, Reasons.RETRYABLE_EXIT):
        marked = [own.error] if evidence_regex(launcher.retryable_pattern).search(own.error) else []
        evidence = judge.gather(outcome.exit_code, marked)
        if evidence.fault or evidence.peer_loss:
            what = f"rank {cause.rank}" + (f" on {cause.node}" if cause.node else "")
            decided = judge.verdict(evidence, what=what, root_cause=cause, codes=launcher.retryable_exit_codes)
            outcome = decided.with_extra(**outcome.extra)
    extra: dict = {"failedRanks": [report.rank for report in received]}
    if own is not None and own.error:
        extra["error"] = own.error
    return outcome.with_extra(**extra)


def root_cause(plan: MpiPlan, child: Child, cause: RootCause, received: list[Report] | None = None) -> RootCause:
    """The failing rank and its host: from the first rank that reported its failure, else from
    mpirun's output; where only the rank is named, its pod follows from the default by-slot
    placement of our -np over the hostfile (the entry's first label, as the pod's hostname and the
    ranks' own reports say it).

    mpirun's word wins over the first report when it names a rank that sent none and that report
    is only a lost peer: that rank left without a word (os._exit, a C exit()) and the reporter is
    its echo."""
    said = _root_cause_from_output(child, cause)
    if received:
        first = received[0]
        silent = said.rank is not None and said.rank not in {report.rank for report in received}
        if not (silent and PEER_LOSS_PATTERN.search(first.error or "")):
            if first.signal:  # its watcher saw the signal that ended it (launcher/mpi/watch.py)
                cause = replace(cause, exit_code=None, signal=first.signal)
            return replace(
                cause,
                rank=first.rank,
                local_rank=first.local_rank,
                node=first.node,
                exit_code=first.exit_code if first.exit_code is not None else cause.exit_code,
            )
    cause = said
    if cause.rank is not None and cause.node is None and plan.ranks is not None:
        first_rank = 0
        for host in plan.hosts:
            if first_rank <= cause.rank < first_rank + host.slots:
                return replace(cause, node=host.name if _is_address(host.name) else host.name.split(".")[0])
            first_rank += host.slots
    return cause


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _root_cause_from_output(child: Child, cause: RootCause) -> RootCause:
    text = "\n".join(child.tail)
    for pattern in _SIGNALED:
        if match := pattern.search(text):
            said = match.groupdict()
            cause = replace(cause, node=None, exit_code=None, signal=signal_name(int(said["sig"])))
            if said.get("rank"):
                return replace(cause, rank=int(said["rank"]), node=said["node"].split(".")[0])
    for pattern in _ABORT_RANK:
        if match := pattern.search(text):
            cause = replace(cause, rank=int(match[1]), node=None)
            break
    for pattern in _FAILED_HOST:
        if match := pattern.search(text):
            cause = replace(cause, node=match[1])
            break
    return cause


def run_worker(launcher_overrides: dict[str, Override], mpi_overrides: dict[str, Override]) -> int:
    return lifecycle.live(MpiWorkerPod(mpi_overrides), launcher_overrides, in_place=k8s.in_place_restart)


class MpiWorkerPod(CommandPod):
    """The worker role: the private key's copies, then sshd on the port, supervised. sshd serves
    until the pod is stopped (the JobSet stops the workers once the launcher's Job has ended): a
    worker never learns how the job ended, and says so; sshd failing on its own is its failure.

    The launcher pod's restarts in place (LAUNCHER_MAX_RESTARTS) go by without it: mpirun's ssh
    sessions end, sshd serves on for the next start. With restarts left, sshd failing retryably on
    its own is started again in place (the same keys and port), as the launcher pod's next start
    waits for it."""

    name = "mpi-worker"
    restarts_in_place = True

    def __init__(self, mpi_overrides: dict[str, Override]):
        super().__init__([])
        self.mpi_overrides = mpi_overrides

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        mpi = settings.load(MpiSettings, self.mpi_overrides)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        ssh.install_keys(mpi.ssh_auth_mount_path, mpi.ssh_dir, _mount_source(self.mpi_overrides))
        config = os.path.join(mpi.ssh_dir, "sshd_config")
        environ = settings.environ()
        session_env = {k: environ[k] for k in ("PATH", "LD_LIBRARY_PATH") if environ.get(k)}
        ssh.write_private(
            config, ssh.sshd_config(mpi.ssh_dir, mpi.ssh_port, mpi.ssh_listen_address, os.geteuid() == 0, session_env)
        )
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation, root only
        self.command = [sshd, "-D", "-e", "-f", config]
        return lifecycle.Planned(
            None,
            node_name(),
            f"mpi worker: sshd on port {mpi.ssh_port} as uid {os.getuid()} with keys from {mpi.ssh_auth_mount_path}",
        )

    def judge(self, life: lifecycle.Life) -> Outcome:
        own = super().judge(life)
        if own.exit_code != 0:
            return own
        # Exit 0 as before: a stopped worker is no failure of the worker Job (whose podFailurePolicy
        # fails on any code outside 0 and the retryable set), and the launcher's Job alone decides
        # the JobSet (its successPolicy names only the launcher).
        holder = "the MPI job's outcome is the launcher pod's (its log and termination message)"
        return stopped("mpi worker: sshd", life.supervisor.received_signal, holder)
