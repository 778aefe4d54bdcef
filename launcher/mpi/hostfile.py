"""Parse the Trainer's hostfile (either format); render it for Open MPI or hydra. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.core.outcome import ConfigError

MAX_SLOTS = 4096
_OPENMPI_LINE = re.compile(r"^(?P<host>\S+)(?P<options>(?:\s+\S+)*)$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hostfile(text: str, source: str, default_slots: int | None = None) -> tuple[Host, ...]:
    """Hosts from ``host slots=N`` (Open MPI) or ``host:N`` (hydra) lines; ``#`` comments and blank
    lines are ignored, a host without a count gets ``default_slots`` (else 1)."""
    from launcher.core.settings import parse_host

    hosts: list[Host] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        name, slots = _parse_line(line, where, default_slots)
        try:
            parse_host(name)
        except ValueError:
            raise ConfigError(where, raw.strip(), "a host name or IP address, then slots=N or :N") from None
        if name.lower() in seen:
            raise ConfigError(where, raw.strip(), f"each host once ({name} is listed twice)")
        seen.add(name.lower())
        hosts.append(Host(name, slots))
    if not hosts:
        raise ConfigError(source, text.strip()[:80], "at least one 'HOST slots=N' line")
    return tuple(hosts)


def _parse_line(line: str, where: str, default_slots: int | None) -> tuple[str, int]:
    expected = f"'HOST slots=N' or 'HOST:N' with 1 <= N <= {MAX_SLOTS}"
    fields = line.split()
    head = fields[0]
    count: str | None = None
    if ":" in head and not head.startswith("[") and head.count(":") == 1:  # hydra host:N
        head, count = head.split(":")
        if len(fields) > 1:
            raise ConfigError(where, line, expected)
    else:
        for option in fields[1:]:
            key, eq, value = option.partition("=")
            if key in ("slots", "max_slots", "max-slots") and eq:
                if key == "slots":
                    count = value
            else:
                raise ConfigError(where, line, expected)
    if count is None:
        return head, default_slots or 1
    if not (count.isascii() and count.isdigit() and len(count) <= 5) or not 1 <= int(count) <= MAX_SLOTS:
        raise ConfigError(where, line, expected)
    return head, int(count)


def render(hosts: tuple[Host, ...], flavor: str) -> str:
    """``openmpi``: ``host slots=N``; ``hydra``: ``host:N`` (MPICH and Intel MPI)."""
    if flavor == "openmpi":
        return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)
    return "".join(f"{h.name}:{h.slots}\n" for h in hosts)


def uniform_slots(hosts: tuple[Host, ...]) -> int | None:
    counts = {h.slots for h in hosts}
    return counts.pop() if len(counts) == 1 else None
