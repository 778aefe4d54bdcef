"""Every environment contract the launcher reads, validated. The only module that reads os.environ.

Each field names its variable (``env``), and, for the launcher's own knobs, the CLI flag that
overrides it. Values are parsed by small functions that say what they expected, so any bad value
becomes one :class:`ConfigError` line: variable (or flag), value, expectation.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from typing import Annotated, Any, Callable

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from launcher.knobs import INIT_KNOBS, KNOBS, MPI_KNOBS, SMOKE_KNOBS, Knob, Override
from launcher.outcome import DEFAULT_RETRYABLE_EXIT_CODES, ConfigError

MAX_NODES = 100_000
MAX_NPROC = 1024

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CONF_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class _Invalid(ValueError):
    """A parser's complaint: what it expected."""


# --- value parsers: str -> typed value, or _Invalid("what was expected") ----------------------


def int_in(low: int, high: int, what: str = "an integer") -> Callable[[Any], int]:
    expected = f"{what} from {low} to {high}"

    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise _Invalid(expected)
        if isinstance(raw, int):
            value = raw
        else:
            text = str(raw).strip()
            if not re.fullmatch(r"[+-]?\d{1,12}", text):
                raise _Invalid(expected)
            value = int(text)
        if not low <= value <= high:
            raise _Invalid(expected)
        return value

    return parse


def parse_duration(raw: Any) -> float:
    """Seconds: ``90``, ``90s``, ``1.5``, ``10m``, ``1h``."""
    expected = "a duration in seconds, like 90, 90s, 10m or 1h"
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(raw))
        if not match:
            raise _Invalid(expected)
        value = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]
    if not 0 <= value <= 7 * 24 * 3600:
        raise _Invalid(expected + " (at most 7 days)")
    return value


def parse_nnodes(raw: Any) -> tuple[int, int]:
    """``4`` -> (4, 4); ``2:4`` -> (2, 4), as torchrun's ``--nnodes``."""
    expected = f"a node count N or a range MIN:MAX, 1 <= MIN <= MAX <= {MAX_NODES}"
    if isinstance(raw, tuple):
        return raw
    parts = str(raw).strip().split(":")
    if len(parts) > 2:
        raise _Invalid(expected)
    try:
        bounds = [int_in(1, MAX_NODES)(p) for p in parts]
    except _Invalid:
        raise _Invalid(expected) from None
    low, high = bounds[0], bounds[-1]
    if low > high:
        raise _Invalid(expected + f" (MIN {low} is above MAX {high})")
    return low, high


def parse_nproc(raw: Any) -> str | int:
    """``auto``, ``cpu``, ``gpu`` or a process count."""
    text = str(raw).strip().lower()
    if text in ("auto", "cpu", "gpu"):
        return text
    try:
        return int_in(1, MAX_NPROC)(text)
    except _Invalid:
        raise _Invalid(f"auto, cpu, gpu or a process count from 1 to {MAX_NPROC}") from None


def parse_host(raw: Any) -> str:
    """A DNS name (RFC 1123) or an IPv4/IPv6 address (IPv6 with or without brackets)."""
    text = str(raw).strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(bare)
        return text
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    if 0 < len(name) <= 253 and all(_HOST_LABEL.match(label) for label in name.split(".")):
        return text
    raise _Invalid("a DNS name or an IP address")


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port``, as torchrun's ``--rdzv-endpoint``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise _Invalid("HOST[:PORT]")
        port = rest[1:] if rest else None
        host = f"[{host}]"
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    return host, (None if port is None else int(port) if port.isdigit() else -1)


def parse_endpoint(raw: Any) -> str:
    expected = "HOST[:PORT] with a DNS name or IP address and a port from 1 to 65535"
    text = str(raw).strip()
    try:
        host, port = split_host_port(text)
        parse_host(host)
    except _Invalid:
        raise _Invalid(expected) from None
    if port is not None and not 1 <= port <= 65535:
        raise _Invalid(expected)
    return text


def parse_choice(*choices: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        text = str(raw).strip()
        if text.lower() not in choices:
            raise _Invalid("one of " + ", ".join(choices))
        return text.lower()

    return parse


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _Invalid("1 or 0 (true/false, yes/no, on/off)")


def parse_rdzv_id(raw: Any) -> str:
    text = str(raw).strip()
    if not _RDZV_ID.match(text):
        raise _Invalid("1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return text


def parse_rdzv_conf(raw: Any) -> str:
    text = str(raw).strip()
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or not _CONF_KEY.match(key.strip()) or not value.strip():
            raise _Invalid("KEY=VALUE[,KEY=VALUE...], e.g. join_timeout=600")
    return text


def parse_exit_codes(raw: Any) -> frozenset[int]:
    if isinstance(raw, frozenset):
        return raw
    expected = "a comma-separated list of exit codes from 1 to 255, e.g. 130,137,138,143"
    items = [item.strip() for item in str(raw).split(",") if item.strip()]
    if not items:
        raise _Invalid(expected)
    try:
        return frozenset(int_in(1, 255)(item) for item in items)
    except _Invalid:
        raise _Invalid(expected) from None


def parse_output_path(raw: Any) -> str:
    """A file we will write at the very end: its directory must exist now, not after training."""
    text = str(raw)
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise _Invalid("a file path in an existing, writable directory")
    return text


def parse_url(raw: Any) -> str:
    text = str(raw).strip()
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise _Invalid("an http(s)://HOST[:PORT] URL")
    return text


def parse_regex(raw: Any) -> str:
    text = str(raw)
    try:
        re.compile(text)
    except re.error as error:
        raise _Invalid(f"a valid regular expression ({error})") from None
    return text


# --- models -------------------------------------------------------------------------------------


def _field(env: str | tuple[str, ...], default: Any, help: str, **extra: Any) -> Any:
    names = (env,) if isinstance(env, str) else env
    alias = names[0] if len(names) == 1 else AliasChoices(*names)
    return Field(default, validation_alias=alias, description=help, json_schema_extra={"env": names, **extra})


def _from(table: dict[str, Knob], name: str, default: Any, *also: str) -> Any:
    """The field of knob ``name`` in ``table`` (launcher.knobs); ``also``: older variable names."""
    knob = table[name]
    return _field((knob.env, *also), default, knob.help, flag=knob.flag)


_knob = functools.partial(_from, KNOBS)
_mpi_knob = functools.partial(_from, MPI_KNOBS)
_init_knob = functools.partial(_from, INIT_KNOBS)
_smoke_knob = functools.partial(_from, SMOKE_KNOBS)


def _parsed(parse: Callable[[Any], Any]) -> Any:
    # NoDecode: values are our own formats (2:4, 130,137), never JSON.
    return BeforeValidator(parse)


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True,
        env_ignore_empty=True,  # the controller's convention: an empty string means unset
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        validate_default=False,
    )



class LauncherSettings(_Settings):
    """The launcher's own knobs: ``LAUNCHER_*`` variables, each also a CLI flag (launcher.knobs)."""

    rendezvous_timeout: Annotated[float, NoDecode, _parsed(parse_duration)] = _knob("rendezvous_timeout", 600.0)
    grace_period: Annotated[float, NoDecode, _parsed(parse_duration)] = _knob("grace_period", 25.0)
    termination_log: Annotated[str | None, NoDecode, _parsed(parse_output_path)] = _knob("termination_log", None)
    retryable_exit_codes: Annotated[frozenset[int], NoDecode, _parsed(parse_exit_codes)] = _knob(
        "retryable_exit_codes", DEFAULT_RETRYABLE_EXIT_CODES)
    retryable_pattern: Annotated[str | None, NoDecode, _parsed(parse_regex)] = _knob("retryable_pattern", None)
    log_format: Annotated[str, NoDecode, _parsed(parse_choice("text", "json"))] = _knob("log_format", "text")
    keep_nproc: Annotated[bool, NoDecode, _parsed(parse_bool)] = _knob("keep_nproc", False)


_backend = parse_choice("static", "c10d", "etcd", "etcd-v2")


class TorchSettings(_Settings):
    """What Trainer's torch policy injects (``PET_*``), with torchrun's defaults."""

    nnodes: Annotated[tuple[int, int], NoDecode, _parsed(parse_nnodes)] = _field(
        "PET_NNODES", (1, 1), "node count, or MIN:MAX for elastic jobs")
    nproc_per_node: Annotated[str | int, NoDecode, _parsed(parse_nproc)] = _field(
        "PET_NPROC_PER_NODE", 1, "processes per node: auto, cpu, gpu or a count")
    node_rank: Annotated[int, NoDecode, _parsed(int_in(0, MAX_NODES - 1))] = _field(
        ("PET_NODE_RANK", "JOB_COMPLETION_INDEX"), 0, "this node's rank")
    master_addr: Annotated[str | None, NoDecode, _parsed(parse_host)] = _field(
        "PET_MASTER_ADDR", None, "the rank-0 node's address")
    master_port: Annotated[int, NoDecode, _parsed(int_in(1, 65535, "a port"))] = _field(
        "PET_MASTER_PORT", 29500, "the rank-0 node's port")
    rdzv_backend: Annotated[str | None, NoDecode, _parsed(_backend)] = _field(
        "PET_RDZV_BACKEND", None, "rendezvous backend")
    rdzv_endpoint: Annotated[str | None, NoDecode, _parsed(parse_endpoint)] = _field(
        "PET_RDZV_ENDPOINT", None, "rendezvous HOST[:PORT]")
    rdzv_id: Annotated[str | None, NoDecode, _parsed(parse_rdzv_id)] = _field(
        "PET_RDZV_ID", None, "rendezvous id shared by all nodes of the job")
    rdzv_conf: Annotated[str | None, NoDecode, _parsed(parse_rdzv_conf)] = _field(
        "PET_RDZV_CONF", None, "rendezvous KEY=VALUE,... settings")
    max_restarts: Annotated[int | None, NoDecode, _parsed(int_in(0, 10_000))] = _field(
        "PET_MAX_RESTARTS", None, "worker group restarts before failing")
    standalone: Annotated[bool, NoDecode, _parsed(parse_bool)] = _field(
        "PET_STANDALONE", False, "single-node job with a private rendezvous")



def parse_globs(raw: Any) -> tuple[str, ...]:
    items = tuple(item.strip() for item in str(raw).split(",") if item.strip())
    if not items or any(not re.fullmatch(r"[A-Za-z0-9_*?\[\]!-]+", item) for item in items):
        raise _Invalid("comma-separated variable names or globs, e.g. NCCL_*,MY_FLAG")
    return items


class MpiSettings(_Settings):
    """The MPI launcher's and worker's knobs, and the variables Trainer's MPI policy sets."""

    hostfile: str = _mpi_knob(
        "hostfile", "/etc/mpi/hostfile",
        "OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")
    default_slots: Annotated[int | None, NoDecode, _parsed(int_in(1, 4096, "a slot count"))] = _mpi_knob(
        "default_slots", None, "OMPI_MCA_orte_set_default_slots", "PRTE_MCA_prte_set_default_slots")
    implementation: Annotated[str, NoDecode, _parsed(parse_choice("auto", "openmpi", "intel", "mpich"))] = _mpi_knob(
        "implementation", "auto")
    mpirun: str | None = _mpi_knob("mpirun", None)
    ssh_port: Annotated[int, NoDecode, _parsed(int_in(1, 65535, "a port"))] = _mpi_knob("ssh_port", 2222)
    ssh_auth_mount_path: str = _mpi_knob("ssh_auth_mount_path", os.path.expanduser("~/.ssh"))
    ssh_dir: str = _mpi_knob("ssh_dir", os.path.expanduser("~/.trainer-launcher/ssh"))
    ssh_listen_address: Annotated[str | None, NoDecode, _parsed(parse_host)] = _mpi_knob("ssh_listen_address", None)
    export: Annotated[tuple[str, ...], NoDecode, _parsed(parse_globs)] = _mpi_knob("export", ("*",))
    export_deny: Annotated[tuple[str, ...], NoDecode, _parsed(parse_globs)] = _mpi_knob("export_deny", ())
    abort_on_exception: Annotated[bool, NoDecode, _parsed(parse_bool)] = _mpi_knob("abort_on_exception", True)



def parse_patterns(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, tuple):
        return raw
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


class InitSettings(_Settings):
    """The initializer contract (upstream names, an empty string means unset) and our extras."""

    storage_uri: str | None = _field("STORAGE_URI", None, "where to download from")
    ignore_patterns: Annotated[tuple[str, ...] | None, NoDecode, _parsed(parse_patterns)] = _field(
        "IGNORE_PATTERNS", None, "comma-separated globs to skip")
    allow_patterns: Annotated[tuple[str, ...] | None, NoDecode, _parsed(parse_patterns)] = _field(
        "ALLOW_PATTERNS", None, "comma-separated globs to fetch (all when unset)")
    access_token: str | None = _field("ACCESS_TOKEN", None, "hf: token", secret=True)
    endpoint: Annotated[str | None, NoDecode, _parsed(parse_url)] = _field("ENDPOINT", None, "s3: endpoint URL")
    access_key_id: str | None = _field("ACCESS_KEY_ID", None, "s3: access key id", secret=True)
    secret_access_key: str | None = _field("SECRET_ACCESS_KEY", None, "s3: secret access key", secret=True)
    region: str = _field("REGION", "auto", "s3: region")
    role_arn: str | None = _field("ROLE_ARN", None, "s3: role to assume")
    output_path: str | None = _init_knob("output_path", None, "OUTPUT_PATH")
    revision: str | None = _init_knob("revision", None)
    concurrency: Annotated[int, NoDecode, _parsed(int_in(1, 256, "a number of parallel transfers"))] = _init_knob(
        "concurrency", 8)
    chunk_size: Annotated[int, NoDecode, _parsed(int_in(65536, 1 << 30, "a chunk size in bytes"))] = _init_knob(
        "chunk_size", 8 << 20)
    retries: Annotated[int, NoDecode, _parsed(int_in(0, 100, "a retry count"))] = _init_knob("retries", 6)
    ranged_min: Annotated[int, NoDecode, _parsed(int_in(1 << 20, 1 << 50, "a size in bytes"))] = _init_knob(
        "ranged_min", 64 << 20)
    extract: Annotated[bool, NoDecode, _parsed(parse_bool)] = _init_knob("extract", False)


def parse_positive(raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise _Invalid("a number >= 0") from None
    if not 0 <= value < 1e9:
        raise _Invalid("a number >= 0")
    return value



class SmokeSettings(_Settings):
    """Thresholds of the preflight (each also a flag)."""

    min_shm_gb: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_shm_gb", 1.0)
    min_free_gb: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_free_gb", 10.0)
    min_matmul_gflops: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_matmul_gflops", 1.0)
    min_bf16_tflops: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_bf16_tflops", 100.0)
    min_copy_gbps: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_copy_gbps", 500.0)
    min_busbw_gbps: Annotated[float, NoDecode, _parsed(parse_positive)] = _smoke_knob("min_busbw_gbps", 10.0)


class HostEnv(_Settings):
    """Variables about this host that planning needs (never validated strictly: they are facts)."""

    # Here empty is meaningful: CUDA_VISIBLE_DEVICES="" hides every GPU.
    model_config = SettingsConfigDict(**{**_Settings.model_config, "env_ignore_empty": False})

    cuda_visible_devices: str | None = Field(None, validation_alias="CUDA_VISIBLE_DEVICES")
    nvidia_visible_devices: str | None = Field(None, validation_alias="NVIDIA_VISIBLE_DEVICES")
    omp_num_threads: str | None = Field(None, validation_alias="OMP_NUM_THREADS")
    hostname: str | None = Field(None, validation_alias="HOSTNAME")
    rank: str | None = Field(None, validation_alias="RANK")
    neuron_rt_visible_cores: str | None = Field(None, validation_alias="NEURON_RT_VISIBLE_CORES")
    aws_neuron_visible_devices: str | None = Field(None, validation_alias="AWS_NEURON_VISIBLE_DEVICES")
    neuron_logical_nc_config: str | None = Field(None, validation_alias="NEURON_LOGICAL_NC_CONFIG")
    habana_visible_devices: str | None = Field(None, validation_alias="HABANA_VISIBLE_DEVICES")


# --- loading ------------------------------------------------------------------------------------


def source_of(model: type[_Settings], name: str, overrides: dict[str, Override] | None = None) -> str | None:
    """Which flag or variable supplied field ``name`` (None: the default)."""
    if overrides and name in overrides:
        return overrides[name].source
    for env in model.model_fields[name].json_schema_extra["env"]:
        if os.environ.get(env, "") != "":
            return env
    return None


def raw_value(model: type[_Settings], name: str, overrides: dict[str, Override] | None = None) -> Any:
    if overrides and name in overrides:
        return overrides[name].value
    for env in model.model_fields[name].json_schema_extra["env"]:
        if os.environ.get(env, "") != "":
            return os.environ[env]
    return None


def load(model: type[_Settings], overrides: dict[str, Override] | None = None) -> Any:
    """Build ``model`` from the environment and ``overrides``; the first bad value raises ConfigError."""
    overrides = overrides or {}
    try:
        return model(**{name: o.value for name, o in overrides.items()})
    except SettingsError as error:  # a source could not even hand the value over
        raise ConfigError(model.__name__, None, str(error)) from None
    except ValidationError as error:
        first = error.errors()[0]
        field_name = _field_for(model, first["loc"][0] if first["loc"] else "")
        source = source_of(model, field_name, overrides) or field_name
        message = str(first.get("ctx", {}).get("error") or first["msg"])
        secret = bool((model.model_fields[field_name].json_schema_extra or {}).get("secret")) if field_name in model.model_fields else False
        raise ConfigError(source, raw_value(model, field_name, overrides), message.removeprefix("Value error, "),
                          secret=secret) from None


def _field_for(model: type[_Settings], loc: Any) -> str:
    for name, info in model.model_fields.items():
        if loc == name or loc in info.json_schema_extra["env"]:
            return name
    return str(loc)


def secret_values() -> list[str]:
    """Values of variables whose names say they are secret, to redact from any text we emit."""
    return sorted(
        # Real secrets are long; redacting a 4-letter value like "test" would only mangle paths.
        (v for k, v in os.environ.items() if _SECRET_NAME.search(k.upper()) and len(v) >= 8),
        key=len,
        reverse=True,
    )


def redact(text: str, secrets: list[str] | None = None) -> str:
    for secret in secret_values() if secrets is None else secrets:
        text = text.replace(secret, "***")
    return text


# Set by `trainer-launcher exec` for its command: a launcher nested in it (the SDK's `bash -lc`
# whose torchrun shim runs `trainer-launcher torch`) writes its outcome there.
HANDOFF = "TRAINER_LAUNCHER_HANDOFF"


def handoff_path() -> str | None:
    return os.environ.get(HANDOFF) or None


def environ() -> dict[str, str]:
    """A copy of the environment, for building a child's environment."""
    return dict(os.environ)
