"""What a workload may know about the run it is part of.

The trainer sets ``workload.context`` (a :class:`RunContext`) before it calls
``datasets()``, and again, complete, before ``build_model()`` and ``optimizer()``: the
data directory, who this process is (``world``), the parallel layout, the epochs and the
batch, and - once the training split is known - the steps per epoch and in total, for
per-step schedules. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddl.contract.layout import ParallelLayout
from ddl.contract.world import World


@dataclass(frozen=True)
class RunContext:
    data_dir: Path
    world: World
    parallel: ParallelLayout
    epochs: int
    global_batch: int
    batch_per_replica: int  # samples per replica per optimizer step
    steps_per_epoch: int | None = None  # None while datasets() runs
    total_steps: int | None = None  # epochs x steps_per_epoch; None while datasets() runs
    micro_batch: int | None = None  # per replica per forward pass (None: batch_per_replica)
    accumulation: int = 1  # forward/backward passes per optimizer step
