"""Setting up one training run: from a run configuration to a model ready to train.

``build`` resolves the workload and strategy plugins, makes the strategy's context (the
workload, the parallel layout, the step settings), lets the strategy check it and works out
batch sizes, the learning rate and the epochs (``TrainingNumbers``). It builds no model, so
the CLI can run it as a cheap pre-flight check before any worker starts. ``set_up`` then
builds what the epochs need - the wrapped model, its optimizer and learning-rate schedule,
the precision and the sharded loaders - into one ``TrainingRun`` that the trainer drives
epoch by epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Subset

from ddl.contract.context import RunContext
from ddl.contract.errors import UsageError
from ddl.contract.layout import ParallelLayout
from ddl.contract.plugins import Plugins
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.settings.batch import resolve_batch
from ddl.settings.config import RunConfig, resolve_preset, scaled_lr
from ddl.settings.plan import Resolved
from ddl.worker.checkpointing import checkpoint
from ddl.worker.train import lr_schedule
from ddl.worker.build import activation_checkpointing, compiling, sync_bn
from ddl.worker.process import mesh
from ddl.worker.build import build_memory, model_build
from ddl.worker.observe.activation_memory import SavedTensorMeter
from ddl.worker.process.distributed import seed_all
from ddl.worker.train.loaders import eval_loader, train_loader
from ddl.worker.train.precision import Precision
from ddl.worker.train.precision import resolve as resolve_precision


@dataclass
class TrainingNumbers:
    """The numbers a run trains with: batch sizes, learning rate, epochs and steps, as
    the worker derived them from the config and the world (not a layout: that is
    ``StrategyContext.layout``, a ParallelLayout)."""

    preset: str
    dp_size: int
    batch_per_replica: int  # samples per replica per optimizer step
    global_batch: int
    micro_batch: int  # samples per replica per forward pass (what the loaders deliver)
    accumulation: int  # forward/backward passes per optimizer step
    base_lr: float
    lr: float
    epochs: int
    steps_per_epoch: int = 0


def build(config: RunConfig, world: World, plugins: Plugins, resolved: Resolved | None = None
          ) -> tuple[Strategy, StrategyContext, TrainingNumbers]:
    """The strategy for ``config`` and what its calls need (the workload, the layout),
    checked against each other and the world. ``resolved``: what the pre-flight already
    worked out (preset, degrees, batch split, lr), taken as it is; None works it out."""
    wspec = plugins.workload(config.plugin)
    sspec = plugins.strategy(config.strategy)
    if not sspec.supports(wspec):
        from ddl.contract.specs import CAPABILITIES

        missing = sorted(sspec.requires - wspec.capabilities)
        able = [w.name for w in plugins.workloads().values() if sspec.supports(w)]
        raise UsageError(f"--strategy {sspec.name}: workload {wspec.name} does not provide "
                         f"{', '.join(missing)} ({CAPABILITIES[missing[0]]}); workloads that "
                         f"support {sspec.name}: {', '.join(able) or 'none installed'}")
    if sspec.unavailable():
        raise UsageError(f"--strategy {sspec.name}: {sspec.unavailable()}")
    preset_name, preset = ((resolved.preset, wspec.presets[resolved.preset]) if resolved
                           else resolve_preset(config, wspec))
    workload: Workload = wspec.create(preset)
    strategy: Strategy = sspec.create(config.strategy_options)
    degrees = (ParallelLayout(**resolved.degrees) if resolved
               else strategy.resolve_layout(config.mesh, world.size))
    if degrees.world_size != world.size:
        raise UsageError(f"the run plan's layout {degrees.describe()} needs "
                         f"{degrees.world_size} processes; this world has {world.size}")
    # the pre-flight decides the precision (auto: per device kind); workers read the plan's
    precision = resolved.precision if resolved else resolve_precision(config.precision,
                                                                      world.device)
    context = StrategyContext(world=world, layout=degrees,
                              workload=workload, microbatches=config.microbatches,
                              clip_grad_norm=config.clip_grad_norm, precision=precision)
    sync_bn.check(config.sync_bn, sspec, plugins.strategies().values())
    _check_block_options(config, wspec, world)
    strategy.check(context)
    dp_size = context.layout.dp
    if resolved:
        numbers = TrainingNumbers(preset=preset_name, dp_size=dp_size,
                                  batch_per_replica=resolved.batch_per_replica,
                                  global_batch=resolved.global_batch,
                                  micro_batch=resolved.micro_batch,
                                  accumulation=resolved.accumulation, base_lr=resolved.base_lr,
                                  lr=resolved.lr, epochs=resolved.epochs)
    else:
        batch = resolve_batch(config, preset.batch_size, dp_size)
        base_lr = config.lr or preset.lr
        numbers = TrainingNumbers(preset=preset_name, dp_size=dp_size,
                                  batch_per_replica=batch.per_replica, global_batch=batch.global_,
                                  micro_batch=batch.micro, accumulation=batch.accumulation,
                                  base_lr=base_lr,
                                  lr=scaled_lr(config, base_lr, batch.global_,
                                               preset.batch_size),
                                  epochs=config.epochs or preset.epochs)
    if numbers.accumulation > 1:
        strategy.check_accumulation(context, numbers.accumulation)
    strategy.check_layout(context, numbers)
    return strategy, context, numbers


def _check_block_options(config: RunConfig, wspec, world: World) -> None:
    """--activation-checkpointing and --compile act on the workload's block units."""
    wanted = [flag for flag, on in (
        (f"--activation-checkpointing {config.activation_checkpointing}",
         config.activation_checkpointing != "none"), ("--compile", config.compile)) if on]
    if wanted and "fsdp_units" not in wspec.capabilities:
        raise UsageError(f"{wanted[0]}: workload {wspec.name} names no block units to apply "
                         "it to (capability fsdp_units, Workload.fsdp_units); allowed for "
                         f"{wspec.name}: --activation-checkpointing none, no --compile")
    if config.compile:
        compiling.check_toolchain(world.device.type)


def check_model_fits(strategy: Strategy, context: StrategyContext, numbers: TrainingNumbers,
                     data_dir: Path) -> None:
    """The pre-flight's look at the model itself: built on the meta device (no memory, no
    initialisation), handed to :meth:`Strategy.check_model` (heads that tensor parallel
    must divide, split points a pipeline needs). A workload whose model cannot be built
    that way is checked by the workers instead, as before."""
    workload = context.workload
    workload.context = RunContext(data_dir=data_dir, world=context.world,
                                  layout=context.layout, epochs=numbers.epochs,
                                  global_batch=numbers.global_batch,
                                  batch_per_replica=numbers.batch_per_replica)
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except UsageError:
        raise
    except Exception:  # noqa: BLE001 - e.g. pretrained weights that refuse the meta device
        return
    strategy.check_model(model, context)


@dataclass
class TrainingRun:
    """Everything one run trains with, built once by ``set_up``. ``step`` counts optimizer
    steps over the whole run (a resumed run starts from the checkpoint's)."""

    config: RunConfig
    world: World
    run_dir: Path
    workload: Workload
    strategy: Strategy
    context: StrategyContext  # what the strategy's calls are given
    numbers: TrainingNumbers
    data_dir: Path
    splits: dict[str, Any]
    parameters: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    precision: Precision
    workers: int
    train_loader: Any
    val_loader: Any
    test_loader: Any
    step: int = 0
    checkpoints: Any = None  # the run's checkpoint_writer.Writer, made by the first save
    # bytes saved for backward (not under --compile: dynamo and saved-tensor hooks)
    saved_tensors: SavedTensorMeter | None = None
    first_step_s: float | None = None  # --compile: the first step's wall time, compiling
    loader_noted: bool = False  # the loader-bound note was printed (once per run)
    build_peak_bytes: int | None = None  # building and wrapping the model (build_memory)

    def say(self, message: str) -> None:
        """Print on rank 0 only, so N ranks do not repeat each line N times."""
        if self.world.is_main:
            print(message, flush=True)

    def eval_step(self, inputs, targets):
        return self.strategy.eval_step(self.model, inputs, targets, self.context,
                                       self.precision)

    def save_checkpoint(self, epoch: int, position: int) -> None:
        """A checkpoint that resumes at batch ``position`` of ``epoch`` (all ranks call it)."""
        if self.config.keep_checkpoints == 0:
            return
        state = checkpoint.TrainerState(
            step=self.step, epoch=epoch, position=position,
            global_batch=self.numbers.global_batch, world_size=self.world.size,
            scheduler=self.scheduler.state_dict(), plugin=self.config.plugin,
            preset=self.numbers.preset, strategy=self.config.strategy,
            steps_per_epoch=self.numbers.steps_per_epoch)
        self.checkpoint_writer().save(self.run_dir, self.world, self.strategy, self.context,
                                      self.model, self.optimizer, state,
                                      self.config.keep_checkpoints)

    def checkpoint_writer(self):
        """Writes the checkpoints (--async-checkpoint: in a thread) and times the stalls."""
        if self.checkpoints is None:
            from ddl.worker.checkpointing.checkpoint_writer import Writer

            self.checkpoints = Writer(asynchronous=self.config.async_checkpoint)
        return self.checkpoints


def set_up(config: RunConfig, world: World, plugins: Plugins, run_dir: Path,
           workers: int, resolved: Resolved | None = None) -> TrainingRun:
    """Build the run: model (wrapped by the strategy), optimizer, schedule, loaders.
    ``workers`` is the number of DataLoader processes per rank; ``resolved`` what the
    pre-flight worked out (the run plan's), else None."""
    strategy, strategy_context, numbers = build(config, world, plugins, resolved)
    run_mesh, dp_mesh = mesh.build(strategy_context.layout, world)  # the one mesh, built once
    strategy_context = replace(strategy_context, mesh=run_mesh, dp_mesh=dp_mesh)
    workload = strategy_context.workload
    data_dir = Path(config.data_dir)
    context = RunContext(data_dir=data_dir, world=world, layout=strategy_context.layout,
                         epochs=numbers.epochs, global_batch=numbers.global_batch,
                         batch_per_replica=numbers.batch_per_replica,
                         micro_batch=numbers.micro_batch, accumulation=numbers.accumulation)
    workload.context = context
    splits = workload.datasets(data_dir)
    if config.eval_samples is not None:  # --eval-samples: a quick check's evaluation
        splits.update({s: _First(splits[s], range(min(config.eval_samples, len(splits[s]))))
                       for s in ("val", "test")})

    pin = world.device.type == "cuda"
    dp_rank, dp_size = mesh.data_shard(strategy_context.dp_mesh)
    # The loader delivers micro-batches; an optimizer step takes `accumulation` of them.
    loader = train_loader(splits["train"], batch_size=numbers.micro_batch,
                          replicas=dp_size, rank=dp_rank, seed=config.seed,
                          workers=workers, pin_memory=pin)
    steps = len(loader) // numbers.accumulation
    if steps == 0:
        raise UsageError(f"the global batch {numbers.global_batch} is larger than the "
                         f"{len(splits['train'])} training samples; use a smaller batch")
    numbers.steps_per_epoch = min(steps, config.steps_per_epoch or steps)
    workload.context = replace(context, steps_per_epoch=numbers.steps_per_epoch,
                               total_steps=numbers.epochs * numbers.steps_per_epoch)

    seed_all(config.seed)  # identical initial weights on every rank
    with build_memory.measure(world.device) as build_peak:  # the build's own peak
        model, parameters = _build_model(config, world, workload, strategy, strategy_context)
    params = _optimizer_params(model, strategy_context, strategy)
    optimizer = strategy.prepare_optimizer(workload.optimizer(params, numbers.lr), model)
    seed_all(config.seed + world.rank)  # then per-rank streams (dropout, augmentation)

    precision = Precision.create(strategy_context.precision, world.device, tf32=config.tf32)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_schedule(config, numbers,
                                                                          workload))
    val_loader, test_loader = (
        eval_loader(splits[s], batch_size=numbers.micro_batch, replicas=dp_size,
                    rank=dp_rank, workers=workers, pin_memory=pin, split=s)
        for s in ("val", "test"))
    return TrainingRun(config=config, world=world, run_dir=run_dir, workload=workload,
                       strategy=strategy, context=strategy_context, numbers=numbers,
                       data_dir=data_dir, splits=splits, parameters=parameters, model=model,
                       optimizer=optimizer, scheduler=scheduler, precision=precision,
                       workers=workers, train_loader=loader, val_loader=val_loader,
                       test_loader=test_loader,
                       saved_tensors=None if config.compile else SavedTensorMeter(),
                       build_peak_bytes=build_peak.bytes)


class _First(Subset):
    """The first n samples of a split (--eval-samples). Other attributes are the data set's:
    a workload's test_report may read fields of its own (xsum's ``summaries``), and index i
    still names the same sample."""

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("dataset", "indices"):
            raise AttributeError(name)  # unpickling: before dataset exists
        return getattr(self.dataset, name)


def _build_model(config: RunConfig, world: World, workload: Workload, strategy: Strategy,
                 context: StrategyContext) -> tuple[torch.nn.Module, int]:
    """The workload's model with the block options applied and wrapped by the strategy;
    and its parameter count, taken before wrapping (a pipeline rank keeps only its own
    stages afterwards). Built on the meta device where the strategy splits the model
    (ddl.worker.build.model_build), else on the CPU; pretrained weights loaded either way."""
    model, materializer = model_build.build(workload, strategy, context, world)
    if workload.channels_last and world.device.type == "cuda":  # before DDP's buckets
        model = model.to(memory_format=torch.channels_last)
    if config.sync_bn:  # before wrapping: strategies shard or split what they are given
        model = sync_bn.apply(model, world, context.dp_mesh)
    # per block unit, before wrapping: checkpointing inside, compiling around, sharding outside
    if config.activation_checkpointing != "none" or config.compile:
        units = workload.fsdp_units(model)
        activation_checkpointing.apply(units, config.activation_checkpointing)
        if config.compile:
            compiling.apply(units)
    parameters = sum(p.numel() for p in model.parameters())
    wrapped = strategy.wrap(model, replace(context, materialize=materializer))
    if materializer is not None:
        model_build.check_materialized(wrapped, strategy)
    return wrapped, parameters


def _optimizer_params(model: torch.nn.Module, context: StrategyContext,
                      strategy: Strategy) -> list:
    """The wrapped model's parameters for the workload's optimizer: as the workload groups
    them by name (``param_groups``; names as in the model build_model() returned), else all
    in one group."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) \
        else model  # DDP prefixes every name with "module."
    named = [(strategy.checkpoint_name(name, context), param)
             for name, param in inner.named_parameters()]
    groups = context.workload.param_groups(named)
    params = [param for _, param in named] if groups is None else groups
    # a pipeline rank may hold only parameter-free stages (MNIST's flatten); an empty group
    # keeps its optimizer, lr schedule and checkpoint valid (torch refuses an empty list)
    return params or [{"params": []}]


def _lr_schedule(config: RunConfig, numbers: TrainingNumbers, workload: Workload):
    """Per-step multiplier of the learning rate (ddl.worker.train.lr_schedule)."""
    steps = numbers.steps_per_epoch
    warmup = (config.warmup_steps if config.warmup_steps is not None
              else round(config.warmup_epochs * steps))
    start = min(1.0, numbers.base_lr / numbers.lr) if config.lr_scaling == "linear" else 0.0
    return lr_schedule.make(config.lr_schedule, total_steps=numbers.epochs * steps,
                            steps_per_epoch=steps, warmup_steps=warmup, warmup_start=start,
                            step_factor=workload.lr_step_factor)


def resolved_of(numbers: TrainingNumbers, context: StrategyContext, precision: str) -> Resolved:
    """What :func:`build` worked out, for the run plan (the pre-flight calls it once)."""
    return Resolved(preset=numbers.preset, degrees=context.layout.degrees(),
                    batch_per_replica=numbers.batch_per_replica,
                    global_batch=numbers.global_batch, micro_batch=numbers.micro_batch,
                    accumulation=numbers.accumulation, base_lr=numbers.base_lr, lr=numbers.lr,
                    epochs=numbers.epochs, precision=precision)
