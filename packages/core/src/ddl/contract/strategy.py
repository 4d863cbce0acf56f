"""The strategy interface: how a model is spread over processes and how one step runs.

Each strategy lives in one readable module of a strategy plugin (``ddl_strategies.ddp``
for DistributedDataParallel). The trainer calls, in order: :meth:`check` (before anything
is built), :meth:`wrap`, then :meth:`train_step` per batch, :meth:`eval_model` for
evaluation and :meth:`full_state_dict` to export the trained weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from ddl.contract.layout import ParallelLayout, resolve

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ddl.contract.workload import Workload
    from ddl.contract.world import World
    from ddl.worker.precision import Precision


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
    #: This run's layout, set by the trainer (``resolve_layout``) before :meth:`check`.
    parallel: ParallelLayout = ParallelLayout()
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

    def option_number(self, name: str, default: float) -> float:
        from ddl.contract.errors import UsageError

        value = self.options.get(name)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"--strategy-option: {name}={value!r} is not a number") from None

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

    def configure(self, config: Any) -> None:
        """Receive the run configuration (``--mesh``, ``--microbatches``) before check(),
        refusing microbatches this strategy would silently ignore."""
        from ddl.contract.errors import UsageError

        self.config = config
        if getattr(config, "microbatches", None) and not self.uses_microbatches:
            raise UsageError(f"--microbatches: {self.name} does not split batches into "
                             "microbatches; it is for pipeline strategies (pp)")

    def resolve_layout(self, mesh: dict[str, int], world_size: int) -> ParallelLayout:
        """The degrees this strategy runs ``--mesh`` with on ``world_size`` processes; a
        dimension it does not use, or degrees that do not fit the world, are refused."""
        return resolve(mesh, world_size, strategy=self.name, allowed=self.mesh_dims,
                       dp_means=self.dp_means, fill=self.layout_fill,
                       defaults=self.layout_defaults, minimum=self.layout_minimum)

    def check_layout(self, layout: Any) -> None:
        """Check the resolved batch layout (e.g. microbatches dividing the batch)."""

    def report(self, world: World) -> dict[str, Any]:
        """Strategy-specific measurements for results.json (a collective: all ranks call
        it; return the same dict everywhere)."""
        return {}

    def check(self, workload: Workload, world: World) -> None:
        """Raise :class:`ddl.contract.errors.UsageError` naming what is supported if this strategy
        cannot run ``workload`` on ``world``."""

    def check_model(self, model: nn.Module, workload: Workload) -> None:
        """Raise UsageError if the layout does not fit ``model`` (built on the meta device:
        shapes only), before any worker starts: e.g. heads that tensor parallel must
        divide. Default: nothing to check."""

    def data_parallel_size(self, world: World) -> int:
        """How many replicas see different data (the global batch is split over them)."""
        return self.parallel.dp

    def data_parallel_rank(self, world: World) -> int:
        return self.parallel.dp_rank(world.rank)

    @abstractmethod
    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        """Place ``model`` on ``world.device`` and parallelise it."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Called once the optimizer exists (built on the wrapped model's parameters)."""
        return optimizer

    def train_step(self, model: nn.Module, batch: tuple[Any, Any], workload: Workload,
                   optimizer: torch.optim.Optimizer, precision: Precision
                   ) -> tuple[torch.Tensor, Any]:
        """Forward, backward, optimizer step; returns (detached mean loss, outputs)."""
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            outputs = workload.forward(model, inputs)
            loss = workload.loss(outputs, targets)
        precision.backward(loss)
        self.clip_gradients(model, optimizer, precision)
        precision.step(optimizer)
        return loss.detach(), outputs

    def clip_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                       precision: Precision) -> None:
        """``--clip-grad-norm``: scale the gradients to a global 2-norm of at most that
        (ddl.contract.grad_norm; DTensor shards and replicas counted as one model)."""
        max_norm = getattr(getattr(self, "config", None), "clip_grad_norm", None)
        if not max_norm:
            return
        from ddl.contract.grad_norm import clip_grad_norm

        precision.unscale(optimizer)
        self.record_grad_norm(clip_grad_norm(model.parameters(), max_norm))

    def record_grad_norm(self, norm: Any) -> None:
        """Keep a clipped step's norm (before clipping) for the epoch's record."""
        self.__dict__.setdefault("grad_norms", []).append(float(norm))

    def take_grad_norms(self) -> list[float]:
        """The norms recorded since the last call (the trainer's, once per epoch)."""
        return self.__dict__.pop("grad_norms", [])

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module to run evaluation forwards on."""
        return model

    def generation_model(self, model: nn.Module, world: World) -> nn.Module | None:
        """A whole model that every rank holds as plain tensors, for loops a workload runs
        itself after training (e.g. ``generate()``, which bypasses a wrapper's forward), so
        that ranks may feed it different inputs. ``model`` is what :meth:`eval_model`
        returned. None where the parameters stay distributed (tensor parallel): then every
        rank must run ``model`` itself on the same inputs, as collectives run inside each
        forward. All ranks call it (a strategy may gather; a collective). Default: the
        model itself, which suits strategies whose ranks hold full replicas."""
        return model

    def eval_step(self, model: nn.Module, inputs: Any, targets: Any, workload: Workload,
                  precision: Precision) -> Any:
        """Outputs for one evaluation batch, or None on ranks that produce none (all ranks
        call it with the same batch shape)."""
        with precision.autocast():
            return workload.forward(self.eval_model(model), inputs)

    def checkpoint_name(self, fqn: str) -> str:
        """A parameter's name in checkpoints, given its name in the wrapped model. The
        default suits strategies whose state dicts already use the unwrapped model's names
        (torch's get_state_dict strips DDP/FSDP prefixes)."""
        return fqn

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer
                         ) -> dict[str, Any]:
        """Model and optimizer state for ``torch.distributed.checkpoint``, keyed by the
        unwrapped model's parameter names so that any strategy and world size can load it.
        Each rank holds only its own shards (DTensors under FSDP/TP)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from ddl.contract.state_names import rename_state

        if not model.state_dict():  # a pipeline rank holding only parameter-free stages
            self._checkpoint_names = {}  # (torch's get_state_dict refuses an empty model)
            return {"model": {}, "optim": {}}
        model_state, optim_state = get_state_dict(
            model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
        state, self._checkpoint_names = rename_state(
            {"model": model_state, "optim": optim_state}, self.checkpoint_name)
        return state

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
        """Put a state filled by ``torch.distributed.checkpoint`` (from
        :meth:`checkpoint_state`) back into the run."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        from ddl.contract.state_names import restore_names

        if not state["model"]:  # nothing held here (see checkpoint_state)
            return
        original = restore_names(state, self._checkpoint_names)
        set_state_dict(model, optimizer, model_state_dict=original["model"],
                       optim_state_dict=original["optim"],
                       options=StateDictOptions(flatten_optimizer_state_dict=True))

    @abstractmethod
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The complete, unwrapped weights (plain tensors; valid on rank 0 at least)."""
