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
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from launcher.core import failure_policy
from launcher.core.knobs import KNOBS, Knob, Override
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, ConfigError

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class Invalid(ValueError):
    """A parser's complaint: what it expected."""


# --- value parsers: str -> typed value, or Invalid("what was expected") ----------------------


def int_in(low: int, high: int, what: str = "an integer") -> Callable[[Any], int]:
    expected = f"{what} from {low} to {high}"

    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise Invalid(expected)
        if isinstance(raw, int):
            value = raw
        else:
            text = str(raw).strip()
            if not re.fullmatch(r"[+-]?\d{1,12}", text):
                raise Invalid(expected)
            value = int(text)
        if not low <= value <= high:
            raise Invalid(expected)
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
            raise Invalid(expected)
        value = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]
    if not 0 <= value <= 7 * 24 * 3600:
        raise Invalid(expected + " (at most 7 days)")
    return value


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
    raise Invalid("a DNS name or an IP address")


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port``, as torchrun's ``--rdzv-endpoint``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise Invalid("HOST[:PORT]")
        port = rest[1:] if rest else None
        host = f"[{host}]"
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    # -1: not a port (callers name the range); isascii: int() would read '٣' as 3
    return host, (None if port is None else int(port) if port.isascii() and port.isdigit() else -1)


def parse_endpoint(raw: Any) -> str:
    expected = "HOST[:PORT] with a DNS name or IP address and a port from 1 to 65535"
    text = str(raw).strip()
    try:
        host, port = split_host_port(text)
        parse_host(host)
    except Invalid:
        raise Invalid(expected) from None
    if port is not None and not 1 <= port <= 65535:
        raise Invalid(expected)
    return text


def parse_choice(*choices: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        text = str(raw).strip()
        if text.lower() not in choices:
            raise Invalid("one of " + ", ".join(choices))
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
    raise Invalid("1 or 0 (true/false, yes/no, on/off)")


def parse_pod_grace(raw: Any) -> int:
    """A pod's terminationGracePeriodSeconds that leaves the ranks a grace: whole seconds above
    the launcher's margin."""
    return int_in(
        failure_policy.TERMINATION_MARGIN + 1,
        7 * 24 * 3600,
        f"the pod's terminationGracePeriodSeconds in whole seconds (above the launcher's "
        f"{failure_policy.TERMINATION_MARGIN}s margin),",
    )(raw)


def parse_exit_codes(raw: Any) -> frozenset[int]:
    if isinstance(raw, frozenset):
        return raw
    expected = "a comma-separated list of exit codes from 1 to 255, e.g. 130,137,138,143"
    items = [item.strip() for item in str(raw).split(",") if item.strip()]
    if not items:
        raise Invalid(expected)
    try:
        return frozenset(int_in(1, 255)(item) for item in items)
    except Invalid:
        raise Invalid(expected) from None


def parse_output_path(raw: Any) -> str:
    """A file we will write at the very end: its directory must exist now, not after training."""
    text = str(raw)
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise Invalid("a file path in an existing, writable directory")
    return text


def parse_url(raw: Any) -> str:
    text = str(raw).strip()
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise Invalid("an http(s)://HOST[:PORT] URL")
    return text


def parse_regex(raw: Any) -> str:
    text = str(raw)
    try:
        re.compile(text)
    except re.error as error:
        raise Invalid(f"a valid regular expression ({error})") from None
    return text


# --- models -------------------------------------------------------------------------------------


def field(env: str | tuple[str, ...], default: Any, help: str, **extra: Any) -> Any:
    names = (env,) if isinstance(env, str) else env
    alias = names[0] if len(names) == 1 else AliasChoices(*names)
    return Field(default, validation_alias=alias, description=help, json_schema_extra={"env": names, **extra})


def knob_field(table: dict[str, Knob], name: str, default: Any, *also: str) -> Any:
    """The field of knob ``name`` in ``table`` (launcher.core.knobs); ``also``: older variable names."""
    knob = table[name]
    return field((knob.env, *also), default, knob.help, flag=knob.flag)


_knob = functools.partial(knob_field, KNOBS)


def parsed(parse: Callable[[Any], Any]) -> Any:
    # NoDecode: values are our own formats (2:4, 130,137), never JSON.
    return BeforeValidator(parse)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True,
        env_ignore_empty=True,  # the controller's convention: an empty string means unset
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        validate_default=False,
    )


class LauncherSettings(Settings):
    """The launcher's own knobs: ``LAUNCHER_*`` variables, each also a CLI flag (launcher.core.knobs)."""

    rendezvous_timeout: Annotated[float, NoDecode, parsed(parse_duration)] = _knob("rendezvous_timeout", 600.0)
    # Before grace_period: the grace's check reads it.
    termination_grace_period_seconds: Annotated[int | None, NoDecode, parsed(parse_pod_grace)] = _knob(
        "termination_grace_period_seconds", None
    )
    grace_period: Annotated[float, NoDecode, parsed(parse_duration)] = _knob(
        "grace_period", failure_policy.DEFAULT_GRACE_PERIOD
    )
    termination_log: Annotated[str | None, NoDecode, parsed(parse_output_path)] = _knob("termination_log", None)
    retryable_exit_codes: Annotated[frozenset[int], NoDecode, parsed(parse_exit_codes)] = _knob(
        "retryable_exit_codes", DEFAULT_RETRYABLE_EXIT_CODES
    )
    retryable_pattern: Annotated[str | None, NoDecode, parsed(parse_regex)] = _knob("retryable_pattern", None)
    log_format: Annotated[str, NoDecode, parsed(parse_choice("text", "json"))] = _knob("log_format", "text")
    max_restarts: Annotated[int, NoDecode, parsed(int_in(0, 10_000, "a count of restarts"))] = _knob("max_restarts", 0)
    rejoin_timeout: Annotated[float, NoDecode, parsed(parse_duration)] = _knob(
        "rejoin_timeout", failure_policy.DEFAULT_REJOIN_TIMEOUT
    )
    keep_nproc: Annotated[bool, NoDecode, parsed(parse_bool)] = _knob("keep_nproc", False)
    allow_untested_versions: Annotated[bool, NoDecode, parsed(parse_bool)] = _knob("allow_untested_versions", False)
    hang_timeout: Annotated[float, NoDecode, parsed(parse_duration)] = _knob("hang_timeout", 0.0)
    hang_startup: Annotated[float, NoDecode, parsed(parse_duration)] = _knob("hang_startup", 0.0)
    progress_regex: Annotated[str | None, NoDecode, parsed(parse_regex)] = _knob("progress_regex", None)
    progress_file: Annotated[str | None, NoDecode, parsed(parse_output_path)] = _knob("progress_file", None)
    status_report: Annotated[str, NoDecode, parsed(parse_choice("auto", "off"))] = _knob("status_report", "auto")

    @field_validator("grace_period")
    @classmethod
    def _within_the_pods_grace(cls, grace: float, info: ValidationInfo) -> float:
        """A grace given beside the pod's must leave the launcher its margin within it."""
        pod = info.data.get("termination_grace_period_seconds")
        if pod is not None and grace > failure_policy.grace_period_for(pod):
            raise ValueError(
                f"a duration of at most {failure_policy.grace_period_for(pod):g}s: the pod's grace "
                f"(LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS={pod}) less the "
                f"{failure_policy.TERMINATION_MARGIN}s the launcher needs to write its termination message"
            )
        return grace

    @model_validator(mode="after")
    def _grace_from_the_pods(self) -> LauncherSettings:
        """No grace given, but the pod's: the grace is the pod's less the launcher's margin."""
        pod = self.termination_grace_period_seconds
        if pod is not None and "grace_period" not in self.model_fields_set:
            object.__setattr__(self, "grace_period", failure_policy.grace_period_for(pod))  # frozen
        return self

    def plan_json(self) -> dict:
        """The ``launcher`` block of a job's ``plan``: the knobs that decide how it waits, stops and ends."""
        return {
            "rendezvousTimeout": self.rendezvous_timeout,
            "gracePeriod": self.grace_period,
            "retryableExitCodes": sorted(self.retryable_exit_codes),
            "maxRestarts": self.max_restarts,
            "rejoinTimeout": self.rejoin_timeout,
            "logFormat": self.log_format,
        }


class HostEnv(Settings):
    """Variables about this host that planning needs (never validated strictly: they are facts)."""

    # Here empty is meaningful: CUDA_VISIBLE_DEVICES="" hides every GPU.
    model_config = SettingsConfigDict(**{**Settings.model_config, "env_ignore_empty": False})

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


def _extra(model: type[Settings], name: str) -> dict:
    """What :func:`field` recorded of field ``name`` beside pydantic's own (its variables, ...)."""
    extra = model.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _env_names(model: type[Settings], name: str) -> tuple[str, ...]:
    """The variables that set field ``name``, in the order they are read."""
    names = _extra(model, name).get("env")
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"{model.__name__}.{name}: a field without its variables (not made by settings.field)")
    return tuple(str(env) for env in names)


def source_of(model: type[Settings], name: str, overrides: dict[str, Override] | None = None) -> str | None:
    """Which flag or variable supplied field ``name`` (None: the default)."""
    if overrides and name in overrides:
        return overrides[name].source
    for env in _env_names(model, name):
        if os.environ.get(env, "") != "":
            return env
    return None


def sources(model: type[Settings], overrides: dict[str, Override] | None = None) -> dict[str, str]:
    """Each field of ``model`` that a flag or variable supplied -> which (for the plan's printout)."""
    return {name: source for name in model.model_fields if (source := source_of(model, name, overrides))}


def check_member(
    model: type[Settings],
    loaded: Settings,
    index: str,
    count: str,
    what: str,
    overrides: dict[str, Override] | None = None,
) -> None:
    """One pod's place among the job's (fields ``index`` below ``count``), else the one
    ConfigError line naming the variable or flag that set ``index``, expecting ``what`` in range."""
    size = getattr(loaded, count)
    if getattr(loaded, index) < size:
        return
    source = source_of(model, index, overrides) or _env_names(model, index)[0]
    expected = f"{what} from 0 to {size - 1} ({_env_names(model, count)[0]}={size})"
    raise ConfigError(source, raw_value(model, index, overrides), expected)


def load_member(
    model: type[Settings],
    overrides: dict[str, Override] | None,
    place: tuple[str, str, str],
    address: tuple[str, str],
) -> Any:
    """``model`` loaded for one member of a job of several (a pod's process or worker): ``place``
    is (index field, count field, what the index is), checked with :func:`check_member`;
    ``address`` is (the field of where the members meet, what to set), required with
    :func:`require_when_several`."""
    loaded = load(model, overrides)
    index, count, what = place
    check_member(model, loaded, index, count, what, overrides)
    require_when_several(model, loaded, address[0], count, address[1])
    return loaded


def require_when_several(model: type[Settings], loaded: Settings, name: str, count: str, expected: str) -> None:
    """Field ``name`` must be set when the job has more than one member (``count``), else the one
    ConfigError line: ``expected`` says what to set ("{when}" where the count's variable and value
    go)."""
    size = getattr(loaded, count)
    if size > 1 and getattr(loaded, name) is None:
        when = f"when {_env_names(model, count)[0]}={size}"
        raise ConfigError(_env_names(model, name)[0], None, expected.format(when=when))


def raw_value(model: type[Settings], name: str, overrides: dict[str, Override] | None = None) -> Any:
    if overrides and name in overrides:
        return overrides[name].value
    for env in _env_names(model, name):
        if os.environ.get(env, "") != "":
            return os.environ[env]
    return None


def load(model: type[Settings], overrides: dict[str, Override] | None = None) -> Any:
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
        secret = bool(_extra(model, field_name).get("secret")) if field_name in model.model_fields else False
        raise ConfigError(
            source, raw_value(model, field_name, overrides), message.removeprefix("Value error, "), secret=secret
        ) from None


def _field_for(model: type[Settings], loc: Any) -> str:
    for name in model.model_fields:
        if loc == name or loc in _env_names(model, name):
            return name
    return str(loc)


# Set by `trainer-launcher exec` for its command: a launcher nested in it (the SDK's `bash -lc`
# whose torchrun shim runs the launcher again) writes its outcome there.
HANDOFF = "TRAINER_LAUNCHER_HANDOFF"


def handoff_path() -> str | None:
    return os.environ.get(HANDOFF) or None


def environ() -> dict[str, str]:
    """A copy of the environment, for building a child's environment."""
    return dict(os.environ)
