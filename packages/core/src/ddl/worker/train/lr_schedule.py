"""The learning-rate schedule: a multiplier of the run's learning rate for each optimizer step.

    factor(step) = warm-up(step) x shape(step)

Warm-up (``--warmup-steps N`` or ``--warmup-epochs E``): linear over the first N steps,
starting from the unscaled learning rate when linear scaling is on (Goyal et al. 2017,
sec. 2.2), else from 0. Shape (``--lr-schedule``), with t the progress after warm-up, 0 at
its end and 1 at the run's last step:

    workload  the workload's own factor, the default: ``Workload.lr_step_factor(step)``,
              which by default is ``Workload.lr_factor(epoch)`` (the course's schedule,
              e.g. a step decay)
    constant  1
    cosine    0.5 (1 + cos(pi t)), to 0 at the end (Loshchilov & Hutter, SGDR, 2017)
    linear    1 - t, to 0 at the end
    step      1, then 0.1 from half of the steps after warm-up, 0.01 from three quarters

The total number of steps is epochs x steps per epoch, known before the first step, so a
resumed run continues the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable

SHAPES = ("workload", "constant", "cosine", "linear", "step")


def make(shape: str, *, total_steps: int, steps_per_epoch: int, warmup_steps: int,
         warmup_start: float, epoch_factor: Callable[[int], float] | None = None,
         step_factor: Callable[[int], float] | None = None) -> Callable[[int], float]:
    """``factor(step)`` for steps 0 .. total_steps - 1; the ``workload`` shape follows
    ``step_factor(step)``, else ``epoch_factor(epoch)``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown schedule {shape!r}")
    if step_factor is None:
        step_factor = (lambda step: epoch_factor(step // steps_per_epoch)) if epoch_factor \
            else (lambda step: 1.0)
    start = warmup_start
    if warmup_steps and start == 1.0:  # nothing to warm up from: start one step in
        start = 1.0 / warmup_steps
    decay_steps = max(total_steps - warmup_steps - 1, 1)

    def progress(step: int) -> float:
        return min(max(step - warmup_steps, 0) / decay_steps, 1.0)

    def factor(step: int) -> float:
        warm = 1.0
        if step < warmup_steps:
            warm = start + (1.0 - start) * step / warmup_steps
        if shape == "workload":
            return warm * step_factor(step)
        t = progress(step)
        if shape == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * t))
        if shape == "linear":
            return warm * (1.0 - t)
        if shape == "step":
            return warm * (0.01 if t >= 0.75 else 0.1 if t >= 0.5 else 1.0)
        return warm

    return factor
