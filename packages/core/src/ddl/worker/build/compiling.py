"""``--compile``: torch.compile per block unit (regional compilation, as torchtitan does).

Each unit the workload names (``Workload.fsdp_units``) is compiled in place with
``nn.Module.compile`` before the strategy wraps the model: names and state dicts stay as
built, compilation happens lazily at a unit's first call (so after tensor parallel and
FSDP2 have placed its parameters), and the many identical blocks of a transformer share one
compiled graph instead of one whole-model graph. Inductor needs a C++ compiler on CPUs and
Triton on GPUs; a missing one is refused before any worker starts.

Compile time is reported apart from step time (results.json ``compile``): the seconds torch
spent compiling, from its own compilation metrics, and the first optimizer step's wall time,
which contains it.
"""

from __future__ import annotations

import os
import shutil

from torch import nn

from ddl.contract.errors import UsageError

CPU_COMPILERS = ("g++", "c++", "clang++")


def check_toolchain(device_type: str) -> None:
    """Refuse ``--compile`` where inductor cannot build kernels."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise UsageError("--compile: torch.compile needs Triton on GPUs and it is not "
                             "installed in this environment; allowed: leave out --compile")
        return
    cxx = os.environ.get("CXX")
    if not (cxx and shutil.which(cxx)) and not any(shutil.which(c) for c in CPU_COMPILERS):
        raise UsageError("--compile: torch.compile needs a C++ compiler on CPUs (g++, c++ or "
                         "clang++, or $CXX) and none is on PATH; allowed: install one, or "
                         "leave out --compile")


def apply(units: list[nn.Module]) -> int:
    """Compile each unit in place; returns how many."""
    for unit in units:
        unit.compile()
    return len(units)


def compile_seconds() -> float | None:
    """Seconds torch.compile spent so far in this process (dynamo and inductor, forward
    and backward graphs), from torch's compilation metrics; None where torch lacks them."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # pragma: no cover - an internal name, kept out of the way
        return None
    # each phase's durations by function name; the outermost entry holds the others
    totals = {name: sum(times) for name, times in compilation_time_metrics.items()}
    outer = [v for k, v in totals.items() if k.endswith("compile_inner")]
    bw = [v for k, v in totals.items() if "bw_compiler" in k]
    return (sum(outer) + sum(bw)) if outer else None
