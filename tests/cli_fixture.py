"""``cli``: trainer-launcher's command line run inside the test's own process, as a shell would run
it but without starting a Python (a few hundred milliseconds each): for the tables of bad input,
where what is checked is the exit code and what the user reads on stdout and stderr.

The environment is the caller's without anything Trainer or the launcher would read, plus the
case's; the working directory the repository's. What only a real process shows (the termination
log on a signal, PID 1, a traceback that escapes ``main``) stays with the tests that start one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Read by the launcher or the frameworks' settings: none may leak in from the caller.
FOREIGN = ("PET_", "LAUNCHER_", "TORCHELASTIC_", "JAX_", "DMLC_", "OMPI_", "PRTE_", "PMIX_", "I_MPI_", "HYDRA_",
           "TRAINER_LAUNCHER_", "KUBEFLOW_TRAINER_", "EXPORT_")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture):
    from launcher import cli as launcher_cli
    from launcher.core import log

    def run(args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        with monkeypatch.context() as patch:
            for name in list(os.environ):
                if name.startswith(FOREIGN) or name == "JOB_COMPLETION_INDEX":
                    patch.delenv(name)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            patch.chdir(REPO)
            patch.setattr(log, "_format", "text")  # a case's LAUNCHER_LOG_FORMAT must not outlive it
            capfd.readouterr()
            try:
                code = launcher_cli.main(list(args))
            except SystemExit as leaving:  # argparse and the subcommands' usage errors
                code = leaving.code if isinstance(leaving.code, int) else 1
            out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["trainer-launcher", *args], code, out, err)

    return run
