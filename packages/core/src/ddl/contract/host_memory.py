"""What this machine can give a run without swapping: ``available_bytes()``, Linux's
``MemAvailable`` (free memory plus the page cache and the reclaimable slabs the kernel would
give back). One reader for every place that sizes work by host memory: ``ddl plan`` and
``ddl train --mesh auto`` on a CPU (a process's share), and strategies deciding whether a
whole-model copy fits beside the shards (FSDP's generation). Standard library only: the CLI
reads it without torch.
"""

from __future__ import annotations

MEMINFO = "/proc/meminfo"


def available_bytes(meminfo: str = MEMINFO) -> int:
    """``MemAvailable`` in bytes; 0 where it cannot be read (not Linux, a kernel without the
    field, an unreadable file): callers treat 0 as "unknown"."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
