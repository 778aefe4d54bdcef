"""Every settings contract, fuzzed: whatever the controller, a runtime or a user puts in the
environment, ``trainer-launcher plan`` answers with a plan or with one line naming a variable,
exit 2; never a traceback, never the launcher's own crash (70), never a secret.

In-process through ``launcher.cli.main`` (a subprocess per case would run a handful of cases a
second); the bad-input tables (tests/test_bad_input.py and the frameworks') hold the subprocess
cases a user meets first.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
from hypothesis import example, given, strategies as st

from fuzz import ENV_VALUES
from launcher import cli
from launcher.core import settings as core_settings
from launcher.core.outcome import ConfigError
from launcher.core.report import deliver
from launcher.initializers.settings import InitSettings
from launcher.jax.settings import JaxSettings
from launcher.mpi.settings import MpiSettings
from launcher.status.settings import StatusEnv
from launcher.torch.settings import TorchSettings
from launcher.xgboost.settings import XGBoostSettings

pytestmark = pytest.mark.fuzz

SECRET = "hf_fuzzS3cretValue0042"
# Variables the launcher knows hold secrets; each is set to SECRET in every case.
SECRETS = {"HF_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}


def env_names(*models: type[core_settings.Settings]) -> list[str]:
    return sorted({name for model in models for info in model.model_fields.values()
                   for name in (info.json_schema_extra or {}).get("env", ())})


CONTRACTS = {
    "torch": env_names(TorchSettings, core_settings.LauncherSettings, StatusEnv),
    "mpi": env_names(MpiSettings, core_settings.LauncherSettings),
    "jax": env_names(JaxSettings, core_settings.LauncherSettings, StatusEnv),
    "xgboost": env_names(XGBoostSettings, core_settings.LauncherSettings),
}
HOST_FACTS = env_names(core_settings.HostEnv)


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """The process environment holding exactly the contract's variables that the case sets."""
    saved = dict(os.environ)
    known = {name for names in CONTRACTS.values() for name in names} | set(HOST_FACTS) | set(SECRETS)
    for name in known & set(os.environ):
        del os.environ[name]
    os.environ.update(SECRETS)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan(framework: str, values: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with environment(values), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", "--framework", framework, "--", "python", "/job/train.py"])
    return code, out.getvalue(), err.getvalue()


def assert_plan_or_one_line(framework: str, values: dict[str, str], code: int, out: str, err: str) -> None:
    said = out + err
    assert "Traceback" not in said, said
    assert SECRET not in said, f"the secret was printed: {said}"
    assert code in (0, 2), f"{framework} {values}: exit {code}\n{said}"
    if code == 0:
        assert isinstance(json.loads(out), dict)
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and out == "", f"{framework} {values}: expected one line\n{said}"
    named = [name for name in (*CONTRACTS[framework], *HOST_FACTS, "hostfile") if name in lines[0]]
    assert named, f"{framework} {values}: the line names no variable of the contract: {lines[0]}"


def contract_env(framework: str) -> st.SearchStrategy[dict[str, str]]:
    names = st.sampled_from(CONTRACTS[framework] + HOST_FACTS)
    return st.dictionaries(names, ENV_VALUES | st.just(SECRET), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def hostfile(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mpi") / "hostfile"
    path.write_text("tj-node-0-0.tj slots=2\ntj-node-0-1.tj slots=2\n")
    return str(path)


@pytest.mark.parametrize("framework", ["torch", "jax", "xgboost", pytest.param("mpi", id="mpirun")])  # (an id "mpi" is pytest-mpi's)
@given(data=st.data())
def test_any_environment_gives_a_plan_or_one_line_naming_a_variable(framework, data, hostfile):
    values = data.draw(contract_env(framework), label="environment")
    if framework == "mpi":  # a readable hostfile and a known MPI, unless the case says otherwise
        values = {"LAUNCHER_MPI_HOSTFILE": hostfile, "LAUNCHER_MPI_IMPLEMENTATION": "openmpi", **values}
    assert_plan_or_one_line(framework, values, *plan(framework, values))


@given(values=st.dictionaries(st.sampled_from(env_names(InitSettings)), ENV_VALUES | st.just(SECRET),
                              min_size=1, max_size=6))
@example(values={"STORAGE_URI": f"s3://user:{SECRET}@bucket/key"})
@example(values={"STORAGE_URI": "hf://o/n", "ACCESS_TOKEN": SECRET + "\n"})
def test_any_initializer_environment_loads_or_is_refused_in_one_line(values, tmp_path_factory):
    """The initializer's settings (its download would need a real bucket: the storage fuzzers
    cover the listing); a refusal is delivered as the initializer delivers it."""
    termination_log = tmp_path_factory.mktemp("init") / "termination.json"
    with environment({**values, "ACCESS_TOKEN": values.get("ACCESS_TOKEN", SECRET)}):
        try:
            core_settings.load(InitSettings)
            return
        except ConfigError as error:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                code = deliver(error.outcome(), str(termination_log), None)
    said = err.getvalue() + termination_log.read_text()
    assert code == 2 and "Traceback" not in said and SECRET not in said, said
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1 and any(name in lines[0] for name in (*values, "ACCESS_TOKEN")), lines
