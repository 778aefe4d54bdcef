"""One exit-code table: the exit code, ``retryable`` in the termination message and the runtimes'
podFailurePolicy agree for every way the launcher can fail.

First the three disagreements issue 10 found, through the real CLI; then every ``LauncherError``
subclass in the code base and every storage-error mapping of the initializers, each delivered
through ``report.deliver`` (the one place ``retryable`` is decided) and checked against
``failure_policy.pod_failure_policy``.
"""

from __future__ import annotations

import ast
import errno
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import launcher
from conftest import REPO, clean_env, launcher as launcher_argv
from launcher.core import failure_policy
from launcher.core.outcome import CONFIG_ERROR, DEFAULT_RETRYABLE_EXIT_CODES, TRANSIENT, LauncherError

# --- the policy as Kubernetes evaluates it ----------------------------------------------------------


def policy_fails_job_at_once(exit_code: int, codes: frozenset[int]) -> bool:
    """What the Job controller does with a container that exited ``exit_code`` under the policy
    the runtimes carry: the first matching onExitCodes rule wins; FailJob fails it at once."""
    policy = failure_policy.pod_failure_policy("node", codes)
    for rule in policy["rules"]:
        on_codes = rule.get("onExitCodes")
        if on_codes is None:
            continue
        listed = exit_code in on_codes["values"]
        if listed == (on_codes["operator"] == "In"):
            return rule["action"] == "FailJob"
    return False


def delivered(outcome, tmp_path: Path, codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES) -> tuple[int, dict]:
    """The exit code and termination message the launcher would hand Kubernetes for ``outcome``."""
    from launcher.core.report import deliver

    path = tmp_path / "termination.json"
    code = deliver(outcome, str(path), codes)
    return code, json.loads(path.read_text())


def assert_agrees(outcome, tmp_path: Path, exit_code: int, retryable: bool) -> None:
    for codes in (DEFAULT_RETRYABLE_EXIT_CODES, frozenset({exit_code}) if exit_code else frozenset({1})):
        code, message = delivered(outcome, tmp_path, codes)
        assert code == message["exitCode"] == exit_code, (outcome, message)
        assert message["retryable"] is (exit_code in codes), (codes, message)
        assert policy_fails_job_at_once(code, codes) is (code != 0 and not message["retryable"]), (codes, message)
    assert delivered(outcome, tmp_path)[1]["retryable"] is retryable, outcome


# --- the three disagreements of issue 10, through the real CLI ----------------------------------------


def no_aws_credentials_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No AWS credentials anywhere: no AWS_* variables, empty config and credentials files, and no
    instance metadata service (which botocore would otherwise try over the network)."""
    empty = tmp_path / "empty-aws-file"
    empty.write_text("")
    env = {k: v for k, v in clean_env().items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty),
               AWS_EC2_METADATA_DISABLED="true", HOME=str(tmp_path), **extra)
    return env


def run_cli(argv: list[str], env: dict[str, str], log: Path, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(argv, env={**env, "LAUNCHER_TERMINATION_LOG": str(log)}, cwd=REPO,
                            capture_output=True, text=True, timeout=120, **kwargs)
    assert "Traceback" not in result.stderr, result.stderr
    return result, json.loads(log.read_text())


def test_exec_of_a_missing_command_is_127_and_not_retryable(tmp_path):
    result, message = run_cli(launcher_argv("exec", "--", "/nonexistent"), clean_env(), tmp_path / "t.json")
    assert result.returncode == 127
    assert (message["exitCode"], message["retryable"], message["reason"]) == (127, False, "CommandNotFound")
    assert "(permanent, CommandNotFound)" in result.stderr
    assert policy_fails_job_at_once(127, DEFAULT_RETRYABLE_EXIT_CODES)


def test_a_command_that_is_not_executable_is_126_and_not_retryable(tmp_path):
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    result, message = run_cli(launcher_argv("exec", "--", str(script)), clean_env(), tmp_path / "t.json")
    assert result.returncode == 126
    assert (message["exitCode"], message["retryable"], message["reason"]) == (126, False, "NotExecutable")


def test_s3_with_no_credentials_anywhere_is_a_permanent_configuration_error(s3_server, tmp_path):
    env = no_aws_credentials_env(tmp_path, STORAGE_URI="s3://datasets/imagenet", ENDPOINT=s3_server.endpoint)
    result, message = run_cli(launcher_argv("init", "dataset", "--output", str(tmp_path / "dataset")), env,
                              tmp_path / "t.json")
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert (message["exitCode"], message["retryable"], message["reason"]) == (2, False, "NoCredentials")
    assert "ACCESS_KEY_ID" in message["message"]  # says what to set
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _drop_to_uid_1000() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a root-owned 0755 directory and drop to uid 1000 (setpriv)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv(1) (util-linux) to drop to uid 1000")
    return [setpriv, "--reuid", "1000", "--regid", "1000", "--clear-groups"]


def _readable_by_uid_1000(path: Path) -> None:
    """The venv and the repository must be readable by uid 1000 for it to run the launcher."""
    probe = subprocess.run([*_drop_to_uid_1000(), "test", "-r", str(path)])
    if probe.returncode != 0:
        pytest.skip(f"uid 1000 cannot read {path}")


@pytest.fixture
def shared_dir():
    """A directory uid 1000 can reach (pytest's own tmp tree is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="exit-table-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_init_into_a_directory_it_may_not_write_is_permanent(shared_dir):
    drop = _drop_to_uid_1000()
    _readable_by_uid_1000(REPO / "launcher" / "cli.py")
    source = shared_dir / "source"
    source.mkdir(mode=0o755)
    (source / "train.csv").write_text("a,b\n")
    workspace = shared_dir / "workspace"  # like the SDK's bind mount: root-owned, 0755
    workspace.mkdir(mode=0o755)
    logs = shared_dir / "logs"
    logs.mkdir()
    logs.chmod(0o1777)
    env = clean_env(STORAGE_URI=f"file://{source}")
    result, message = run_cli([*drop, *launcher_argv("init", "dataset", "--output", str(workspace / "dataset"))],
                              env, logs / "t.json")
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert (message["exitCode"], message["retryable"], message["reason"]) == (2, False, "PermissionDenied")
    assert f"{workspace / 'dataset'}: Permission denied" in message["message"]
    assert not (workspace / "dataset").exists()


# --- every LauncherError subclass --------------------------------------------------------------------


def every_launcher_error_class() -> set[type]:
    """LauncherError and every subclass of it defined anywhere in the launcher package."""
    for module in pkgutil.walk_packages(launcher.__path__, "launcher."):
        if module.name.rsplit(".", 1)[-1] != "__main__":  # __main__ runs the CLI on import
            importlib.import_module(module.name)
    found, todo = {LauncherError}, [LauncherError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("launcher.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def launcher_errors() -> list[tuple[LauncherError, int, bool]]:
    """An instance of each class, the exit code the table gives it and whether it is retryable."""
    from launcher.core.outcome import ConfigError, UnsupportedVersion, WaitTimeout
    from launcher.core.supervisor import SpawnError
    import errno

    from launcher.initializers.errors import CorruptDataError, LocalIOError, PermanentError, TransientError
    from launcher.initializers.lease import LeaseTimeout
    from launcher.core.lobby import Missing
    from launcher.k8s.inplace import NotPermitted

    return [
        (LauncherError("an unclassified launcher failure"), CONFIG_ERROR, False),
        (ConfigError("PET_NNODES", "x", "a node count"), CONFIG_ERROR, False),
        (ConfigError("ACCESS_TOKEN", "hf_secret", "a token", secret=True), CONFIG_ERROR, False),
        (WaitTimeout("no-such-master:29500 did not resolve within 600s"), TRANSIENT, True),
        (SpawnError("/nonexistent: command not found"), 127, False),
        (SpawnError("/etc/passwd: permission denied", 126), 126, False),
        (UnsupportedVersion("torch='2.3.1': expected torch >=2.4,<2.16"), CONFIG_ERROR, False),
        # JobSet in-place restart: the API server refused the service account (no Role bound).
        (NotPermitted("in-place restart: cannot annotate pod p: PATCH /api/v1/...: 403 Forbidden"), CONFIG_ERROR, False),
        # A restart in place: the lost pod never came back (PeerLost); the first start: a pod never came.
        (Missing("tj-node-0-1 did not come back to rejoin the job within 300s", "tj-node-0-1", True), TRANSIENT, True),
        (Missing("tj-node-0-1 never checked in at the job's lobby within 600s", "tj-node-0-1", False), TRANSIENT, True),
        # The initializers' storage errors: the same hierarchy, mapped by type.
        (TransientError("connection reset"), TRANSIENT, True),
        (CorruptDataError("the transport's checksum failed"), TRANSIENT, True),
        (LeaseTimeout("another initializer held the lease for 600s"), TRANSIENT, True),
        (PermanentError("no such bucket"), CONFIG_ERROR, False),
        # The target's file system: a full volume is permanent, an I/O error may heal.
        (LocalIOError(OSError(errno.ENOSPC, "No space left on device"), "/workspace/model"), CONFIG_ERROR, False),
        (LocalIOError(OSError(errno.EIO, "Input/output error"), "/workspace/model"), TRANSIENT, True),
    ]


def test_the_launchers_own_crash_delivers_70_and_agrees_with_the_policy(tmp_path):
    from launcher.core.outcome import INTERNAL_ERROR, internal_error

    try:
        raise AttributeError("module has no attribute 'Popen'")
    except AttributeError as error:
        outcome = internal_error(error, node="tj-node-0-0")
    assert outcome.reason == "LauncherError" and "tests/test_exit_table.py" in outcome.message
    assert_agrees(outcome, tmp_path, INTERNAL_ERROR, False)


def test_every_launcher_error_class_is_in_this_table():
    covered = {type(error) for error, _, _ in launcher_errors()}
    missing = every_launcher_error_class() - covered
    assert not missing, f"add these LauncherError subclasses to launcher_errors(): {sorted(c.__qualname__ for c in missing)}"


@pytest.mark.parametrize("error, exit_code, retryable", launcher_errors(),
                         ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_a_launcher_error_delivers_its_exit_code_and_agrees_with_the_policy(tmp_path, error, exit_code, retryable):
    from launcher.core.reasons import Reasons

    assert Reasons.named(error.reason) is error.reason and error.exit_code == error.reason.code  # the table's row
    assert_agrees(error.outcome(), tmp_path, exit_code, retryable)


# --- every storage-error mapping of the initializers ----------------------------------------------


def storage_outcome(error: Exception):
    """What ``init`` delivers when its transfer raised ``error``."""
    from launcher.initializers.errors import failure_outcome
    from launcher.initializers.uri import parse_storage_uri

    return failure_outcome(error, parse_storage_uri("s3://datasets/imagenet").shown, "/workspace/dataset")


def raised(call) -> Exception:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the mapped error is what we inspect
        return error
    raise AssertionError("the mapping raised nothing")


def _reasons_in_the_source() -> tuple[set[str], set[str]]:
    """The reasons ``PermanentError(...)`` is raised with in launcher/initializers, read from the
    source: named ones (``Reasons.NOT_FOUND``), and the expressions of computed ones."""
    from launcher.core.reasons import Reasons

    named, computed = set(), set()
    for path in (REPO / "launcher" / "initializers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "PermanentError":
                reason = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "reason"), None)
                if reason is None:
                    named.add(Reasons.STORAGE_ERROR)  # the default
                elif isinstance(reason, ast.Attribute) and getattr(reason.value, "id", None) == "Reasons":
                    named.add(getattr(Reasons, reason.attr))
                elif isinstance(reason, ast.Constant):
                    named.add(reason.value)
                else:
                    computed.add(ast.unparse(reason))
    return named, computed


def permanent_error_reasons() -> set[str]:
    """Every reason a PermanentError can carry: the literal ones in the source (a new
    ``raise PermanentError(..., "Reason")`` is covered without editing this test) and every
    value of the tables the computed ones are looked up in."""
    from launcher.initializers import errors, http, s3

    reasons = set(http._PERMANENT.values()) | set(s3.S3_PERMANENT_CODES.values())
    reasons |= set(s3.BOTOCORE_PERMANENT.values()) | set(errors.PERMANENT_ERRNOS.values())
    reasons |= set(s3.OBSTORE_PERMANENT.values()) | set(s3.OBSTORE_PERMANENT_STATUS.values())
    return reasons | _reasons_in_the_source()[0]


def test_computed_storage_reasons_come_only_from_the_tables_walked_here():
    # `reason` is bound from permanent_os_error() (PERMANENT_ERRNOS) or BOTOCORE_PERMANENT.
    assert _reasons_in_the_source()[1] <= {"_PERMANENT[status]", "S3_PERMANENT_CODES[code]", "reason"}
    assert {"NotFound", "AuthFailed", "UnsafePath", "BadArchive", "NoCredentials", "PermissionDenied"} <= (
        permanent_error_reasons())


@pytest.mark.parametrize("reason", sorted(permanent_error_reasons()))
def test_every_permanent_storage_reason_is_exit_2_and_fails_the_job(tmp_path, reason):
    from launcher.initializers.errors import PermanentError

    outcome = storage_outcome(PermanentError("what happened", reason))
    assert outcome.reason == reason
    assert_agrees(outcome, tmp_path, CONFIG_ERROR, False)


@pytest.mark.parametrize("error_class", ["TransientError", "CorruptDataError"])
def test_a_transient_storage_error_is_138_and_retried(tmp_path, error_class):
    from launcher.initializers import errors

    outcome = storage_outcome(getattr(errors, error_class)("connection reset"))
    assert outcome.reason == "StorageUnavailable"
    assert_agrees(outcome, tmp_path, TRANSIENT, True)


def s3_client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "ListObjectsV2")


def s3_cases() -> list[tuple[str, int, int, str]]:
    """(S3 error code, HTTP status, exit code, reason): every code in the table, plus statuses."""
    from launcher.initializers.s3 import S3_PERMANENT_CODES

    status_of = {"NotFound": 404, "AuthFailed": 403}
    cases = [(code, status_of[reason], CONFIG_ERROR, reason) for code, reason in S3_PERMANENT_CODES.items()]
    cases += [
        ("SomethingForbidden", 403, CONFIG_ERROR, "AuthFailed"),
        ("Unauthorized", 401, CONFIG_ERROR, "AuthFailed"),
        ("InvalidBucketName", 400, CONFIG_ERROR, "StorageError"),
        ("MethodNotAllowed", 405, CONFIG_ERROR, "StorageError"),
        ("InvalidRange", 416, TRANSIENT, "StorageUnavailable"),  # the partial file is discarded and refetched
        ("SlowDown", 429, TRANSIENT, "StorageUnavailable"),
        ("InternalError", 500, TRANSIENT, "StorageUnavailable"),
        ("SlowDown", 503, TRANSIENT, "StorageUnavailable"),
        ("", 0, TRANSIENT, "StorageUnavailable"),
    ]
    return cases


@pytest.mark.parametrize("code, status, exit_code, reason", s3_cases(), ids=lambda v: str(v))
def test_every_s3_error_code(tmp_path, code, status, exit_code, reason):
    from launcher.initializers.s3 import S3Source

    def fail():
        raise s3_client_error(code, status)

    outcome = storage_outcome(raised(lambda: S3Source.call(fail, "list s3://datasets/imagenet")))
    assert outcome.reason == reason
    assert_agrees(outcome, tmp_path, exit_code, exit_code in DEFAULT_RETRYABLE_EXIT_CODES)


def botocore_cases() -> list[tuple[Exception, int, str]]:
    from botocore import exceptions as boto

    return [
        (boto.NoCredentialsError(), CONFIG_ERROR, "NoCredentials"),
        (boto.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), CONFIG_ERROR, "NoCredentials"),
        (boto.ProfileNotFound(profile="training"), CONFIG_ERROR, "NoCredentials"),
        (boto.InvalidConfigError(error_msg="bad config"), CONFIG_ERROR, "ConfigError"),
        (boto.NoRegionError(), CONFIG_ERROR, "ConfigError"),
        (boto.InvalidRegionError(region_name="not a region"), CONFIG_ERROR, "ConfigError"),
        (boto.ParamValidationError(report="Invalid bucket name"), CONFIG_ERROR, "ConfigError"),
        (boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), TRANSIENT, "StorageUnavailable"),
        (boto.ConnectTimeoutError(endpoint_url="http://10.0.0.1"), TRANSIENT, "StorageUnavailable"),
        (boto.ReadTimeoutError(endpoint_url="http://10.0.0.1"), TRANSIENT, "StorageUnavailable"),
        (boto.CredentialRetrievalError(provider="container-role", error_msg="timed out"), TRANSIENT,
         "StorageUnavailable"),
    ]


def test_the_botocore_table_names_real_botocore_errors_and_all_are_covered():
    from botocore import exceptions as boto

    from launcher.initializers.s3 import BOTOCORE_PERMANENT

    for name in BOTOCORE_PERMANENT:
        assert issubclass(getattr(boto, name), boto.BotoCoreError), name
    assert set(BOTOCORE_PERMANENT) <= {type(error).__name__ for error, _, _ in botocore_cases()}


@pytest.mark.parametrize("error, exit_code, reason", botocore_cases(), ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_every_botocore_error(tmp_path, error, exit_code, reason):
    from launcher.initializers.s3 import S3Source

    def fail():
        raise error

    outcome = storage_outcome(raised(lambda: S3Source.call(fail, "list s3://datasets/imagenet")))
    assert outcome.reason == reason
    assert "\n" not in outcome.message
    assert_agrees(outcome, tmp_path, exit_code, exit_code in DEFAULT_RETRYABLE_EXIT_CODES)


@pytest.mark.parametrize("status", range(400, 600))
def test_every_http_status(tmp_path, status):
    from launcher.initializers.http import _PERMANENT, classify_status

    outcome = storage_outcome(classify_status(status, "https://example.com/data.tar"))
    if status in _PERMANENT:
        assert (outcome.exit_code, outcome.reason) == (CONFIG_ERROR, _PERMANENT[status])
    assert_agrees(outcome, tmp_path, CONFIG_ERROR if status in _PERMANENT else TRANSIENT, status not in _PERMANENT)


def test_http_not_found_and_forbidden_are_permanent_and_unavailable_is_retried(tmp_path):
    from launcher.initializers.http import classify_status

    assert storage_outcome(classify_status(404, "u")).exit_code == CONFIG_ERROR
    assert storage_outcome(classify_status(403, "u")).exit_code == CONFIG_ERROR
    assert storage_outcome(classify_status(503, "u")).exit_code == TRANSIENT


def hub_error(cls_name: str, status: int):
    import httpx2  # what huggingface_hub's errors are built on
    from huggingface_hub import errors

    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/o/n"))
    if cls_name == "EntryNotFoundError":
        return errors.EntryNotFoundError("no such file")
    return getattr(errors, cls_name)("message", response=response)


@pytest.mark.parametrize("cls_name, status, exit_code, reason", [
    ("GatedRepoError", 403, CONFIG_ERROR, "AuthFailed"),
    ("RepositoryNotFoundError", 404, CONFIG_ERROR, "NotFound"),
    ("RevisionNotFoundError", 404, CONFIG_ERROR, "NotFound"),
    ("EntryNotFoundError", 404, CONFIG_ERROR, "NotFound"),
    *[("HfHubHTTPError", s, CONFIG_ERROR, "AuthFailed") for s in (401, 403)],
    *[("HfHubHTTPError", s, CONFIG_ERROR, "StorageError") for s in (400, 404, 409, 416)],
    *[("HfHubHTTPError", s, TRANSIENT, "StorageUnavailable") for s in (429, 500, 502, 503, 504)],
], ids=lambda v: str(v))
def test_every_hub_error(tmp_path, cls_name, status, exit_code, reason):
    from launcher.initializers.sources import HubSource

    error = hub_error(cls_name, status)

    def fail():
        raise error

    outcome = storage_outcome(raised(lambda: HubSource.call(None, fail, "hf://o/n")))
    assert outcome.reason == reason
    assert_agrees(outcome, tmp_path, exit_code, exit_code in DEFAULT_RETRYABLE_EXIT_CODES)


@pytest.mark.parametrize("code", sorted(errno.errorcode), ids=lambda c: errno.errorcode[c])
def test_every_local_errno(tmp_path, code):
    from launcher.initializers.errors import PERMANENT_ERRNOS

    outcome = storage_outcome(OSError(code, os.strerror(code), "/workspace/dataset/train.csv"))
    assert outcome.message == f"/workspace/dataset/train.csv: {os.strerror(code)}"
    if code in PERMANENT_ERRNOS:
        assert (outcome.exit_code, outcome.reason) == (CONFIG_ERROR, PERMANENT_ERRNOS[code])
    else:
        assert (outcome.exit_code, outcome.reason) == (TRANSIENT, "LocalIOError")
    assert_agrees(outcome, tmp_path, outcome.exit_code, code not in PERMANENT_ERRNOS)


@pytest.mark.parametrize("name, permanent", [
    ("EACCES", True), ("EPERM", True), ("EROFS", True), ("ENOSPC", True), ("EDQUOT", True),
    ("ENOTDIR", True), ("EEXIST", True),
    ("EIO", False), ("ESTALE", False), ("ETIMEDOUT", False), ("EAGAIN", False), ("ENOMEM", False),
])
def test_which_local_errors_heal_on_retry(name, permanent):
    code = getattr(errno, name)
    outcome = storage_outcome(OSError(code, os.strerror(code), "/workspace/dataset"))
    assert outcome.exit_code == (CONFIG_ERROR if permanent else TRANSIENT)


def test_a_source_path_that_cannot_be_read_as_a_file_is_permanent(tmp_path):
    """file:// from a mounted volume: a source errno that no retry fixes (EISDIR here; EACCES
    cannot be provoked as root) is as permanent as on the target."""
    from launcher.initializers.errors import PermanentError
    from launcher.initializers.listing import RemoteFile
    from launcher.initializers.sources import FileSource

    source = FileSource.__new__(FileSource)
    directory = tmp_path / "not-a-file"
    directory.mkdir()
    error = raised(lambda: list(source.read(RemoteFile("x", 1, key=str(directory)), 0, 1024)))
    assert isinstance(error, PermanentError) and error.reason == "BadPath"
