"""A finished DDP job must not end 134 (issue 36). Training scripts shaped like pytorch/examples'
DDP tutorial series (tests/programs/ddp_no_destroy.py) never call destroy_process_group(): the
gloo group is still up when the interpreter exits, and a gloo worker thread still retiring the last
all-reduce then aborted the rank during finalization (torch issue 117762: "terminate called
without an active exception", SIGABRT) after every epoch was done. Seen in 1 of 4 runs at 2 x 2;
here in 1 of 46 before the fix. The launcher's torch ranks now end such a group at the last of
their exit handlers (launcher/torch/hook/_trainer_launcher_torch_end.py).

Real launchers, torchrun agents and gloo ranks: ``trainer-launcher local``, two "nodes" on this
machine. The rest of a program's ending stays the program's: its exit code, its exception, its own
exit handlers, and a real abort.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import REPO, clean_env, launcher

PROGRAM = str(REPO / "tests" / "programs" / "ddp_no_destroy.py")
RUNS = 20
CHAINS = 4  # the runs as chains that pytest-xdist can run side by side: CI's time, not fewer runs


def run_local(report_dir: Path, nnodes: int, nproc: int, **env: str) -> subprocess.CompletedProcess:
    report_dir.mkdir()
    argv = launcher("local", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--", PROGRAM)
    return subprocess.run(argv, env=clean_env(REPORT_DIR=str(report_dir), **env), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


def written(report_dir: Path, suffix: str) -> list[int]:
    return sorted(int(path.stem) for path in report_dir.glob(f"*.{suffix}"))


@pytest.mark.timeout(RUNS // CHAINS * 600)
@pytest.mark.parametrize("chain", range(CHAINS))
def test_a_ddp_script_that_never_destroys_its_group_succeeds_every_time(tmp_path, chain):
    """RUNS runs in all, each a real 2 x 2 job; every one must end 0."""
    for run in range(chain * RUNS // CHAINS + 1, (chain + 1) * RUNS // CHAINS + 1):
        report_dir = tmp_path / f"run{run}"
        result = run_local(report_dir, 2, 2)
        said = f"run {run} of {RUNS}:\n{result.stdout[-6000:]}"
        assert result.returncode == 0, said
        assert "terminate called" not in result.stdout, said
        assert written(report_dir, "end") == [0, 1, 2, 3], said  # every rank finished its epochs
        assert written(report_dir, "atexit") == [0, 1, 2, 3], said  # and ran its own exit handler
        assert (report_dir / "snapshot.pt").is_file(), said


@pytest.mark.parametrize("end, code, says", [
    ("exit-3", 3, "exited with code 3"),
    ("raise", 1, "RuntimeError: rank 1 failed after its last epoch"),
    ("abort", 134, "SIGABRT"),
])
def test_the_programs_own_ending_is_kept(tmp_path, end, code, says):
    """Rank 1 ends its own way after its last epoch, its group up: sys.exit(3) still exits 3, an
    uncaught exception 1, each after the rank's own exit handler ran; os.abort() is still a rank
    killed by SIGABRT (exit 134). (Rank 0 may be stopped by then: the job failed.)"""
    report_dir = tmp_path / "ranks"
    result = run_local(report_dir, 1, 2, END=end, EPOCHS="1")
    assert result.returncode == code, result.stdout
    assert says in result.stdout, result.stdout
    assert (1 in written(report_dir, "atexit")) == (end != "abort"), result.stdout
