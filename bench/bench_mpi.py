#!/usr/bin/env python3
"""Benchmark ``trainer-launcher mpi`` against bare mpirun/mpiexec, per MPI implementation, on one
node with 2 ranks (hostfile ``localhost slots=2``: no ssh).

Run from the repository root:

    python3 bench/bench_mpi.py [--repeat 5] [--only openmpi5,openmpi4,mpich,intel]

Per implementation, runs interleaved across implementations and sides (round 1: every
implementation's launcher, baseline, plan, --version; round 2: ...), median of --repeat:

1. hello     wall time of a 2-rank job that imports mpi4py, does one allreduce and exits:
             ``launcher mpi ... -- [--oversubscribe] hello.py`` (which runs ``python -m launcher.mpi.rank``,
             mpi4py's runner plus a failure report to the launcher)
             vs bare ``<mpirun> -n 2 [--oversubscribe] python3 hello.py``. Side figures, for where
             the launcher's overhead comes from: ``python3 -m launcher plan --framework mpi ...``
             alone (it runs ``<mpirun> --version`` to detect the MPI), and ``<mpirun> --version``.
2. failure   rank 1 exits 3 after MPI_Init + allreduce (recording time.time() just before
             sys.exit(3)); rank 0 sleeps 60 s. From the recorded failure until the command's
             process has exited. The launcher runs --repeat times; bare ``<mpirun> -n 2 python3
             fail.py`` (plain, as users run it today: it waits for rank 0's sleep) runs once per
             implementation, in round 1, capped at 75 s.

Both sides get the same environment: the caller's, minus LAUNCHER_*/OMPI_*/PRTE_*/PMIX_*/PMI_*/
HYDRA_*/I_MPI_*/MPI4PY_*, plus MPI4PY_LIBMPI for the implementation, HOME, OMP_NUM_THREADS=1,
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 for Open MPI as root, /opt/mpi/intel/bin first on PATH for
Intel MPI; the launcher side adds LAUNCHER_TERMINATION_LOG. Every process a run starts carries
BENCH_MPI_TAG=<run dir> in its environment, which is how leftovers are found (only ours).
The helper ranks live in bench/programs/mpi_*.py. Helpers shared with bench/bench_torch.py are
imported from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import (  # noqa: E402  (a script in the same folder)
    Run, codes, fmt, markdown_table, median, pid_gone, rank_pids, ratio, say, scratch, start, values, wait_exit,
)
from bench_torch import tail as _tail  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "bench", "programs")
HELLO = os.path.join(PROGRAMS, "mpi_hello.py")
FAIL = os.path.join(PROGRAMS, "mpi_fail.py")
PY = os.path.abspath(sys.executable)
NPROC = 2

RUN_TIMEOUT = 60.0  # a hello job or a plan that should take about a second: past this it hung
FAIL_CAP = 75.0  # a failure run: the bare baseline waits for rank 0's 60 s sleep
HELLO_GOAL = 1.10  # launcher / bare wall-time ratio
FAIL_GOAL = 2.0  # seconds from the recorded failure to the launcher's exit
LEFTOVER_GRACE = 2.0  # after a command exits, how long its tagged processes get to go
TAG = "BENCH_MPI_TAG"
STRIP = ("LAUNCHER_", "OMPI_", "PRTE_", "PMIX_", "PMI_", "HYDRA_", "I_MPI_", "MPI4PY_", "PET_")


@dataclass(frozen=True)
class Impl:
    key: str
    name: str  # --implementation
    mpirun: str
    libmpi: str
    bare_flags: tuple[str, ...]  # mpirun flags of the bare baseline, after -n 2
    launcher_flags: tuple[str, ...]  # MPIRUN FLAGS given to the launcher
    path_first: str = ""  # a directory to put first on PATH


IMPLS = (
    Impl("openmpi5", "openmpi", "/opt/mpi/openmpi5/bin/mpirun", "/opt/mpi/openmpi5/lib/libmpi.so.40",
         ("--oversubscribe",), ("--oversubscribe",)),
    # Debian's mpirun called by absolute path prepends /usr/bin to the ranks' PATH: --noprefix
    # (and the python by absolute path) for the bare baseline.
    Impl("openmpi4", "openmpi", "/usr/bin/mpirun", "/usr/lib/x86_64-linux-gnu/libmpi.so.40",
         ("--oversubscribe", "--noprefix"), ("--oversubscribe",)),
    Impl("mpich", "mpich", "/opt/mpi/mpich/bin/mpiexec", "/opt/mpi/mpich/lib/libmpi.so.12", (), ()),
    Impl("intel", "intel", "/opt/mpi/intel/bin/mpirun", "/opt/mpi/intel/lib/libmpi.so.12", (), (),
         path_first="/opt/mpi/intel/bin"),
)


# --- environments and command lines ----------------------------------------------------------------

def impl_env(impl: Impl, workdir: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP) and k != TAG}
    env["HOME"] = env.get("HOME") or os.path.expanduser("~") or "/root"
    env["OMP_NUM_THREADS"] = "1"
    env["MPI4PY_LIBMPI"] = impl.libmpi
    if impl.name == "openmpi" and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    if impl.path_first:
        env["PATH"] = impl.path_first + os.pathsep + env.get("PATH", "")
    env[TAG] = workdir
    env.update(extra)
    return env


def launcher_env(impl: Impl, workdir: str, **extra: str) -> dict[str, str]:
    return impl_env(impl, workdir, LAUNCHER_TERMINATION_LOG=os.path.join(workdir, "termination.json"), **extra)


@dataclass
class Setup:
    """Per implementation: the launcher's files (a fresh ed25519 key pair, hostfile, ssh dir)."""

    impl: Impl
    keys: str
    hostfile: str
    ssh_dir: str

    def options(self) -> list[str]:
        return ["--implementation", self.impl.name, "--mpirun", self.impl.mpirun, "--hostfile", self.hostfile,
                "--ssh-auth-mount-path", self.keys, "--ssh-dir", self.ssh_dir]

    def launcher(self, program: str) -> list[str]:
        return [PY, "-m", "launcher", "mpi", *self.options(), "--", *self.impl.launcher_flags, program]

    def plan(self, program: str) -> list[str]:
        return [PY, "-m", "launcher", "plan", "--framework", "mpi", *self.options(), "--",
                *self.impl.launcher_flags, program]

    def bare(self, program: str) -> list[str]:
        return [self.impl.mpirun, "-n", str(NPROC), *self.impl.bare_flags, PY, program]

    def version(self) -> list[str]:
        return [self.impl.mpirun, "--version"]


def make_setup(impl: Impl, root: str) -> Setup:
    base = scratch(root, f"setup-{impl.key}")
    keys = os.path.join(base, "keys")
    os.makedirs(keys)
    # A real key pair, never used (localhost runs without ssh): the launcher installs it, and
    # checks that it is one (a dummy file is refused, exit 2, ConfigError).
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(keys, "id_rsa")], check=True)
    shutil.copy(os.path.join(keys, "id_rsa.pub"), os.path.join(keys, "authorized_keys"))
    hostfile = os.path.join(base, "hostfile")
    with open(hostfile, "w") as handle:
        handle.write(f"localhost slots={NPROC}\n")
    ssh_dir = os.path.join(base, "ssh")
    os.makedirs(ssh_dir)
    return Setup(impl, keys, hostfile, ssh_dir)


def show_plan(setup: Setup, root: str) -> str | None:
    """Print the launcher's planned argv (names after -x summarised) and env; None when fine,
    else what went wrong."""
    work = scratch(root, "plan-show")
    done = subprocess.run(setup.plan(HELLO), env=impl_env(setup.impl, work), cwd=REPO,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    if done.returncode != 0:
        return f"`launcher plan` exit {done.returncode}: {done.stderr.strip()[-500:]}"
    plan = json.loads(done.stdout)
    argv, shown, names = plan["argv"], [], []
    i = 0
    while i < len(argv):
        if argv[i] == "-x" and i + 1 < len(argv):  # Open MPI: one -x per exported name
            run = []
            while i + 1 < len(argv) and argv[i] == "-x":
                run.append(argv[i + 1])
                i += 2
            names += run
            shown.append(f"-x <{len(run)} names>")
            continue
        if argv[i] == "-genvlist" and i + 1 < len(argv):  # hydra: one comma-separated list
            names += argv[i + 1].split(",")
            shown += ["-genvlist", f"<{len(argv[i + 1].split(','))} names>"]
            i += 2
            continue
        shown.append(argv[i])
        i += 1
    impl = plan["implementation"]
    say(f"  plan: {impl['name']} {impl['major']}, ranks {plan['ranks']}, argv: {shlex.join(shown)}")
    say(f"        exported names: {' '.join(names) or '(none)'}")
    say(f"        env set: {' '.join(f'{k}={v}' for k, v in plan['env']['set'].items()) or '(none)'}")
    return None


def tail(path: str, lines: int = 6) -> str:
    """bench_torch.tail, with NULs and other control characters made visible (Open MPI 5's
    prterun ends its abort banner with a NUL byte)."""
    return "".join(c if c in "\n\t" or c.isprintable() else f"\\x{ord(c):02x}" for c in _tail(path, lines))


def result_line(workdir: str) -> str:
    """The launcher's last `trainer-launcher:` line on stderr (its result). Unlike bench_torch's,
    it also finds one glued to the end of the MPI's last line (Open MPI 5 ends with a NUL and no
    newline), and says so."""
    try:
        with open(os.path.join(workdir, "stderr"), "rb") as handle:
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    hits = [line for line in lines if "trainer-launcher:" in line]
    if not hits:
        return ""
    before, _, after = hits[-1].partition("trainer-launcher:")
    glued = f"  [glued to the end of the MPI's last line {before[-40:]!r}: no newline before it]" if before else ""
    return "trainer-launcher:" + after.rstrip() + glued


def show_run(side: str, i: int, run: Run, workdir: str) -> None:
    """One line per run; the command's stderr tail when something was off."""
    seen = [f"rank {r}'s after {fmt(run.extra[f'rank{r}'])} s" for r in (1, 0) if run.extra.get(f"rank{r}") is not None]
    extra = f" (process gone: {', '.join(seen)})" if seen else ""
    line = f"    {side:<9} #{i}: {fmt(run.value)} s{extra}, exit {run.code}"
    say(line + (f"  !! {run.note}" if run.note else ""))
    if run.note or run.value is None:
        out = tail(os.path.join(workdir, "stderr"))
        if out:
            say("      stderr tail:\n" + out)


# --- processes ------------------------------------------------------------------------------------

def tagged(tag: str, prefix: bool = False) -> list[int]:
    """Live (non-zombie) processes whose environment carries BENCH_MPI_TAG=tag (with prefix:
    BENCH_MPI_TAG=tag...)."""
    needle = f"{TAG}={tag}".encode() + (b"" if prefix else b"\0")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if needle in environ + b"\0" and not pid_gone(int(entry)):
            found.append(int(entry))
    return found


def sweep(tag: str) -> tuple[list[int], float | None]:
    """After the command exited: wait up to LEFTOVER_GRACE for its tagged processes to go, then
    SIGKILL the rest. Returns (pids killed, seconds the stragglers took; None if none)."""
    t0 = time.perf_counter()
    while (alive := tagged(tag)) and time.perf_counter() - t0 < LEFTOVER_GRACE:
        time.sleep(0.02)
    for pid in alive:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    took = time.perf_counter() - t0
    return alive, (took if took > 0.03 else None)


def finish(proc: subprocess.Popen, code: int | None, workdir: str, timeout: float) -> str:
    """Leftover handling shared by both kinds of run; returns a note ('' when clean)."""
    notes = []
    if code is None:
        notes.append(f"HUNG: still running after {timeout:.0f} s; killed it and its tree")
    left, took = sweep(workdir)
    if left:
        notes.append(f"left {len(left)} live processes behind (pids {left}); killed them")
    elif took is not None and code is not None:
        notes.append(f"its processes took {took:.2f} s more to go")
    return "; ".join(notes)


def run_wall(argv: list[str], env: dict, workdir: str, timeout: float = RUN_TIMEOUT) -> Run:
    """Wall time of a whole command."""
    t0 = time.perf_counter()
    proc = start(argv, env, workdir)
    code = wait_exit(proc, timeout)
    elapsed = time.perf_counter() - t0
    note = finish(proc, code, workdir, timeout)
    return Run(elapsed if code is not None else None, code, note)


def run_failure(argv: list[str], env: dict, workdir: str, timeout: float = FAIL_CAP) -> Run:
    """From rank 1's recorded time.time() (just before sys.exit(3)) until the command has exited.
    value None + 'capped' when the command was still running at the cap."""
    proc = start(argv, env, workdir)
    gone: dict[int, float] = {}  # rank -> time.time() its process was seen gone
    stop = threading.Event()

    def watch() -> None:  # side figures: when each rank's own process is gone (polls /proc)
        while not stop.is_set() and len(pids := rank_pids(workdir)) < NPROC:
            time.sleep(0.005)
        while not stop.is_set() and len(gone) < NPROC:
            for rank, pid in enumerate(pids):
                if rank not in gone and pid_gone(pid):
                    gone[rank] = time.time()
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = wait_exit(proc, timeout)
    exited = time.time()
    stop.set()
    watcher.join()
    note = finish(proc, code, workdir, timeout)
    try:
        with open(os.path.join(workdir, "failed_at")) as handle:
            failed_at = float(handle.read())
    except (OSError, ValueError):
        return Run(None, code, (note + "; " if note else "") + "rank 1 never recorded its failure", {"capped": code is None})
    extra = {f"rank{r}": t - failed_at for r, t in gone.items()}
    extra["capped"] = code is None
    return Run(exited - failed_at if code is not None else None, code, note, extra)


def termination(workdir: str) -> dict:
    try:
        with open(os.path.join(workdir, "termination.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        return {"reason": f"(no termination log: {error.__class__.__name__})"}


# --- measures -------------------------------------------------------------------------------------

@dataclass
class Measure:
    impl: Impl
    key: str  # hello | failure
    launcher: list[Run] = field(default_factory=list)
    baseline: list[Run] = field(default_factory=list)
    plan: list[Run] = field(default_factory=list)  # hello only
    version: list[Run] = field(default_factory=list)  # hello only
    met: bool | None = None
    why: str = ""
    remarks: list[str] = field(default_factory=list)
    extra_roots: list = field(default_factory=list)  # failure: rootCause.rank per launcher run


def judge_hello(m: Measure) -> None:
    lm, bm = median(values(m.launcher)), median(values(m.baseline))
    r = ratio(lm, bm)
    bad = [x for x in m.launcher + m.baseline + m.plan + m.version if x.code != 0 or x.value is None or "left" in x.note]
    m.met = r is not None and r <= HELLO_GOAL and not bad
    m.why = f"ratio {fmt(r)}" + (f"; {len(bad)} abnormal runs (nonzero exit, hang or leftovers)" if bad else "")


def judge_failure(m: Measure) -> None:
    lm = median(values(m.launcher))
    lcodes = {x.code for x in m.launcher}
    bad = [x for x in m.launcher if x.value is None or "left" in x.note or "HUNG" in x.note]
    m.met = lm is not None and lm <= FAIL_GOAL and lcodes == {3} and not bad and len(values(m.launcher)) == len(m.launcher)
    parts = [f"launcher median {fmt(lm)} s {'<=' if lm is not None and lm <= FAIL_GOAL else '>'} {FAIL_GOAL:.0f} s"]
    if lcodes != {3}:
        parts.append(f"launcher exit codes {codes(m.launcher)} (expected 3, the failing rank's)")
    if bad:
        parts.append(f"{len(bad)} abnormal launcher runs")
    m.why = "; ".join(parts)


def describe_outcome(work: str) -> str:
    t = termination(work)
    return (f"termination log: reason {t.get('reason')}, exitCode {t.get('exitCode')}, "
            f"message {t.get('message')!r}, rootCause {json.dumps(t.get('rootCause'))}")


# --- report ---------------------------------------------------------------------------------------

def samples(runs: list[Run]) -> list[float]:
    return [round(v, 3) for v in values(runs)]


def summarize(hello: Measure | None, failure: Measure | None) -> list[list[str]]:
    rows = []
    impl = (hello or failure).impl
    say(f"\n== {impl.key} ({impl.mpirun})")
    if hello is not None:
        lm, bm = median(values(hello.launcher)), median(values(hello.baseline))
        pm, vm = median(values(hello.plan)), median(values(hello.version))
        say("  1. hello, wall")
        say(f"     launcher mpi     median {fmt(lm)} s   samples {samples(hello.launcher)}")
        say(f"     bare {os.path.basename(impl.mpirun):<11} median {fmt(bm)} s   samples {samples(hello.baseline)}")
        say(f"     launcher plan    median {fmt(pm)} s   samples {samples(hello.plan)}")
        say(f"     {os.path.basename(impl.mpirun) + ' --version':<16} median {fmt(vm)} s   samples {samples(hello.version)}")
        extra = lm - bm if lm is not None and bm is not None else None
        say(f"     launcher - bare = {fmt(extra)} s; plan alone (python + imports + settings + `--version`) "
            f"= {fmt(pm)} s, of which `--version` {fmt(vm)} s")
        say(f"     exit codes: launcher {[x.code for x in hello.launcher]}, bare {[x.code for x in hello.baseline]}, "
            f"plan {[x.code for x in hello.plan]}, --version {[x.code for x in hello.version]}")
        for remark in hello.remarks:
            say(f"     {remark}")
        say(f"     goal: ratio <= {HELLO_GOAL:.2f} -> {'MET' if hello.met else 'NOT MET'} ({hello.why})")
        rows.append([impl.key, "hello, 2 ranks (wall)", fmt(lm), fmt(bm), fmt(ratio(lm, bm)),
                     f"{codes(hello.launcher)} / {codes(hello.baseline)}", f"ratio <= {HELLO_GOAL:.2f}",
                     "yes" if hello.met else "**no**"])
        rows.append([impl.key, "  (`launcher plan` alone)", fmt(pm), "", "", codes(hello.plan), "", ""])
        rows.append([impl.key, f"  (`{os.path.basename(impl.mpirun)} --version` alone)", "", fmt(vm), "",
                     codes(hello.version), "", ""])
    if failure is not None:
        lm = median(values(failure.launcher))
        base = failure.baseline[0] if failure.baseline else None
        bm = base.value if base and base.value is not None else (FAIL_CAP if base and base.extra.get("capped") else None)
        bshown = "n/a" if base is None else (f">= {FAIL_CAP:.0f} (cap)" if base.extra.get("capped") else fmt(bm))
        say("  2. failure: recorded failure (rank 1, exit 3) -> command exited")
        say(f"     launcher mpi     median {fmt(lm)} s   samples {samples(failure.launcher)}")
        say(f"     bare (1 run)     {bshown} s")
        for r, what in ((1, "rank 1's own exit (its time.time() -> its pid gone)"),
                        (0, "rank 0 torn down (rank 1's time.time() -> rank 0's pid gone)")):
            xs = [x.extra[f"rank{r}"] for x in failure.launcher if x.extra.get(f"rank{r}") is not None]
            say(f"     {what}, launcher side: median {fmt(median(xs))} s, samples {[round(x, 3) for x in xs]}")
        say(f"     rootCause.rank in the termination log, per launcher run: {failure.extra_roots}")
        say(f"     exit codes: launcher {[x.code for x in failure.launcher]}, bare {[x.code for x in failure.baseline]}")
        for remark in failure.remarks:
            say(f"     {remark}")
        say(f"     goal: launcher <= {FAIL_GOAL:.0f} s (exit 3) -> {'MET' if failure.met else 'NOT MET'} ({failure.why})")
        rows.append([impl.key, "failure -> exit", fmt(lm), bshown, fmt(ratio(lm, bm), 3),
                     f"{codes(failure.launcher)} / {codes(failure.baseline)}", f"launcher <= {FAIL_GOAL:.0f} s, exit 3",
                     "yes" if failure.met else "**no**"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (default 5; the bare failure runs once)")
    parser.add_argument("--only", default="", help="comma-separated implementations: " + ",".join(i.key for i in IMPLS))
    parser.add_argument("--measures", default="hello,failure", help="comma-separated subset: hello,failure")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    os.chdir(REPO)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [k for k in only if k not in {i.key for i in IMPLS}]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {[i.key for i in IMPLS]}")
    measures = {s.strip() for s in args.measures.split(",") if s.strip()}
    if not measures <= {"hello", "failure"}:
        parser.error("--measures: hello and/or failure")
    command = shlex.join(["python3", os.path.relpath(os.path.abspath(sys.argv[0]), REPO), *sys.argv[1:]])
    try:
        mpi4py_version = metadata.version("mpi4py")
    except metadata.PackageNotFoundError:
        mpi4py_version = "NOT INSTALLED"
    say(f"command: {command}")
    say(f"host: {platform.node()}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"Python {platform.python_version()} ({PY}), mpi4py {mpi4py_version}, {platform.platform()}, uid {os.geteuid()}")
    say(f"env for both sides: caller's minus {'/'.join(p + '*' for p in STRIP)}; plus MPI4PY_LIBMPI, HOME, "
        f"OMP_NUM_THREADS=1, OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 (Open MPI), {TAG}; launcher adds "
        f"LAUNCHER_TERMINATION_LOG. repeat {args.repeat}, interleaved across implementations and sides")
    load = os.getloadavg()
    say(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        + ("  !! the machine is busy: timings will be noisy" if load[0] > 0.5 else ""))

    root = tempfile.mkdtemp(prefix="bench-mpi-")
    started = time.perf_counter()
    chosen = [i for i in IMPLS if not only or i.key in only]
    setups: list[Setup] = []
    missing: list[tuple[Impl, str]] = []
    hello: dict[str, Measure] = {}
    failure: dict[str, Measure] = {}
    try:
        say("\n-- setup: each implementation's plan (python3 -m launcher plan --framework mpi ...)")
        for impl in chosen:
            absent = [p for p in (impl.mpirun, impl.libmpi) if not os.path.exists(p)]
            say(f"  {impl.key}:")
            if absent:
                missing.append((impl, f"not installed ({', '.join(absent)} missing)"))
                say(f"  !! skipped: {', '.join(absent)} missing")
                continue
            setup = make_setup(impl, root)
            problem = show_plan(setup, root)
            if problem:
                say(f"  !! {problem}")
            setups.append(setup)
            hello[impl.key] = Measure(impl, "hello")
            failure[impl.key] = Measure(impl, "failure")
            say(f"  launcher: {shlex.join(setup.launcher(HELLO))}")
            say(f"  bare:     {shlex.join(setup.bare(HELLO))}")

        if "hello" in measures:
            t = time.perf_counter()
            say("\n-- 1. hello, 2 ranks: launcher, bare, plan, --version per implementation, round by round")
            say("  warm-up: one unrecorded run of launcher and bare per implementation (page cache, .pyc)")
            for setup in setups:
                for label, argv, env_of in (("launcher", setup.launcher(HELLO), launcher_env),
                                            ("bare", setup.bare(HELLO), impl_env)):
                    work = scratch(root, "warm")
                    run = run_wall(argv, env_of(setup.impl, work), work)
                    if run.code != 0 or run.note:
                        show_run(f"{setup.impl.key} {label} warm-up", 0, run, work)
            for i in range(1, args.repeat + 1):
                for setup in setups:
                    m = hello[setup.impl.key]
                    for label, argv, env_of, runs in (
                        ("launcher", setup.launcher(HELLO), launcher_env, m.launcher),
                        ("bare", setup.bare(HELLO), impl_env, m.baseline),
                        ("plan", setup.plan(HELLO), impl_env, m.plan),
                        ("--version", setup.version(), impl_env, m.version),
                    ):
                        work = scratch(root, f"hello-{setup.impl.key}")
                        run = run_wall(argv, env_of(setup.impl, work), work)
                        runs.append(run)
                        show_run(f"{setup.impl.key:<8} {label}", i, run, work)
                        if label == "launcher" and i == 1:
                            m.remarks.append(f"launcher result line: {result_line(work)}")
            for m in hello.values():
                judge_hello(m)
            say(f"  ({time.perf_counter() - t:.0f} s; 1-min load incl. these runs {os.getloadavg()[0]:.2f})")

        if "failure" in measures:
            t = time.perf_counter()
            say(f"\n-- 2. failure: launcher x{args.repeat} per implementation, round by round; bare x1 "
                f"(in round 1, capped at {FAIL_CAP:.0f} s)")
            for setup in setups:
                say(f"  {setup.impl.key}: launcher {shlex.join(setup.launcher(FAIL))}")
                say(f"  {setup.impl.key}: bare     {shlex.join(setup.bare(FAIL))}")
            for i in range(1, args.repeat + 1):
                for setup in setups:
                    m = failure[setup.impl.key]
                    work = scratch(root, f"fail-{setup.impl.key}-l")
                    run = run_failure(setup.launcher(FAIL), launcher_env(setup.impl, work, BENCH_DIR=work), work)
                    m.launcher.append(run)
                    show_run(f"{setup.impl.key:<8} launcher", i, run, work)
                    m.extra_roots.append((termination(work).get("rootCause") or {}).get("rank"))
                    if run.code != 3 or run.note or run.value is None:
                        m.remarks.append(f"launcher run {i}: exit {run.code}; {describe_outcome(work)}")
                    if i == 1:
                        m.remarks.append(f"launcher result line: {result_line(work)}")
                        m.remarks.append(f"launcher {describe_outcome(work)}")
                        say(f"      mpirun's output, last lines:\n{tail(os.path.join(work, 'stderr'), 4)}")
                    if i == 1:
                        work = scratch(root, f"fail-{setup.impl.key}-b")
                        run = run_failure(setup.bare(FAIL), impl_env(setup.impl, work, BENCH_DIR=work), work)
                        m.baseline.append(run)
                        show_run(f"{setup.impl.key:<8} bare", i, run, work)
                        if run.extra.get("capped"):
                            say(f"      (bare run still up at the {FAIL_CAP:.0f} s cap: counted as >= {FAIL_CAP:.0f} s)")
            for m in failure.values():
                judge_failure(m)
            say(f"  ({time.perf_counter() - t:.0f} s; 1-min load incl. these runs {os.getloadavg()[0]:.2f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        # Every run swept its own processes; a last check over the whole invocation (any tag
        # under our root; zombies count as gone), killing what it finds.
        leaked = tagged(root, prefix=True)
        for pid in leaked:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    say("\n" + "=" * 100)
    rows: list[list[str]] = []
    for setup in setups:
        rows += summarize(hello.get(setup.impl.key) if "hello" in measures else None,
                          failure.get(setup.impl.key) if "failure" in measures else None)
    for impl, why in missing:
        say(f"\n== {impl.key}: {why} -> NOT MEASURED (counts as not met)")
        rows.append([impl.key, "(all)", "", "", "", "", "", f"**no** ({why})"])
    say("\nprocesses of this benchmark still alive at the end (zombies count as gone): "
        + (f"{leaked} (killed now)" if leaked else "none"))
    say("\n" + "=" * 100)
    say(f"\nMarkdown summary (medians in seconds; `{command}`, total {time.perf_counter() - started:.0f} s):\n")
    header = ["Implementation", "Measure", "Launcher", "Baseline", "Ratio", "Exit codes (L / B)", "Goal", "Met"]
    markdown_table(header, rows, numeric=range(2, 5), record_as="mpi",
                   title="MPI: a 2-rank hello and a failing rank, against bare mpirun, per implementation")
    say(f"\nLauncher: `{PY} -m launcher mpi --implementation IMPL --mpirun MPIRUN --hostfile <localhost slots={NPROC}> "
        f"--ssh-auth-mount-path <a fresh ed25519 key pair> --ssh-dir <tmp> -- [--oversubscribe] PROGRAM` (runs `{PY} -m launcher.mpi.rank PROGRAM`). "
        f"Baseline: `MPIRUN -n {NPROC} [--oversubscribe] [--noprefix] {PY} PROGRAM` (--noprefix: Debian's Open MPI 4 only). "
        f"Plan: `{PY} -m launcher plan --framework mpi <same options> -- PROGRAM`. "
        f"Failure baseline: 1 run per implementation, capped at {FAIL_CAP:.0f} s; rank 0 sleeps 60 s. "
        f"{os.cpu_count()} CPUs, same environment on both sides.")
    results = [m.met for m in hello.values()] if "hello" in measures else []
    results += [m.met for m in failure.values()] if "failure" in measures else []
    return 0 if results and all(results) and not missing and not leaked else 1



if __name__ == "__main__":
    sys.exit(main())
