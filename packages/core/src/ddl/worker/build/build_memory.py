"""How much memory building the model cost this rank: ``memory_per_rank[].build_peak_bytes``.

Measured around the build (the workload's ``build_model``, pretrained weights read, the
block options, the strategy's wrap: sharding, splitting, moving to the device), as the
peak above what the process held when the build began:

- on a GPU from torch's allocator (its peak counter is reset at the start);
- on a CPU from the kernel's high-water mark of the resident set: Linux resets it when
  ``5`` is written to ``/proc/self/clear_refs`` (proc(5)), so the mark read afterwards is
  the build's own peak, exactly, not a sample. Elsewhere (no such file) the value is null.

The resident set when the build begins is kept too (:func:`baseline_rss`): the process's
own baseline, which ``ddl plan --verify`` subtracts from the peak on a CPU.

The reset also lowers what ``getrusage`` reports as the process's peak, so the peak seen
before the build is kept here and :func:`process_peak` adds it back (results.json's
``peak_rss_bytes`` stays the peak of the whole process).
"""

from __future__ import annotations

import resource
import sys
from contextlib import contextmanager
from typing import Iterator

import torch

from ddl.contract.host_memory import process_bytes

_before_reset: list[int] = [0]  # the process's peak RSS before the build's reset (bytes)
_baseline: list[int | None] = [None]  # the resident set when the build began (bytes)


def _rusage_peak() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss if sys.platform == "darwin" else rss * 1024


def baseline_rss() -> int | None:
    """The process's resident set when the model's build began (CPU runs on Linux; else
    None): Python, torch, ddl and the plugins imported, the process group and mesh up and
    the data sets read - what the process holds before any model tensor.
    ``memory_per_rank[].baseline_rss_bytes``; ``peak_rss_bytes`` minus it is what
    training added (``ddl plan --verify`` compares that with the plan's peak above the
    runtime baseline)."""
    return _baseline[0]


def process_peak() -> int:
    """The process's peak resident set since it started, the build's reset undone."""
    return max(_rusage_peak(), _before_reset[0])


class BuildPeak:
    """``with measure(device) as peak:`` then ``peak.bytes`` (None where unmeasurable)."""

    bytes: int | None = None


@contextmanager
def measure(device: torch.device) -> Iterator[BuildPeak]:
    peak = BuildPeak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield peak
        peak.bytes = torch.cuda.max_memory_allocated(device) - start
        return
    _before_reset[0] = max(_before_reset[0], _rusage_peak())
    start = process_bytes("VmRSS")
    if _baseline[0] is None:
        _baseline[0] = start
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        start = None
    yield peak
    high = process_bytes("VmHWM")
    if start is not None and high is not None:
        peak.bytes = max(high - start, 0)
