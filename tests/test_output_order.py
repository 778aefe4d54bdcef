"""A program's output is complete, and comes before the launcher's final line, as `kubectl logs`
shows it (issue 36): a last line without a newline is ended by the launcher when the job ends.

The container runtime writes a pod's stdout and stderr into one log, a line at a time, each line
when its newline comes (or when the stream closes, as the container exits). So what a user sees
is the order in which the launcher wrote complete lines to either stream; here both streams go to
one file, which records that order, and the program's last line must be complete in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, clean_env, launcher

NO_NEWLINE = "import sys; sys.stdout.write('last words'); sys.exit(int(sys.argv[1]))"


def merged(tmp_path: Path, *args: str, **env: str) -> tuple[int, list[str]]:
    """Run the launcher with stdout and stderr in one file: its exit code and that file's lines."""
    log = tmp_path / "pod.log"
    with open(log, "wb") as both:
        code = subprocess.run(
            launcher(*args), env=clean_env(**env), stdout=both, stderr=both, cwd=REPO, timeout=180
        ).returncode
    return code, log.read_text(errors="replace").splitlines()


def test_exec_ends_the_last_line_before_saying_the_job_succeeded(tmp_path):
    code, lines = merged(tmp_path, "exec", "--", sys.executable, "-c", NO_NEWLINE, "0")
    assert code == 0
    assert lines == ["last words", "trainer-launcher: the job succeeded"]


def test_exec_ends_the_last_line_before_saying_the_job_failed(tmp_path):
    code, lines = merged(tmp_path, "exec", "--", sys.executable, "-c", NO_NEWLINE, "3")
    assert code == 3
    assert lines[0] == "last words"
    assert lines[1].startswith("trainer-launcher: error: ") and "exited with code 3" in lines[1]


def test_a_torch_pod_ends_its_rank_last_line_before_its_verdict(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("import sys\nsys.stdout.write('last words')\n")
    code, lines = merged(tmp_path, "torch", "--", str(program), PET_NPROC_PER_NODE="1")
    assert code == 0, lines
    assert lines[-2:] == ["last words", "trainer-launcher: the job succeeded"]


def test_a_rank_last_line_comes_before_the_node_and_the_job_verdicts_under_local(tmp_path):
    """Through torchrun (which tees the rank's output with a ``[rank-N]:`` tag) in a node pod, and
    the node's output through `local`, which prefixes it with the node."""
    program = tmp_path / "prog.py"
    program.write_text("import sys\nsys.stdout.write('last words')\n")
    code, lines = merged(tmp_path, "local", "--nnodes", "1", "--nproc-per-node", "1", "--", str(program))
    assert code == 0, lines
    rank_line = lines.index("[node-0 rank-0] last words")
    node_verdict = lines.index("[node-0] trainer-launcher: the job succeeded")
    assert rank_line < node_verdict
    assert lines[-1] == "trainer-launcher: the job succeeded"
