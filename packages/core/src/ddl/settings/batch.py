"""The one global-batch rule: global batch = per-replica batch x data-parallel degree.

A replica is one copy of the model's data-parallel work: the ranks of its tensor- and
pipeline-parallel group share its batch (each computes on the same samples, or on the same
micro-batches in turn), so only ``dp`` (dp_replicate x dp_shard) multiplies it. ``ddl
train``'s pre-flight, ``ddl plan`` and ``--mesh auto`` all take the global batch from here
(tests/unit/test_batch_rule.py), so that a run's layout, however it was chosen, trains the
global batch the flags say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddl.contract.errors import UsageError

if TYPE_CHECKING:
    from ddl.settings.config import RunConfig


@dataclass(frozen=True)
class BatchSplit:
    """How the batch flags cut one optimizer step: ``micro`` samples per replica per
    forward pass, ``accumulation`` such passes per step (gradients summed, synchronised
    once), so ``per_replica`` = micro x accumulation and ``global_`` = per_replica x dp."""

    micro: int
    accumulation: int
    per_replica: int
    global_: int


def global_batch(given: int | None, per_replica: int, dp: int) -> int:
    """``--global-batch-size`` when given, else ``per_replica`` (``--batch-size``, else the
    preset's) times the ``dp`` data-parallel replicas."""
    return given or per_replica * dp


def planning_dp(world: int) -> int:
    """The data-parallel degree the global batch of ``ddl plan`` and ``--mesh auto`` is
    taken at: the layout an open ``--mesh`` gives (every process a replica). The search
    then keeps that global batch for every candidate, so they are compared on the same
    training problem, and a candidate with tp or pp > 1 gives each of its fewer replicas a
    larger share (:func:`resolve_batch`)."""
    return world


def resolve_batch(config: RunConfig, preset_batch: int, dp_size: int) -> BatchSplit:
    """The batch split for a data-parallel degree (torchtitan's rule: the global batch and
    the per-replica micro-batch together imply the accumulation steps)."""
    glob, micro = config.global_batch_size, config.batch_size
    if glob is None:
        micro = micro or preset_batch
        return BatchSplit(micro, 1, micro, global_batch(None, micro, dp_size))
    if micro is None:
        if glob % dp_size:
            raise UsageError(
                f"--global-batch-size: {glob} is not divisible by the {dp_size} "
                f"data-parallel replicas; use a multiple of {dp_size}")
        return BatchSplit(glob // dp_size, 1, glob // dp_size, glob)
    step = micro * dp_size
    if glob % step:
        raise UsageError(
            f"--global-batch-size: {glob} is not a multiple of --batch-size {micro} x "
            f"{dp_size} data-parallel replica(s) = {step}, so no whole number of "
            f"micro-steps makes it; allowed: multiples of {step}")
    return BatchSplit(micro, glob // step, glob // dp_size, glob)
