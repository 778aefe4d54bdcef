"""The node's RDMA ports (InfiniBand, RoCE) from sysfs: ``<root>/<device>/ports/<n>/`` holds
``state`` ("4: ACTIVE"), ``phys_state`` ("5: LinkUp"), ``rate`` ("400 Gb/sec (4X NDR)") and
``link_layer`` ("InfiniBand" or "Ethernet"). Never raises: a missing tree is a scan with no
ports and the reason."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = "/sys/class/infiniband"


@dataclass(frozen=True)
class Port:
    device: str  # "mlx5_0"
    port: str  # "1"
    state: str | None  # "ACTIVE", "DOWN", "INIT", "ARMED"; None when unreadable
    phys_state: str | None  # "LinkUp", "Polling", "Disabled", ...
    rate: str | None  # "400 Gb/sec (4X NDR)"
    link_layer: str | None

    @property
    def name(self) -> str:
        return f"{self.device} port {self.port}"

    @property
    def up(self) -> bool:
        # A port is usable once the subnet manager made it ACTIVE over a trained link.
        return self.state == "ACTIVE" and self.phys_state in (None, "LinkUp")

    @property
    def gbps(self) -> float | None:
        match = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", self.rate or "")
        return float(match.group(1)) if match else None


@dataclass
class PortScan:
    ports: list[Port] = field(default_factory=list)
    reason: str = ""  # why there are none


def _value(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _named(text: str | None) -> str | None:
    """ "4: ACTIVE" -> "ACTIVE" (the kernel prefixes the spec's number)."""
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def read_ports(root: str | Path = ROOT) -> PortScan:
    """Every port of every RDMA device under ``root``."""
    base = Path(root)
    try:
        devices = sorted(p for p in base.iterdir())
    except FileNotFoundError:
        return PortScan(reason=f"no RDMA devices ({base} absent)")
    except OSError as error:
        return PortScan(reason=f"{base}: {error.strerror or error}")
    ports = []
    for device in devices:
        try:
            numbers = sorted((device / "ports").iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            continue
        for number in numbers:
            ports.append(
                Port(
                    device.name,
                    number.name,
                    _named(_value(number / "state")),
                    _named(_value(number / "phys_state")),
                    _value(number / "rate"),
                    _value(number / "link_layer"),
                )
            )
    if not ports:
        return PortScan(reason=f"no RDMA ports under {base}")
    return PortScan(ports)
