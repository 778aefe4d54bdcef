#!/usr/bin/env python3
"""Benchmark ``trainer-launcher torch`` against bare torchrun, on one node with gloo ranks.

Run from the repository root:

    python3 bench/bench_torch.py [--repeat 5]

Four pairs, each measured with interleaved runs (launcher, baseline, launcher, baseline, ...):

1. startup          wall time of a whole 2-rank job (init_process_group + barrier + destroy)
2. plan cold start  ``python3 -m launcher plan -- train.py`` vs ``python3 -c pass``
                    (and ``python3 -c "import pydantic_settings"`` as a third figure)
3. failure latency  rank 1 exits 3 after init + barrier; from its recorded time.time() until
                    the command's process has exited
4. SIGTERM teardown ranks sleeping after init; SIGTERM to the command's process, until (a) the
                    command exits and (b) every rank pid is gone (missing or a zombie); again
                    with ranks that ignore SIGTERM (launcher --grace-period 5, torchrun default)

Both sides run with a clean environment (no PET_*, no LAUNCHER_*, OMP_NUM_THREADS=1). The
baseline is ``sys.executable -m torch.distributed.run`` with exactly the flags of the launcher's
own plan (``python3 -m launcher plan -- SCRIPT``, ``argv`` with "torchrun" replaced).
The helper ranks live in bench/programs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "bench", "programs")
PY = sys.executable
NPROC = "2"

RUN_TIMEOUT = 120.0  # a whole job that should take seconds: anything past this is a hang
READY_TIMEOUT = 60.0  # until the ranks have written their pid files
TERM_CAP = 40.0  # the longest we wait after SIGTERM (torchrun's own grace is 30 s)
POLL = 0.005  # polling step while watching for exits after SIGTERM


def say(text: str = "") -> None:
    print(text, flush=True)


def markdown_table(header: list[str], rows: list[list[str]], numeric: range, record_as: str | None = None,
                   title: str = "", plot: dict | list[dict] | None = None) -> None:
    """Print a Markdown table; the columns in `numeric` are right-aligned. With ``record_as``, the
    same table goes to bench/results/<record_as>.json (bench/results.py), which the docs render."""
    from results import markdown, record

    say(markdown(header, rows, numeric))
    if record_as:
        say(f"(recorded in {os.path.relpath(record(record_as, title, header, rows, numeric, plot=plot))})")


# --- environments and command lines ----------------------------------------------------------------

def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def launcher_env(workdir: str | None = None, **extra: str) -> dict[str, str]:
    env = clean_env()
    env["PET_NPROC_PER_NODE"] = NPROC
    if workdir is not None:
        env["LAUNCHER_TERMINATION_LOG"] = os.path.join(workdir, "termination.json")
    env.update(extra)
    return env


def baseline_env(plan_env: dict, **extra: str) -> dict[str, str]:
    env = clean_env()
    for name in plan_env.get("unset", []):
        env.pop(name, None)
    env.update(plan_env.get("set", {}))
    env.update(extra)
    return env


def launcher_argv(script: str, *options: str) -> list[str]:
    return [PY, "-m", "launcher", "torch", *options, "--", script]


def baseline_for(script: str) -> tuple[list[str], dict]:
    """torchrun's command line and environment, as the launcher's plan has them."""
    done = subprocess.run([PY, "-m", "launcher", "plan", "--", script], env=launcher_env(), cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`launcher plan` failed (exit {done.returncode}): {done.stderr.strip()}")
    plan = json.loads(done.stdout)
    argv = plan["argv"]
    if argv[0] != "torchrun":
        raise SystemExit(f"unexpected plan argv: {argv}")
    return [PY, "-m", "torch.distributed.run", *argv[1:]], plan["env"]


# --- processes ------------------------------------------------------------------------------------

def pid_gone(pid: int) -> bool:
    """Gone: no /proc/<pid>, or a zombie (PID 1 here does not reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_leftovers(proc: subprocess.Popen, known: list[int]) -> list[int]:
    """SIGKILL whatever a run left behind: the command if still up, its tree, named ranks.
    Returns the pids that were still alive (a sign the command under test leaked them)."""
    pids = set(known)
    if proc.poll() is None:
        pids |= set(descendants(proc.pid))
        proc.kill()
        proc.wait()
    alive = [p for p in pids if not pid_gone(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return sorted(alive)


def rank_pids(workdir: str) -> list[int]:
    pids = []
    for rank in range(int(NPROC)):
        try:
            with open(os.path.join(workdir, f"rank{rank}.pid")) as handle:
                pids.append(int(handle.read()))
        except (OSError, ValueError):
            pass
    return pids


def tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join("      | " + line for line in text.strip().splitlines()[-lines:])


def result_line(workdir: str) -> str:
    """The launcher's last `trainer-launcher:` line on stderr (its result)."""
    try:
        with open(os.path.join(workdir, "stderr")) as handle:
            lines = [line.strip() for line in handle if line.startswith("trainer-launcher:")]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def termination_reason(workdir: str) -> str:
    try:
        with open(os.path.join(workdir, "termination.json")) as handle:
            return json.load(handle).get("reason", "?")
    except (OSError, ValueError):
        return ""


@dataclass
class Run:
    value: float | None  # the measured seconds; None when the run did not produce one
    code: int | None  # the command's exit code (None: it never exited)
    note: str = ""  # anything abnormal, said plainly
    extra: dict = field(default_factory=dict)


def start(argv: list[str], env: dict, workdir: str) -> subprocess.Popen:
    return subprocess.Popen(
        argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=open(os.path.join(workdir, "stdout"), "wb"),
        stderr=open(os.path.join(workdir, "stderr"), "wb"),
        start_new_session=True,  # our own Ctrl-C never reaches it; SIGTERM goes to its pid only
    )


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    """Block in waitpid (proc.wait() with no timeout: Popen.wait(timeout) polls in steps of up
    to 50 ms, which would quantize short timings); a timer SIGKILLs a hung command. Returns
    the exit code, or None when the timer had to kill it."""
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.kill()
        except OSError:
            pass

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        code = proc.wait()
    finally:
        timer.cancel()
    return None if fired.is_set() else code


def run_wall(argv: list[str], env: dict, workdir: str, timeout: float = RUN_TIMEOUT) -> Run:
    """Wall time of a whole command."""
    t0 = time.perf_counter()
    proc = start(argv, env, workdir)
    code = wait_exit(proc, timeout)
    elapsed = time.perf_counter() - t0
    if code is None:
        left = kill_leftovers(proc, rank_pids(workdir))
        return Run(None, None, f"HUNG: still running after {timeout:.0f} s; killed it and its tree ({len(left)} more left)")
    left = kill_leftovers(proc, rank_pids(workdir))
    note = f"left {len(left)} live processes behind" if left else ""
    return Run(elapsed, code, note)


def run_failure(argv: list[str], env: dict, workdir: str) -> Run:
    """From rank 1's recorded time.time() (just before sys.exit(3)) until the command has exited."""
    proc = start(argv, env, workdir)
    # Side figure, for where the time goes: when rank 1's own process is gone (its interpreter's
    # shutdown after sys.exit is part of the latency). A thread polls /proc every POLL seconds.
    rank1_gone: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and len(pids := rank_pids(workdir)) < int(NPROC):
            time.sleep(POLL)
        while not stop.is_set():
            if pid_gone(pids[1]):
                rank1_gone.append(time.time())
                return
            time.sleep(POLL)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = wait_exit(proc, RUN_TIMEOUT)
    exited = time.time()
    stop.set()
    if code is None:
        left = kill_leftovers(proc, rank_pids(workdir))
        return Run(None, None, f"HUNG: still running {RUN_TIMEOUT:.0f} s after start; killed ({len(left)} left)")
    left = kill_leftovers(proc, rank_pids(workdir))
    note = f"left {len(left)} live ranks behind (pids {left})" if left else ""
    try:
        with open(os.path.join(workdir, "failed_at")) as handle:
            failed_at = float(handle.read())
    except (OSError, ValueError):
        return Run(None, code, (note + "; " if note else "") + "rank 1 never recorded its failure")
    watcher.join()
    extra = {"rank1": rank1_gone[0] - failed_at} if rank1_gone else {}
    return Run(exited - failed_at, code, note, extra)


def run_sigterm(argv: list[str], env: dict, workdir: str) -> Run:
    """SIGTERM to the command's pid once both ranks are up; seconds until it exits and until
    every rank pid is gone. value = command exit; extra['ranks'] = ranks gone."""
    proc = start(argv, env, workdir)
    ready_by = time.monotonic() + READY_TIMEOUT
    while len(pids := rank_pids(workdir)) < int(NPROC):
        if proc.poll() is not None:
            kill_leftovers(proc, pids)
            return Run(None, proc.returncode, f"exited ({proc.returncode}) before the ranks were up")
        if time.monotonic() > ready_by:
            left = kill_leftovers(proc, pids)
            return Run(None, None, f"ranks not up after {READY_TIMEOUT:.0f} s; killed ({len(left)} left)")
        time.sleep(0.01)
    # (a) a thread blocks in waitpid for the command; (b) this loop polls /proc every POLL s.
    exit_seen: list[float] = []
    waiter = threading.Thread(target=lambda: (proc.wait(), exit_seen.append(time.perf_counter())), daemon=True)
    t0 = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM)
    waiter.start()
    gone = None
    while not exit_seen or gone is None:
        now = time.perf_counter() - t0
        if gone is None and all(pid_gone(pid) for pid in pids):
            gone = now
        if now > TERM_CAP:
            break
        time.sleep(POLL)
    exited = exit_seen[0] - t0 if exit_seen else None
    if exited is None:
        tree = descendants(proc.pid)
        proc.kill()
        waiter.join()
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    waiter.join()
    notes = []
    if exited is None:
        notes.append(f"command still running at the {TERM_CAP:.0f} s cap")
    if gone is None:
        notes.append(f"ranks still alive at the {TERM_CAP:.0f} s cap")
    code = proc.returncode
    left = kill_leftovers(proc, pids)
    if left and exited is not None and gone is not None:
        notes.append(f"left {len(left)} live processes")
    return Run(exited, code, "; ".join(notes), {"ranks": gone, "capped": exited is None or gone is None})


# --- the pairs ------------------------------------------------------------------------------------

@dataclass
class Pair:
    key: str
    title: str
    launcher_label: str
    baseline_label: str
    goal: str
    launcher: list[Run] = field(default_factory=list)
    baseline: list[Run] = field(default_factory=list)
    third_label: str = ""
    third: list[Run] = field(default_factory=list)
    met: bool | None = None
    why: str = ""
    remarks: list[str] = field(default_factory=list)


def reaction(runs: list[Run]) -> list[float]:
    """Per run: from the failing rank's process being gone to the command's exit."""
    return [r.value - r.extra["rank1"] for r in runs if r.value is not None and r.extra.get("rank1") is not None]


def values(runs: list[Run], key: str | None = None, cap: float | None = None) -> list[float]:
    """Measured values; a run that hit the cap counts as the cap (a lower bound)."""
    out = []
    for run in runs:
        value = run.value if key is None else run.extra.get(key)
        if value is None and cap is not None and (run.extra.get("capped") or run.value is None):
            value = cap
        if value is not None:
            out.append(value)
    return out


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def codes(runs: list[Run]) -> str:
    seen = sorted({r.code for r in runs}, key=lambda c: (c is None, c))
    return ",".join("none" if c is None else str(c) for c in seen) or "n/a"


def show_run(side: str, i: int, run: Run, workdir: str, key_label: str = "s") -> None:
    extra = f", ranks gone {fmt(run.extra['ranks'])} s" if run.extra.get("ranks") is not None else ""
    if run.extra.get("rank1") is not None:
        extra = f" (rank 1's process gone after {fmt(run.extra['rank1'])} s)"
    line = f"    {side:<9} #{i}: {fmt(run.value)} {key_label}{extra}, exit {run.code}"
    if run.note:
        line += f"  !! {run.note}"
    say(line)
    if run.note or run.value is None:
        out = tail(os.path.join(workdir, "stderr"))
        if out:
            say("      stderr tail:\n" + out)


def scratch(root: str, name: str) -> str:
    path = tempfile.mkdtemp(prefix=name + "-", dir=root)
    return path


def bench_startup(pair: Pair, repeat: int, root: str) -> None:
    script = os.path.join(PROGRAMS, "startup.py")
    base_argv, plan_env = baseline_for(script)
    say(f"  launcher: PET_NPROC_PER_NODE={NPROC} {shlex.join(launcher_argv(script))}")
    say(f"  baseline: {shlex.join(base_argv)}")
    say("  warm-up: one unrecorded run of each side (page cache, .pyc)")
    for argv, env in ((launcher_argv(script), launcher_env()), (base_argv, baseline_env(plan_env))):
        warm = scratch(root, "warm")
        run = run_wall(argv, env, warm)
        if run.code != 0 or run.note:
            show_run("warm-up", 0, run, warm)
    for i in range(1, repeat + 1):
        work = scratch(root, "startup-l")
        run = run_wall(launcher_argv(script), launcher_env(work), work)
        pair.launcher.append(run)
        show_run("launcher", i, run, work)
        if i == 1:
            pair.remarks.append(f"launcher result line: {result_line(work)}")
        work = scratch(root, "startup-b")
        run = run_wall(base_argv, baseline_env(plan_env), work)
        pair.baseline.append(run)
        show_run("torchrun", i, run, work)
    lm, bm = median(values(pair.launcher)), median(values(pair.baseline))
    r = ratio(lm, bm)
    bad = [r for r in pair.launcher + pair.baseline if r.code != 0 or r.note]
    pair.met = r is not None and r <= 1.05 and not bad
    pair.why = f"ratio {fmt(r)}" + (f"; {len(bad)} abnormal runs" if bad else "")


def bench_plan(pair: Pair, repeat: int, root: str) -> None:
    sides = (
        ("plan", [PY, "-m", "launcher", "plan", "--", "train.py"], pair.launcher),
        ("-c pass", [PY, "-c", "pass"], pair.baseline),
        ("pydantic", [PY, "-c", "import pydantic_settings"], pair.third),
    )
    for label, argv, _ in sides:
        say(f"  {label:<9}: {shlex.join(argv)}")
    for argv in (s[1] for s in sides):  # warm-up
        run_wall(argv, launcher_env(), scratch(root, "warm"))
    for i in range(1, repeat + 1):
        for label, argv, runs in sides:
            work = scratch(root, "plan")
            run = run_wall(argv, launcher_env(), work, timeout=60)
            runs.append(run)
            show_run(label, i, run, work)
    lm, bm = median(values(pair.launcher)), median(values(pair.baseline))
    r = ratio(lm, bm)
    bad = [r for r in pair.launcher + pair.baseline + pair.third if r.code != 0 or r.note]
    pair.met = r is not None and r <= 3.0 and not bad
    pair.why = f"ratio {fmt(r, 2)}x" + (f"; {len(bad)} abnormal runs" if bad else "")


def bench_failure(pair: Pair, repeat: int, root: str) -> None:
    script = os.path.join(PROGRAMS, "fail.py")
    base_argv, plan_env = baseline_for(script)
    say(f"  launcher: PET_NPROC_PER_NODE={NPROC} {shlex.join(launcher_argv(script))}")
    say(f"  baseline: {shlex.join(base_argv)}")
    for i in range(1, repeat + 1):
        work = scratch(root, "fail-l")
        run = run_failure(launcher_argv(script), launcher_env(work, BENCH_DIR=work), work)
        pair.launcher.append(run)
        show_run("launcher", i, run, work)
        if i == 1:
            pair.remarks.append(f"launcher result line: {result_line(work)}")
            pair.remarks.append(f"launcher termination reason: {termination_reason(work)}")
        work = scratch(root, "fail-b")
        run = run_failure(base_argv, baseline_env(plan_env, BENCH_DIR=work), work)
        pair.baseline.append(run)
        show_run("torchrun", i, run, work)
    lm, bm = median(values(pair.launcher)), median(values(pair.baseline))
    # The launcher can only react once the rank's process is gone; its own interpreter shutdown
    # after sys.exit (~0.5 s with gloo initialised) is the same on both sides. Judge the 0.5 s goal
    # on the reaction, report both.
    la, ba = median(reaction(pair.launcher)), median(reaction(pair.baseline))
    pair.remarks.append(f"rank 1's process gone -> command exited: launcher median {fmt(la)} s, "
                        f"torchrun median {fmt(ba)} s, ratio {fmt(ratio(la, ba), 2)}")
    lcodes = {r.code for r in pair.launcher}
    bad = [r for r in pair.launcher + pair.baseline if r.note or r.value is None]
    pair.met = la is not None and lm is not None and bm is not None and la <= 0.5 and lm <= bm and not bad
    parts = [f"launcher reacts in {fmt(la)} s {'<=' if la is not None and la <= 0.5 else '>'} 0.5 s after the rank is gone",
             f"{'not slower' if lm is not None and bm is not None and lm <= bm else 'SLOWER'} than torchrun end to end"]
    if lcodes != {3}:
        parts.append(f"launcher exit codes {codes(pair.launcher)} (expected 3)")
    if bad:
        parts.append(f"{len(bad)} abnormal runs")
    pair.why = "; ".join(parts)


def bench_sigterm(pair: Pair, repeat: int, root: str, ignore: bool, baseline_repeat: int) -> None:
    script = os.path.join(PROGRAMS, "sleeper.py")
    base_argv, plan_env = baseline_for(script)
    options = ("--grace-period", "5") if ignore else ()
    extra = {"IGNORE_TERM": "1"} if ignore else {}
    shown_env = " IGNORE_TERM=1" if ignore else ""
    say(f"  launcher: PET_NPROC_PER_NODE={NPROC}{shown_env} {shlex.join(launcher_argv(script, *options))}")
    say(f"  baseline:{shown_env} {shlex.join(base_argv)}")
    if baseline_repeat < repeat:
        say(f"  torchrun runs: {baseline_repeat} (its default teardown grace is 30 s); cap {TERM_CAP:.0f} s per run")
    for i in range(1, repeat + 1):
        work = scratch(root, "term-l")
        run = run_sigterm(launcher_argv(script, *options), launcher_env(work, BENCH_DIR=work, **extra), work)
        pair.launcher.append(run)
        show_run("launcher", i, run, work, "s to exit")
        if i == 1:
            pair.remarks.append(f"launcher result line: {result_line(work)}")
        if i <= baseline_repeat:
            work = scratch(root, "term-b")
            run = run_sigterm(base_argv, baseline_env(plan_env, BENCH_DIR=work, **extra), work)
            pair.baseline.append(run)
            show_run("torchrun", i, run, work, "s to exit")
    bad = [r for r in pair.launcher if r.note or r.value is None]
    lcodes = {r.code for r in pair.launcher}
    pair.met = lcodes == {143} and not bad
    parts = [f"launcher exit codes {codes(pair.launcher)}"]
    if bad:
        parts.append(f"{len(bad)} abnormal launcher runs")
    capped = [r for r in pair.baseline if r.extra.get("capped")]
    if capped:
        parts.append(f"{len(capped)} torchrun runs hit the {TERM_CAP:.0f} s cap (counted as {TERM_CAP:.0f} s)")
    pair.why = "; ".join(parts)


# --- report ---------------------------------------------------------------------------------------

def summarize(pair: Pair) -> list[list[str]]:
    """Detail lines on stdout; rows for the Markdown table."""
    rows = []
    say(f"\n== {pair.title}")
    if pair.key.startswith("term"):
        for what, key in (("SIGTERM -> command exited", None), ("SIGTERM -> all ranks gone", "ranks")):
            lm = median(values(pair.launcher, key, TERM_CAP))
            bm = median(values(pair.baseline, key, TERM_CAP))
            say(f"  {what}: launcher median {fmt(lm)} s (n={len(pair.launcher)}), "
                f"torchrun median {fmt(bm)} s (n={len(pair.baseline)}), ratio {fmt(ratio(lm, bm), 2)}")
            rows.append([f"{pair.title}: {what.split('-> ')[1]}", fmt(lm), fmt(bm), fmt(ratio(lm, bm), 2),
                         f"{codes(pair.launcher)} / {codes(pair.baseline)}"])
    else:
        lm, bm = median(values(pair.launcher)), median(values(pair.baseline))
        say(f"  {pair.launcher_label}: median {fmt(lm)} s   samples {[round(v, 3) for v in values(pair.launcher)]}")
        say(f"  {pair.baseline_label}: median {fmt(bm)} s   samples {[round(v, 3) for v in values(pair.baseline)]}")
        if pair.third:
            tm = median(values(pair.third))
            say(f"  {pair.third_label}: median {fmt(tm)} s   samples {[round(v, 3) for v in values(pair.third)]}")
        say(f"  ratio launcher/baseline: {fmt(ratio(lm, bm), 3)}")
        rows.append([pair.title, fmt(lm), fmt(bm), fmt(ratio(lm, bm), 2), f"{codes(pair.launcher)} / {codes(pair.baseline)}"])
        if pair.third:
            rows.append([f"  ({pair.third_label})", fmt(median(values(pair.third))), "", "", codes(pair.third)])
    if pair.key.startswith("term"):
        say(f"  exit codes: launcher {[r.code for r in pair.launcher]}, torchrun {[r.code for r in pair.baseline]}")
    elif pair.key == "failure":
        say(f"  exit codes: launcher {[r.code for r in pair.launcher]}, torchrun {[r.code for r in pair.baseline]}")
        say(f"  of which rank 1's own exit (time.time() -> its pid gone): launcher side median "
            f"{fmt(median(values(pair.launcher, 'rank1')))} s, torchrun side median {fmt(median(values(pair.baseline, 'rank1')))} s")
    for remark in pair.remarks:
        say(f"  {remark}")
    say(f"  goal: {pair.goal} -> {'MET' if pair.met else 'NOT MET'} ({pair.why})")
    for row in rows:
        row += [pair.goal, "yes" if pair.met else "**no**"]
    for row in rows[1:]:
        row[-2] = row[-1] = ""  # goal shown once per pair
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (default 5)")
    parser.add_argument("--ignore-term-baseline-repeat", type=int, default=1,
                        help="torchrun runs for the ignore-SIGTERM variant (each takes ~30 s; default 1)")
    parser.add_argument("--only", default="", help="comma-separated subset: startup,plan,failure,term,term-ignore")
    args = parser.parse_args()
    if os.path.abspath(os.getcwd()) != REPO:
        os.chdir(REPO)
    command = shlex.join(["python3", os.path.relpath(os.path.abspath(sys.argv[0]), REPO), *sys.argv[1:]])
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "?"
    say(f"command: {command}")
    say(f"host: {platform.node()}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"Python {platform.python_version()} ({PY}), torch {torch_version}, {platform.platform()}")
    say(f"env for both sides: PET_*/LAUNCHER_* stripped, OMP_NUM_THREADS=1; launcher adds PET_NPROC_PER_NODE={NPROC}"
        f" and LAUNCHER_TERMINATION_LOG=<tmp>; repeat {args.repeat}, interleaved")

    load = os.getloadavg()
    say(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        + ("  !! the machine is busy: timings will be noisy" if load[0] > 0.5 else ""))

    pairs = [
        Pair("startup", f"1. startup, 1 node x {NPROC} gloo ranks (wall)", "launcher torch", "torchrun",
             "ratio <= 1.05"),
        Pair("plan", "2. plan cold start", "launcher plan", "python3 -c pass", "ratio <= 3x",
             third_label="python3 -c 'import pydantic_settings'"),
        Pair("failure", "3. failure latency (rank exits 3 -> command exited)", "launcher torch", "torchrun",
             "launcher reacts <= 0.5 s after the rank is gone, and <= torchrun"),
        Pair("term", "4a. SIGTERM teardown", "launcher torch", "torchrun", "launcher exit 143 (no time goal set)"),
        Pair("term-ignore", "4b. SIGTERM teardown, ranks ignore SIGTERM", "launcher --grace-period 5", "torchrun (default grace)",
             "launcher exit 143 (no time goal set)"),
    ]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    pairs = [p for p in pairs if not only or p.key in only]
    root = tempfile.mkdtemp(prefix="bench-torch-")
    started = time.perf_counter()
    try:
        for pair in pairs:
            say(f"\n-- {pair.title}")
            t = time.perf_counter()
            if pair.key == "startup":
                bench_startup(pair, args.repeat, root)
            elif pair.key == "plan":
                bench_plan(pair, args.repeat, root)
            elif pair.key == "failure":
                bench_failure(pair, args.repeat, root)
            elif pair.key == "term":
                bench_sigterm(pair, args.repeat, root, ignore=False, baseline_repeat=args.repeat)
            else:
                bench_sigterm(pair, args.repeat, root, ignore=True,
                              baseline_repeat=min(args.repeat, args.ignore_term_baseline_repeat))
            say(f"  ({time.perf_counter() - t:.0f} s; 1-min load incl. these runs {os.getloadavg()[0]:.2f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    say("\n" + "=" * 100)
    rows = []
    for pair in pairs:
        rows += summarize(pair)
    say("\n" + "=" * 100)
    say(f"\nMarkdown summary (medians in seconds; `{command}`, total {time.perf_counter() - started:.0f} s):\n")
    header = ["Measure", "Launcher", "Baseline", "Ratio", "Exit codes (L / B)", "Goal", "Met"]
    markdown_table(header, rows, numeric=range(1, 4), record_as="torch" if not only else None,
                   title="torch: start-up, failure and SIGTERM against torchrun")
    say(f"\nBaselines: 1, 3, 4 = `{PY} -m torch.distributed.run` with the plan's flags "
        f"(`--standalone --nnodes 1 --nproc-per-node {NPROC}`); 2 = `python3 -c pass`. "
        f"{os.cpu_count()} CPUs, OMP_NUM_THREADS=1 on both sides. "
        f"4b: torchrun runs {min(args.repeat, args.ignore_term_baseline_repeat)}x, capped at {TERM_CAP:.0f} s.")
    return 0 if all(p.met for p in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
