"""A program ends the same through the launcher's runners as under ``python`` itself: side by side.

Each row of the table is a small program, run once by plain ``python`` and once through a runner:
launcher/runner/program.py alone (its ``__main__``), the rank wrapper (``python -m
launcher.mpi.rank``, no MPI up), and ``trainer-launcher jax`` / ``trainer-launcher xgboost`` as
one process. The exit status must be python's, and what the program and python print the same:
for the thin runner and the rank wrapper byte for byte, but for runpy's frames, which python shows
under ``-m`` and the runners leave out; under the launchers, python's output must appear whole in
the job's (the launcher and the framework add lines of their own around it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, Job, clean_env, free_port, launcher

RUNNER = str(REPO / "launcher" / "runner" / "program.py")
TIMEOUT = 240  # a launcher importing a framework on two busy CPUs

# The programs, in one folder: the working directory of every run (``-m`` looks there).
TREE = {
    "exit_code.py": "import sys\nprint('before the exit')\nsys.exit(int(sys.argv[1]))\n",
    "exit_text.py": "import sys\nprint('before the exit')\nsys.exit('out of disk: /data is full')\n",
    "exit_none.py": "import sys\nprint('before the exit')\nsys.exit(None)\n",
    "raises.py": "def train(step):\n    raise ValueError(f'loss is nan at step {step}')\n\n\ntrain(3)\n",
    "interrupted.py": ("import atexit\natexit.register(print, 'exit handler ran', flush=True)\n"
                       "print('training', flush=True)\nraise KeyboardInterrupt\n"),
    "shows.py": ("import sys\n"
                 "def f(x: int): pass\n"
                 "main = sys.modules['__main__']\n"
                 "print(__name__, sys.argv, __file__, sys.path[0], type(main).__name__, main.__dict__ is globals(),\n"
                 "      f.__annotations__, type(__builtins__).__name__, __spec__, __package__)\n"),
    "siblings.py": "import plan, settings\nprint(plan.WHOSE, settings.WHOSE)\n",
    "plan.py": "WHOSE = \"the program's plan\"\n",
    "settings.py": "WHOSE = \"the program's settings\"\n",
    "bad_syntax.py": "def broken(:\n    pass\n",
    "pkg/__init__.py": "",
    "pkg/__main__.py": "import sys\nprint('package main', __name__, __package__, sys.argv, sys.path[0])\n",
    "pkg/mod.py": ("import sys\nprint('module', __name__, __spec__.name, sys.argv, sys.path[0])\n"
                   "raise SystemExit(int(sys.argv[1]))\n"),
    "pkg/fails.py": "def load():\n    raise ValueError('bad shard')\n\n\nload()\n",
}
CODE = ("import sys\n"
        "def f(x: int): pass\n"
        "main = sys.modules['__main__']\n"
        "print(__name__, sys.argv, type(main).__name__, main.__dict__ is globals(), repr(sys.path[0]),\n"
        "      f.__annotations__, type(__builtins__).__name__)\n")


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]  # what follows ``python``
    stdin: str = ""


ROWS = [
    Row("exit-0", ("exit_code.py", "0")),
    Row("exit-1", ("exit_code.py", "1")),
    Row("exit-7", ("exit_code.py", "7")),
    Row("exit-256", ("exit_code.py", "256")),  # python exits 0: 256 & 0xFF
    Row("exit-minus-1", ("exit_code.py", "-1")),
    Row("exit-beyond-a-c-long", ("exit_code.py", str(2 ** 70))),
    Row("exit-text", ("exit_text.py",)),
    Row("exit-none", ("exit_none.py",)),
    Row("raises", ("raises.py",)),
    Row("interrupted", ("interrupted.py",)),
    Row("script-as-given", ("shows.py", "a", "--lr", "3")),
    Row("script-by-a-longer-path", ("pkg/../shows.py", "b")),
    Row("siblings-named-plan-and-settings", ("siblings.py",)),
    Row("syntax-error", ("bad_syntax.py",)),
    Row("missing-script", ("no_such_program.py",)),
    Row("module-package", ("-m", "pkg", "x", "y")),
    Row("module", ("-m", "pkg.mod", "0", "z")),
    Row("module-exits-3", ("-m", "pkg.mod", "3")),
    Row("module-raises", ("-m", "pkg.fails")),
    Row("missing-module", ("-m", "no_such_module")),
    Row("module-joined", ("-mpkg.mod", "0")),
    Row("code", ("-c", CODE, "a", "b")),
    Row("code-exits-256", ("-c", "import sys; sys.exit(256)")),
    Row("code-raises", ("-c", "import json\njson.loads('{')")),
    Row("stdin", ("-", "a"), stdin=CODE),
]
# Rows a launcher does not put through its runner: python reads the program from stdin itself.
NOT_THROUGH_LAUNCHERS = {"stdin"}
# Where a framework's runner leaves on purpose without python's exit handlers.
XGBOOST_WITHOUT_EXIT_HANDLERS = {"interrupted"}  # a failed worker: the collective's would wait for peers

_RUNPY_FRAME = re.compile(r'  File "(?:<frozen runpy>|[^"\n]*/runpy\.py)", line \d+, in \w+\n(?:    .*\n)*')


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("programs")
    for name, text in TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def env(**extra: str) -> dict[str, str]:
    """This process's environment without what Trainer or the launcher would read, plus ``extra``."""
    base = {k: v for k, v in clean_env().items() if not k.startswith(("JAX_", "DMLC_", "TRAINER_LAUNCHER_"))}
    return {**base, **extra}


def run(argv: list[str], cwd: Path, row: Row, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env(**extra), input=row.stdin, capture_output=True, text=True,
                          timeout=TIMEOUT)


def without_runpy(stderr: str) -> str:
    """python shows runpy's frames under ``-m``; the runners leave them out."""
    return _RUNPY_FRAME.sub("", stderr)


def shell_status(returncode: int) -> int:
    """The status a shell shows: a process killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def oldest_python() -> str | None:
    """A Python 3.10 (the oldest the launcher supports) that runs, if this machine has one."""
    candidates = [shutil.which("python3.10"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python")))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"],
                          capture_output=True).returncode == 0:
            return candidate
    return None


INTERPRETERS = [pytest.param(sys.executable, id="this-python"),
                pytest.param("3.10", id="python-3.10")]


@pytest.fixture(params=INTERPRETERS)
def python(request) -> str:
    if request.param != "3.10":
        return request.param
    found = oldest_python()
    if found is None:
        pytest.skip("no Python 3.10 on this machine")
    return found


# --- the runner alone, and the rank wrapper: byte for byte ------------------------------------------

@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_runner_ends_a_program_as_python_does(programs, python, row):
    plain = run([python, *row.argv], programs, row)
    ran = run([python, RUNNER, *row.argv], programs, row)

    assert (ran.returncode, ran.stdout) == (plain.returncode, plain.stdout), ran.stderr
    assert without_runpy(ran.stderr) == without_runpy(plain.stderr)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_rank_wrapper_ends_a_program_as_python_does(programs, row):
    pytest.importorskip("mpi4py")
    plain = run([sys.executable, *row.argv], programs, row)
    ran = run([sys.executable, "-m", "launcher.mpi.rank", *row.argv], programs, row)

    assert (ran.returncode, ran.stdout) == (plain.returncode, plain.stdout), ran.stderr
    assert without_runpy(ran.stderr) == without_runpy(plain.stderr)


def test_a_kill_by_sigint_is_what_python_does_after_a_keyboard_interrupt(programs):
    """Python prints the traceback, runs the exit handlers, then dies of SIGINT: 130 in a shell."""
    plain = run([sys.executable, "interrupted.py"], programs, Row("", ()))
    ran = run([sys.executable, RUNNER, "interrupted.py"], programs, Row("", ()))

    assert plain.returncode == ran.returncode == -signal.SIGINT
    assert ran.stdout == "training\nexit handler ran\n"
    assert ran.stderr.startswith("Traceback") and ran.stderr.endswith("KeyboardInterrupt\n")


def test_bad_usage_is_one_line_and_exit_2(programs):
    for argv in ([], ["--"], ["-m"], ["-c"]):
        result = run([sys.executable, RUNNER, *argv], programs, Row("", ()))
        assert result.returncode == 2 and result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and "expected [--] SCRIPT" in result.stderr, result.stderr


# --- the launchers, one process each ---------------------------------------------------------------

LAUNCHER_ROWS = [row for row in ROWS if row.id not in NOT_THROUGH_LAUNCHERS]


def through_launcher(framework: str, row: Row, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    extra = {"LAUNCHER_TERMINATION_LOG": str(tmp_path / "termination.json")}
    if framework == "xgboost":
        extra.update(DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT=str(free_port()), DMLC_TASK_ID="0",
                     DMLC_NUM_WORKER="1")
    return run(launcher(framework, "--", sys.executable, *row.argv), cwd, row, **extra)


def assert_within(python_said: str, job_said: str) -> None:
    """python's lines appear, in order and unbroken, among the job's."""
    assert without_runpy(python_said) in without_runpy(job_said), f"python:\n{python_said}\njob:\n{job_said}"


@pytest.mark.parametrize("framework", ["jax", "xgboost"])
@pytest.mark.parametrize("row", LAUNCHER_ROWS, ids=[row.id for row in LAUNCHER_ROWS])
def test_a_launcher_ends_a_single_process_job_as_python_ends_the_program(programs, tmp_path, framework, row):
    pytest.importorskip(framework)
    plain = run([sys.executable, *row.argv], programs, row)
    job = through_launcher(framework, row, programs, tmp_path)

    assert job.returncode == shell_status(plain.returncode), job.stderr
    assert "/launcher/" not in job.stdout  # the runner never shows itself
    if framework == "xgboost" and row.id in XGBOOST_WITHOUT_EXIT_HANDLERS:
        assert_within(plain.stdout.replace("exit handler ran\n", ""), job.stdout)
    else:
        assert_within(plain.stdout, job.stdout)
    assert_within(plain.stderr, job.stderr)
    assert "launcher/runner/" not in job.stderr and 'run.py", line' not in job.stderr


# --- sys.exit(256) under xgboost: python's 0, not a job that never ends -----------------------------

def wait_or_stop(job: Job, timeout: float) -> int:
    """The job's exit code; a job still running after ``timeout`` is stopped and fails the test."""
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        job.signal(signal.SIGTERM)
        job.wait(60)
        pytest.fail(f"still running after {timeout} s (stopped with SIGTERM):\n{job.stderr}")


@pytest.mark.parametrize("shape", ["one-worker", "two-pods"])
def test_a_worker_exiting_256_succeeds_as_python_would_instead_of_hanging(programs, tmp_path, shape):
    """xgboost's runner exited 256 unmasked: the process ended 0 (os._exit(256)), without a word to
    the collective, and the tracker waited for it forever."""
    pytest.importorskip("xgboost")
    base = env(PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    program = ("python", str(programs / "exit_code.py"), "256")
    if shape == "one-worker":
        argv = launcher("xgboost", "--", *program)
        base.update(DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT=str(free_port()), DMLC_TASK_ID="0",
                    DMLC_NUM_WORKER="1")
    else:
        argv = launcher("local", "--framework", "xgboost", "--nnodes", "2", "--", *program)
    job = Job(argv, base, tmp_path)

    assert wait_or_stop(job, 60) == 0, job.stderr
    assert job.stdout.count("before the exit") == (1 if shape == "one-worker" else 2)
    assert json.loads(job.termination_log.read_text())["exitCode"] == 0
