"""The strategy interface: how a model is spread over processes and how one step runs.

A strategy is its options and nothing else: what a call needs about the run - the
processes, the layout and its degrees, the workload, the settings that shape a step -
comes as an argument, a :class:`StrategyContext` the trainer makes once per run. What a
built parallelism must remember (a pipeline's schedule, Accelerate's accelerator) lives on
the wrapped model that :meth:`Strategy.wrap` returns. So a strategy keeps nothing between
calls, and one object could serve any number of runs.

The trainer calls, in order: :meth:`~Strategy.resolve_layout` and :meth:`~Strategy.check`
(before anything is built; the CLI's pre-flight runs them too, and
:meth:`~Strategy.check_model` on a meta-device model), :meth:`~Strategy.wrap`, then per
optimizer step :meth:`~Strategy.forward_backward` and :meth:`~Strategy.clip_gradients`
(the trainer owns the step around them: ddl.worker.train.step), :meth:`~Strategy.eval_step` for
evaluation and :meth:`~Strategy.full_state_dict` to export the trained weights. The
strategies ddl ships are one recipe, ``ddl_strategies.compose``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddl.contract.layout import ParallelLayout, resolve

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ddl.contract.workload import Workload
    from ddl.contract.world import World
    from ddl.worker.train.precision import Precision


@dataclass(frozen=True)
class StrategyContext:
    """What every strategy call may need about its run, made once by the trainer
    (``ddl.worker.train.setup.build``) and passed as an argument."""

    world: World
    layout: ParallelLayout  # the degrees (Strategy.resolve_layout of --mesh)
    workload: Workload
    microbatches: int | None = None  # --microbatches as given (pipelines)
    clip_grad_norm: float | None = None  # --clip-grad-norm
    precision: str = "fp32"  # the run's: fp32, bf16 or fp16 (auto decided by the run plan)
    #: The run's DeviceMesh (ddl.worker.process.mesh.build, the one builder): the layout's
    #: four named dimensions, built once by the worker. None before workers start (the
    #: pre-flight); a strategy that splits the model needs it in ``wrap``.
    mesh: Any = None
    #: Its data-parallel ranks as one dimension (``dp``: dp_replicate x dp_shard flattened).
    dp_mesh: Any = None
    #: Set when the worker built the model on the meta device (only for a strategy whose
    #: :meth:`Strategy.builds_on_meta` said yes): ``wrap`` calls it on each module this
    #: rank keeps, after sharding or splitting it and before anything reads its values.
    #: It allocates the module on the device and fills it with the values one process
    #: would have (ddl.worker.build.materialize). None: the model arrives built and on the CPU.
    materialize: Any = None


class Strategy(ABC):
    name: str = ""
    #: Options a user may pass as ``--strategy-option KEY=VALUE``: name -> description.
    options_help: dict[str, str] = {}
    #: Dimension names this strategy reads from ``--mesh`` (ddl.contract.layout.DIMS, and
    #: ``dp``: shorthand for ``dp_means``).
    mesh_dims: frozenset[str] = frozenset()
    #: How the run's ParallelLayout follows from ``--mesh`` and the world size (one rule for
    #: all strategies: ddl.contract.layout.resolve). The first open dimension of
    #: ``layout_fill`` takes the processes the others leave; ``layout_defaults`` fill the
    #: rest; ``layout_minimum`` are degrees the strategy cannot run below.
    dp_means: str = "dp_replicate"
    layout_fill: tuple[str, ...] = ("dp_replicate",)
    layout_defaults: dict[str, int] = {}
    layout_minimum: dict[str, int] = {}
    #: Whether ``--microbatches`` means something to this strategy.
    uses_microbatches: bool = False

    def __init__(self, options: dict[str, str] | None = None) -> None:
        from ddl.contract.errors import UsageError

        self.options = dict(options or {})
        unknown = sorted(set(self.options) - set(self.options_help))
        if unknown:
            allowed = ", ".join(sorted(self.options_help)) or "none"
            raise UsageError(f"--strategy-option: {self.name} has no option {unknown[0]!r}; "
                             f"allowed: {allowed}")

    def option_number(self, name: str, default: float, *, above: float | None = None) -> float:
        """The option as a finite number (``default`` when unset), greater than ``above``
        if given; else UsageError."""
        import math

        from ddl.contract.errors import UsageError

        value = self.options.get(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--strategy-option: {name}={value!r} is not a number") from None
        if not math.isfinite(number) or (above is not None and number <= above):
            raise UsageError(f"--strategy-option: {name}={value!r}; allowed: a number "
                             + (f"above {above:g}" if above is not None else "(finite)"))
        return number

    def option_flag(self, name: str, default: bool) -> bool:
        from ddl.contract.errors import UsageError

        value = self.options.get(name)
        if value is None:
            return default
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"--strategy-option: {name}={value!r}; allowed: true, false")

    def resolve_layout(self, mesh: dict[str, int], world_size: int) -> ParallelLayout:
        """The degrees this strategy runs ``--mesh`` with on ``world_size`` processes; a
        dimension it does not use, or degrees that do not fit the world, are refused."""
        return resolve(mesh, world_size, strategy=self.name, allowed=self.mesh_dims,
                       dp_means=self.dp_means, fill=self.layout_fill,
                       defaults=self.layout_defaults, minimum=self.layout_minimum)

    def check(self, run: StrategyContext) -> None:
        """Raise :class:`ddl.contract.errors.UsageError` naming what is supported if this
        strategy cannot run ``run.workload`` on this layout. The default refuses
        microbatches the strategy would silently ignore."""
        from ddl.contract.errors import UsageError

        if run.microbatches and not self.uses_microbatches:
            raise UsageError(f"--microbatches: {self.name} does not split batches into "
                             "microbatches; it is for pipeline strategies (pp)")

    def check_layout(self, run: StrategyContext, batch: Any) -> None:
        """Check the resolved batch layout (``batch.batch_per_replica``: e.g. microbatches
        dividing it)."""

    def check_model(self, model: nn.Module, run: StrategyContext) -> None:
        """Raise UsageError if the layout does not fit ``model`` (built on the meta device:
        shapes only), before any worker starts: e.g. heads that tensor parallel must
        divide. Default: nothing to check."""

    def report(self, model: nn.Module, run: StrategyContext) -> dict[str, Any]:
        """Strategy-specific measurements for results.json (a collective: all ranks call
        it; return the same dict everywhere)."""
        return {}

    @abstractmethod
    def wrap(self, model: nn.Module, run: StrategyContext) -> nn.Module:
        """Place ``model`` on ``run.world.device`` and parallelise it; what the parallelism
        must remember between steps belongs on the returned module."""

    def builds_on_meta(self, run: StrategyContext) -> bool:
        """Whether ``wrap`` takes a model built on the meta device (no memory, no values)
        and calls ``run.materialize`` on what this rank keeps: a rank then never holds
        the whole model. Default False: ``wrap`` gets the model built on the CPU."""
        return False

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module
                          ) -> torch.optim.Optimizer:
        """Called once the optimizer exists (built on the wrapped model's parameters)."""
        return optimizer

    def forward_backward(self, model: nn.Module, batches: list[tuple[Any, Any]],
                         run: StrategyContext, precision: Precision) -> tuple[Any, list[Any]]:
        """Forward and backward over an optimizer step's micro-batches (one, or several
        with gradient accumulation), leaving in the parameters' ``.grad`` the gradients of
        their mean loss, synchronised over the replicas. The trainer owns the rest of the
        step (ddl.worker.train.step: zero_grad before, clipping, the optimizer and the
        learning-rate schedule after); a strategy never calls the optimizer. Returns
        (detached mean loss, outputs per micro-batch: None where a rank computes none).

        Default: each micro-batch's loss divided by their number, so the summed gradients
        are those of their mean loss; replicas synchronise on the last one only
        (:func:`gradient_sync`). A pipeline runs its schedule instead."""
        import torch

        losses, outputs = [], []
        for i, (inputs, targets) in enumerate(batches):
            with gradient_sync(model, i == len(batches) - 1):
                with precision.autocast():
                    out = run.workload.forward(model, inputs)
                    loss = run.workload.loss(out, targets)
                precision.backward(loss / len(batches) if len(batches) > 1 else loss)
            losses.append(loss.detach())
            outputs.append(out)
        return (losses[0] if len(losses) == 1 else torch.stack(losses).mean()), outputs

    def check_accumulation(self, run: StrategyContext, steps: int) -> None:
        """Raise UsageError if this strategy cannot accumulate gradients over ``steps``
        micro-batches per optimizer step (the batch flags asked for it). The default
        :meth:`forward_backward` can, on plain, DDP and FSDP2 models."""

    def train_steps(self, model: nn.Module, batches: list[tuple[Any, Any]],
                    run: StrategyContext, optimizer: torch.optim.Optimizer,
                    precision: Precision) -> tuple[Any, list[Any], Any]:
        """Deprecated (goes in contract 2.1): one whole optimizer step, as the trainer now
        runs it itself (ddl.worker.train.step). Override :meth:`forward_backward` (and
        :meth:`clip_gradients`) instead; a strategy that still overrides this method (or
        :meth:`train_step`) is called the old way, with a warning. Returns (mean loss,
        outputs per micro-batch, the gradient norm before clipping or None)."""
        optimizer.zero_grad(set_to_none=True)
        loss, outputs = self.forward_backward(model, batches, run, precision)
        norm = self.clip_gradients(model, run, optimizer, precision)
        precision.step(optimizer)
        return loss, outputs, norm

    def train_step(self, model: nn.Module, batch: tuple[Any, Any], run: StrategyContext,
                   optimizer: torch.optim.Optimizer, precision: Precision
                   ) -> tuple[Any, ...]:
        """Deprecated (goes in contract 2.1), as :meth:`train_steps`, for one batch:
        (detached mean loss, outputs, the gradient norm before clipping or None)."""
        loss, outputs, norm = self.train_steps(model, [batch], run, optimizer, precision)
        return loss, outputs[0], norm

    def clip_gradients(self, model: nn.Module, run: StrategyContext,
                       optimizer: torch.optim.Optimizer, precision: Precision) -> Any:
        """``--clip-grad-norm``: scale the gradients to a global 2-norm of at most that
        (ddl.contract.grad_norm; DTensor shards and replicas counted as one model);
        returns the norm before clipping, or None when not clipping."""
        if not run.clip_grad_norm:
            return None
        from ddl.contract.grad_norm import clip_grad_norm

        precision.unscale(optimizer)
        return clip_grad_norm(model.parameters(), run.clip_grad_norm)

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module to run evaluation forwards on."""
        return model

    def generation_model(self, model: nn.Module, run: StrategyContext) -> nn.Module | None:
        """A whole model that every rank holds as plain tensors, for loops a workload runs
        itself after training (e.g. ``generate()``, which bypasses a wrapper's forward), so
        that ranks may feed it different inputs. ``model`` is what :meth:`eval_model`
        returned. None where the parameters stay distributed (tensor parallel): then every
        rank must run ``model`` itself on the same inputs, as collectives run inside each
        forward. All ranks call it (a strategy may gather; a collective). Default: the
        model itself, which suits strategies whose ranks hold full replicas."""
        return model

    def eval_step(self, model: nn.Module, inputs: Any, targets: Any, run: StrategyContext,
                  precision: Precision) -> Any:
        """Outputs for one evaluation batch, or None on ranks that produce none (all ranks
        call it with the same batch shape)."""
        with precision.autocast():
            return run.workload.forward(self.eval_model(model), inputs)

    def checkpoint_name(self, fqn: str, run: StrategyContext) -> str:
        """A parameter's name in checkpoints, given its name in the wrapped model. The
        default suits strategies whose state dicts already use the unwrapped model's names
        (torch's get_state_dict strips DDP/FSDP prefixes)."""
        return fqn

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                         run: StrategyContext) -> dict[str, Any]:
        """Model and optimizer state for ``torch.distributed.checkpoint``, keyed by the
        unwrapped model's parameter names so that any strategy and world size can load it.
        Each rank holds only its own shards (DTensors under FSDP/TP)."""
        return self._named_state(model, optimizer, run)[0]

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any], run: StrategyContext) -> None:
        """Put a state filled by ``torch.distributed.checkpoint`` (from
        :meth:`checkpoint_state`) back into the run."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        from ddl.contract.state_names import restore_names

        if not state["model"]:  # nothing held here (see _named_state)
            return
        original = restore_names(state, self._named_state(model, optimizer, run)[1])
        set_state_dict(model, optimizer, model_state_dict=original["model"],
                       optim_state_dict=original["optim"],
                       options=StateDictOptions(flatten_optimizer_state_dict=True))

    def _named_state(self, model, optimizer, run) -> tuple[dict[str, Any], dict[str, Any]]:
        """(state under checkpoint names, the way back to the model's own names)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from ddl.contract.state_names import rename_state

        if not model.state_dict():  # a pipeline rank holding only parameter-free stages
            return {"model": {}, "optim": {}}, {}  # (torch's get_state_dict refuses those)
        model_state, optim_state = get_state_dict(
            model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
        return rename_state({"model": model_state, "optim": optim_state},
                            lambda fqn: self.checkpoint_name(fqn, run))

    @abstractmethod
    def full_state_dict(self, model: nn.Module, run: StrategyContext
                        ) -> dict[str, torch.Tensor]:
        """The complete, unwrapped weights (plain tensors; valid on rank 0 at least)."""


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Backward passes inside this block synchronise gradients over the replicas only if
    ``enabled``: DDP's ``no_sync`` and FSDP2's ``set_requires_gradient_sync`` (every
    FSDP-wrapped unit, HSDP included) skip the all-reduce / reduce-scatter and keep local
    gradients that the next synchronised backward adds in. Other models (one process,
    tensor parallel alone) have no separate gradient synchronisation to skip."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    if enabled:
        yield
        return
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_requires_gradient_sync(True, recurse=False)
