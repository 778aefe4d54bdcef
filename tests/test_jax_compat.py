"""launcher/jax/compat.py (jax's internals, behind feature checks), and what the launcher makes of
a JAX process's report.

The hooks run for real on every jax of the matrix (tests/test_matrix_jax.py: 0.5.3, 0.7.2, 0.10.2).
Here: what each does where its hook is missing (said once, the job still runs), and a refused
version and a failing process as the launcher names them. The runner's version gate itself
(launcher/core/versions.py, checked before ``import jax``) is tested with XGBoost's, in
tests/test_runner_versions.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, free_port

from launcher.core import versions
from launcher.jax import run as runner
from launcher.runner import report as records

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "launcher" / "jax" / "run.py"
compat = runner.compat

pytestmark = pytest.mark.usefixtures("notes_said_afresh")


def jax_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("JAX_")}
    env.update(extra)
    return env


# --- what the launcher makes of the runner's report ------------------------------------------------

def test_the_launcher_names_a_refused_version_as_a_config_error():
    from launcher.core.supervisor import Child
    from launcher.jax.job import jax_outcome
    from launcher.jax.plan import JaxFacts, plan_jax
    from launcher.jax.settings import load_jax

    plan = plan_jax(load_jax({}), JaxFacts("tj-node-0-1", 0, str(RUNNER), 60.0), ("python", "t.py"), {})
    child = Child(name="jax", pid=0, popen=None, returncode=2)
    supervisor = type("Supervisor", (), {"received_signal": None, "first_failure": child})()
    said = versions.refusal("jax", "0.4.38")
    report = records.Report(ending="refused", exit_code=2, reason="UnsupportedVersion", rank=0, error=said)
    outcome = jax_outcome(plan, supervisor, child, report, frozenset())
    assert (outcome.exit_code, outcome.reason) == (2, "UnsupportedVersion")
    assert outcome.message == f"JAX process 0 on tj-node-0-1: {said}"


def test_the_failing_process_keeps_its_code_when_jax_ends_it_after_its_report(monkeypatch):
    """The failing process wrote its report (failed, exit code 3); process 0 then left the store
    and, before this process's own exit, JAX's error polling ended it with code 1 (``client.h:75
    Terminating process``). Seen in CI (jax 0.7.2, two CPU-loaded workers): the pod said exit 1,
    its peer exit 3. The race cannot be forced from outside, so this feeds the launcher its shape."""
    from launcher.core.supervisor import Child
    from launcher.jax.job import jax_outcome
    from launcher.jax.plan import JaxFacts, plan_jax
    from launcher.jax.settings import load_jax

    for name, value in {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "tj-node-0-0:6666"}.items():
        monkeypatch.setenv(name, value)
    plan = plan_jax(load_jax(), JaxFacts("tj-node-0-1", 0, str(RUNNER), 60.0), ("python", "t.py"), {})
    child = Child(name="jax", pid=0, popen=None, returncode=1)
    supervisor = type("Supervisor", (), {"received_signal": None, "first_failure": child})()
    report = records.Report(ending="failed", exit_code=3, rank=1, node="tj-node-0-1")
    outcome = jax_outcome(plan, supervisor, child, report, frozenset())
    assert (outcome.exit_code, outcome.reason) == (3, "Failed")
    assert outcome.message.startswith("JAX process 1 on tj-node-0-1 exited with code 3")


# --- hooks missing: that feature is off, said once, the rest works -----------------------------------

class OldClient:
    """A coordination client with no barrier and no try-get."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        return self.values[key]

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def test_a_client_missing_a_method_turns_stop_records_off_once(monkeypatch, capsys):
    from jax._src import distributed

    monkeypatch.setattr(distributed.global_state, "client", OldClient())
    assert compat.coordination_store() is None and compat.coordination_store() is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"trainer-launcher: jax {compat.versions.running('jax')}: stop records (every pod naming the process "
                    "that failed first) is off: jax's coordination client has no wait_at_barrier; each process "
                    "exits with its own code and names itself")


def test_without_try_get_the_store_falls_back_to_a_short_blocking_get(monkeypatch, capsys):
    from jax._src import distributed

    class Client(OldClient):
        def wait_at_barrier(self, name, timeout_in_ms):
            pass

    monkeypatch.setattr(distributed.global_state, "client", Client())
    store = compat.coordination_store()
    assert store.try_get("k") is None
    store.set("k", "v", overwrite=False)
    assert store.try_get("k") == "v" and store.get("k", 10) == "v" and store.dir_get("k") == [("k", "v")]
    assert capsys.readouterr().err == ""


def test_a_jax_without_internals_says_so_once(monkeypatch, capsys):
    from jax._src import distributed

    monkeypatch.delattr(distributed, "global_state")
    assert compat.coordination_store() is None
    compat.coordination_store()
    (line,) = capsys.readouterr().err.splitlines()
    assert "stop records (every pod naming the process that failed first) is off: " \
           "jax._src.distributed.global_state.client is not there" in line


def test_an_unknown_cpu_collectives_option_is_said_once(capsys):
    class Config:
        def update(self, name, value):
            raise AttributeError(f"Unrecognized config option: {name}")

    jax = type("jax", (), {"config": Config()})()
    compat.cpu_collectives(jax, "gloo")
    compat.cpu_collectives(jax, "gloo")
    (line,) = capsys.readouterr().err.splitlines()
    assert "JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo is off: this jax has no jax_cpu_collectives_implementation" in line


def test_the_installed_jax_has_every_hook(tmp_path):
    """A real one-process jax.distributed job: the store the stop records use, through compat only."""
    code = ("import importlib.util, jax, sys\n"
            f"spec = importlib.util.spec_from_file_location('c', {str(RUNNER.parent / 'compat.py')!r})\n"
            "compat = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(compat)\n"
            "compat.cpu_collectives(jax, 'gloo')\n"
            f"jax.distributed.initialize('127.0.0.1:{free_port()}', 1, 0)\n"
            "store = compat.coordination_store()\n"
            "store.set('k', 'v', overwrite=False)\n"
            "try:\n    store.set('k', 'w', overwrite=False)\nexcept Exception:\n    print('first writer wins')\n"
            "store.barrier('b', 10000)\n"
            "store.set('acks/0', '1', overwrite=True)\n"
            "store.set('acks/0', '1', overwrite=True)\n"
            "print(store.try_get('k'), store.try_get('missing'), store.get('k', 1000), store.dir_get('acks/'))\n"
            "print(jax.config.jax_cpu_collectives_implementation)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=jax_env(), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["first writer wins", "v None v [('acks/0', '1')]", "gloo"]
    assert " is off: " not in result.stderr
