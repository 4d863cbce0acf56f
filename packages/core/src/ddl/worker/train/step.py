"""One optimizer step, top to bottom: the trainer owns it, the strategy supplies forward
and backward.

    zero the gradients
    -> forward and backward of every micro-batch   (Strategy.forward_backward: plain,
                                                    DDP, FSDP, tensor parallel, or a
                                                    pipeline running its schedule)
    -> clip the gradients over the whole model     (Strategy.clip_gradients, --clip-grad-norm)
    -> the optimizer step                          (ddl.worker.train.precision: fp16's scaler)
    -> the learning-rate schedule's step

torchtitan's ``train_step`` reads the same way. A strategy written for ddl contract 2.0 and
before, which overrides ``train_step``/``train_steps`` to run the whole step itself, is
still called that way, once warned (ddl.contract.deprecation).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from ddl.contract.strategy import Strategy

if TYPE_CHECKING:
    from ddl.worker.train.setup import TrainingRun


def optimizer_step(run: TrainingRun, micro: list[tuple[Any, Any]]) -> tuple[Any, list[Any], Any]:
    """One optimizer step over ``micro`` (its micro-batches, on the device): returns (the
    detached mean loss, outputs per micro-batch, the gradient norm before clipping or
    None when not clipping)."""
    strategy, model, context = run.strategy, run.model, run.context
    optimizer, precision = run.optimizer, run.precision
    if _whole_step_class(type(strategy)):
        loss, outputs, norm = _whole_step_by_strategy(run, micro)
    else:
        optimizer.zero_grad(set_to_none=True)
        loss, outputs = strategy.forward_backward(model, micro, context, precision)
        norm = strategy.clip_gradients(model, context, optimizer, precision)
        precision.step(optimizer)
    run.scheduler.step()
    return loss, outputs, norm


def runs_whole_step(strategy: Any) -> bool:
    """Whether ``strategy`` still overrides the deprecated ``train_step``/``train_steps``
    (contract 2.0 and before) to run the whole step itself. ddl's own strategies do not."""
    return _whole_step_class(type(strategy))


@cache  # asked every step: answered once per strategy class, not per step
def _whole_step_class(cls: type) -> bool:
    return cls.train_step is not Strategy.train_step \
        or cls.train_steps is not Strategy.train_steps


_warned: set[type] = set()


def _whole_step_by_strategy(run: TrainingRun, micro: list) -> tuple[Any, list[Any], Any]:
    """Contract 2.0's way: the strategy's own ``train_step`` (one micro-batch) or
    ``train_steps`` (several) runs zero_grad to the optimizer step."""
    strategy = run.strategy
    if type(strategy) not in _warned:
        from ddl.contract.deprecation import warn

        _warned.add(type(strategy))
        warn(f"{type(strategy).__name__}.train_step/train_steps (a strategy running the "
             "whole optimizer step)", "override forward_backward (and clip_gradients) "
             "instead: the trainer runs zero_grad, clipping, the optimizer and the lr "
             "schedule (docs/plugin-authors.md)", stacklevel=2)
    if len(micro) > 1:
        return strategy.train_steps(run.model, micro, run.context, run.optimizer,
                                    run.precision)
    loss, outputs, *clipped = strategy.train_step(run.model, micro[0], run.context,
                                                  run.optimizer, run.precision)
    return loss, [outputs], clipped[0] if clipped else None
