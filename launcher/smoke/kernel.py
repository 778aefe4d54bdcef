"""GPU XID errors from the kernel log over a recent window: ``/dev/kmsg`` (records carry the
microseconds since boot they were logged at), else ``dmesg`` (``[seconds since boot] text``).
Never raises: an unreadable log gives an :class:`XidLog` with no events and the reason.

The NVIDIA driver logs an XID as ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text``
(older drivers omit pid and name). Which XIDs mean broken hardware follows NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog"): those whose
immediate action is a GPU reset, a node reboot or a support case fail the node; those the
catalog attributes to the application (restart the app) only warn, because they follow a buggy
job from node to node.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.smoke.nvidia import run_bounded

KMSG = "/dev/kmsg"
DMESG = ("dmesg",)
# The kernel's ring buffer is at most a few MiB; stop there even if a flood keeps it busy.
MAX_BYTES = 32 << 20

# Hardware: the catalog's immediate action is RESET_GPU, RESTART_BM (reboot) or CONTACT_SUPPORT.
FAIL_XIDS = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed",
}
# Usually the application (the catalog's RESTART_APP), or already handled by the driver.
WARN_XIDS = {
    8: "GPU stopped processing",
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    61: "internal micro-controller breakpoint/warning",
    63: "ECC page retirement or row remapping recording event",
    68: "video processor exception",
    69: "graphics engine class error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    109: "context switch timeout",
    121: "C2C link corrected error",
}

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)(?:,\s*(.*))?")
_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?(.*)$")
_PID_NAME = re.compile(r"^(?:pid=[^,]*,\s*|name=[^,]*,\s*)+")


@dataclass(frozen=True)
class Xid:
    pci: str  # as the driver logged it: "0000:3b:00"
    xid: int
    text: str  # the driver's words, without pid and process name
    age_s: float | None  # how long ago; None when the log carried no timestamp

    @property
    def severity(self) -> str:
        return "fail" if self.xid in FAIL_XIDS else "warn"

    @property
    def meaning(self) -> str:
        return FAIL_XIDS.get(self.xid) or WARN_XIDS.get(self.xid) or "see NVIDIA's Xid catalog"


@dataclass
class XidLog:
    events: list[Xid] = field(default_factory=list)
    reason: str = ""  # why the log could not be read; "" when it was
    source: str = ""  # where the events came from
    window_s: float = 0.0

    @property
    def readable(self) -> bool:
        return not self.reason


def parse_xid(message: str, age_s: float | None) -> Xid | None:
    match = _XID.search(message)
    if not match:
        return None
    text = _PID_NAME.sub("", (match.group(3) or "").strip()).rstrip(".").strip()
    return Xid(match.group(1).lower(), int(match.group(2)), text, age_s)


def parse_kmsg(text: str, now_s: float, window_s: float) -> list[Xid]:
    """XIDs in /dev/kmsg records ("prio,seq,usec,flags;message", continuation lines start with
    a space) logged within ``window_s`` of ``now_s`` (seconds since boot). Only the kernel's own
    records count (facility 0): anyone allowed to write /dev/kmsg could forge a user one."""
    found = []
    for line in text.splitlines():
        match = _KMSG.match(line)
        if not match or int(match.group(1)) >> 3 != 0:
            continue
        age = now_s - int(match.group(3)) / 1e6
        if age > window_s:
            continue
        xid = parse_xid(match.group(4), max(age, 0.0))
        if xid:
            found.append(xid)
    return found


def parse_dmesg(text: str, now_s: float, window_s: float) -> list[Xid]:
    """XIDs in ``dmesg`` lines ("[ seconds] message") within ``window_s`` of ``now_s``. A line
    without a timestamp (printk.time=0) counts: nothing says it is old."""
    found = []
    for line in text.splitlines():
        match = _DMESG.match(line)
        if match:
            seen = max(now_s - float(match.group(1)), 0.0)
            if seen > window_s:
                continue
            age: float | None = seen
            message = match.group(2)
        else:
            age, message = None, line
        xid = parse_xid(message, age)
        if xid:
            found.append(xid)
    return found


def _read_kmsg(path: str) -> str:
    """Every record /dev/kmsg holds now. Non-blocking: it answers EAGAIN once caught up, where
    a blocking read would wait for the next message; EPIPE means records were overwritten
    while reading, and the next read goes on from the oldest left. A plain file (a fixture)
    reads to its end."""
    chunks, total = [], 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while total < MAX_BYTES:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _uptime() -> float:
    # printk stamps records with the clock CLOCK_MONOTONIC follows (both stop in suspend).
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def read_xids(
    window_s: float, kmsg: str = KMSG, dmesg: Sequence[str] = DMESG, now_s: float | None = None, timeout: float = 10.0
) -> XidLog:
    """The XIDs logged in the last ``window_s`` seconds; the reason when no log was readable."""
    now = _uptime() if now_s is None else now_s
    try:
        events = parse_kmsg(_read_kmsg(kmsg), now, window_s)
        return XidLog(events, "", kmsg, window_s)
    except OSError as error:
        kmsg_error = f"{kmsg}: {error.strerror or error}"
    code, stdout, said = run_bounded(dmesg, timeout)
    if code == 0:
        return XidLog(parse_dmesg(stdout, now, window_s), "", " ".join(dmesg), window_s)
    dmesg_error = (
        said if code is None else f"{' '.join(dmesg)} exited {code}" + (f": {said.splitlines()[0]}" if said else "")
    )
    return XidLog([], f"kernel log not readable ({kmsg_error}; {dmesg_error})", "", window_s)
