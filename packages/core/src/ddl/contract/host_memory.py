"""What this machine can give a run without swapping: ``available_bytes()``, Linux's
``MemAvailable`` (free memory plus the page cache and the reclaimable slabs the kernel would
give back). One reader for every place that sizes work by host memory: ``ddl plan`` and
``ddl train --mesh auto`` on a CPU (a process's share), and strategies deciding whether a
whole-model copy fits beside the shards (FSDP's generation). Also this process's own
resident set and high-water mark (``process_bytes``): the plan's runtime baseline and the
build's memory meter read them here. Standard library only: the CLI reads it without torch.
"""

from __future__ import annotations

MEMINFO = "/proc/meminfo"
STATUS = "/proc/self/status"


def _kib_field(path: str, field: str) -> int | None:
    """``field`` of a /proc file that lists ``Name:  N kB`` lines, in bytes; None where it
    cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_bytes(field: str, status: str = STATUS) -> int | None:
    """This process's ``VmRSS`` (resident now) or ``VmHWM`` (its high-water mark) in bytes,
    from /proc/self/status; None where it cannot be read (not Linux)."""
    return _kib_field(status, field)


def available_bytes(meminfo: str = MEMINFO) -> int:
    """``MemAvailable`` in bytes; 0 where it cannot be read (not Linux, a kernel without the
    field, an unreadable file): callers treat 0 as "unknown"."""
    return _kib_field(meminfo, "MemAvailable") or 0
