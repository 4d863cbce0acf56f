"""What a workload may know about the run it is part of.

The trainer sets ``workload.context`` (a :class:`RunContext`) before it calls
``datasets()``, and again, complete, before ``build_model()`` and ``optimizer()``: the
data directory, who this process is (``world``), the parallel layout (``layout``), the
epochs and the batch, and - once the training split is known - the steps per epoch and in
total, for per-step schedules. Torch-free.

``parallel``, the former name of ``layout``, still reads and constructs, deprecated.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddl.contract.deprecation import warn
from ddl.contract.layout import ParallelLayout
from ddl.contract.world import World


@dataclass(frozen=True)
class RunContext:
    data_dir: Path
    world: World
    layout: ParallelLayout  # the run's parallel layout: degrees, where each rank sits
    epochs: int
    global_batch: int
    batch_per_replica: int  # samples per replica per optimizer step
    steps_per_epoch: int | None = None  # None while datasets() runs
    total_steps: int | None = None  # epochs x steps_per_epoch; None while datasets() runs
    micro_batch: int | None = None  # per replica per forward pass (None: batch_per_replica)
    accumulation: int = 1  # forward/backward passes per optimizer step

    @property
    def parallel(self) -> ParallelLayout:
        """Deprecated (goes in contract 2.1): the same ParallelLayout as ``layout``."""
        warn("RunContext.parallel", "read RunContext.layout (the same ParallelLayout)")
        return self.layout


_fields_init = RunContext.__init__


# the dataclass's own __init__, with the deprecated ``parallel=`` taken as ``layout=``
@functools.wraps(_fields_init)
def _init(self: RunContext, *args: Any, **kwargs: Any) -> None:
    if "parallel" in kwargs:
        warn("RunContext(parallel=...)", "pass layout= (the same ParallelLayout)")
        kwargs["layout"] = kwargs.pop("parallel")
    _fields_init(self, *args, **kwargs)


RunContext.__init__ = _init  # type: ignore[method-assign]
