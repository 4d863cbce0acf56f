"""The training loop every workload and strategy shares.

Per epoch: reshuffle (``set_epoch``), train, evaluate on the validation split, average the
metrics over all ranks, print one line on rank 0 and append it to ``metrics.jsonl``. After
the last epoch: evaluate on the test split, export the weights, write ``results.json``.
Checkpoints (``ddl.worker.checkpoint``) are written at every epoch's end and, with
``--checkpoint-every``, between; ``--resume`` continues from one mid-epoch.

Timing follows the courses: the first epoch includes one-off costs (allocator warm-up, lazy
initialisation, data caching), so it is marked ``warmup`` and left out of the summary.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddl.worker import checkpoint

from ddl.worker import mfu

from ddl.worker import profiling

from ddl.settings import rundir

from ddl.worker import utilisation
from ddl.worker.control import StepGuard
from ddl.settings.config import RunConfig, resolve_batch, scaled_lr
from ddl.worker.loaders import eval_loader, train_loader
from ddl.contract.world import World
from ddl.worker.distributed import seed_all
from ddl.contract.errors import UsageError
from ddl.worker.memory import gather, rank_memory
from ddl.worker.metrics import MetricSums
from ddl.worker.precision import Precision
from ddl.contract.plugins import Plugins
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload


def say(world: World, message: str) -> None:
    """Print on rank 0 only, so N ranks do not repeat each line N times."""
    if world.is_main:
        print(message, flush=True)


@dataclass
class Layout:
    """What the worker derived from the config and the world."""

    preset: str
    dp_size: int
    batch_per_replica: int
    global_batch: int
    base_lr: float
    lr: float
    epochs: int
    steps_per_epoch: int = 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(config: RunConfig, world: World, plugins: Plugins) -> tuple[Workload, Strategy, Layout]:
    wspec = plugins.workload(config.plugin)
    sspec = plugins.strategy(config.strategy)
    if not sspec.supports(wspec):
        from ddl.contract.specs import CAPABILITIES

        missing = sorted(sspec.requires - wspec.capabilities)
        able = [w.name for w in plugins.workloads().values() if sspec.supports(w)]
        raise UsageError(f"--strategy {sspec.name}: workload {wspec.name} does not provide "
                         f"{', '.join(missing)} ({CAPABILITIES[missing[0]]}); workloads that "
                         f"support {sspec.name}: {', '.join(able) or 'none installed'}")
    preset_name = config.preset or wspec.default_preset
    if preset_name not in wspec.presets:
        raise UsageError(f"--preset: {config.plugin} has no preset {preset_name!r}; allowed: "
                         f"{', '.join(wspec.presets)}")
    preset = wspec.presets[preset_name]
    workload: Workload = wspec.create(preset)
    strategy: Strategy = sspec.create(config.strategy_options)
    strategy.configure(config)
    strategy.check(workload, world)
    dp_size = strategy.data_parallel_size(world)
    per_replica, global_batch = resolve_batch(config, preset.batch_size, dp_size)
    base_lr = config.lr or preset.lr
    layout = Layout(preset=preset_name, dp_size=dp_size, batch_per_replica=per_replica,
                    global_batch=global_batch, base_lr=base_lr,
                    lr=scaled_lr(config, base_lr, global_batch, preset.batch_size),
                    epochs=config.epochs or preset.epochs)
    strategy.check_layout(layout)
    return workload, strategy, layout


def loader_workers(config: RunConfig, world: World) -> int:
    """DataLoader worker processes per rank: as configured, else from the Slurm allocation
    (the JSC course sizes them from SLURM_CPUS_PER_TASK), keeping one core for the rank."""
    if config.workers is not None:
        return config.workers
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", 0))
    if not cpus:
        return 0
    per_node_launcher = os.environ.get("DDL_LAUNCHED_PER_NODE") == "1"
    per_rank = cpus // int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if per_node_launcher else cpus
    return max(0, min(8, per_rank - 1))


def _lr_schedule(config: RunConfig, layout: Layout, workload: Workload):
    """Per-step multiplier: linear warm-up (starting from the unscaled lr when linear
    scaling is on, Goyal et al. 2017 sec. 2.2) times the workload's per-epoch factor."""
    warmup_steps = round(config.warmup_epochs * layout.steps_per_epoch)
    start = min(1.0, layout.base_lr / layout.lr) if config.lr_scaling == "linear" else 0.0
    if warmup_steps and start == 1.0:
        start = 1.0 / warmup_steps

    def factor(step: int) -> float:
        warm = 1.0
        if step < warmup_steps:
            warm = start + (1.0 - start) * step / warmup_steps
        return warm * workload.lr_factor(step // layout.steps_per_epoch)

    return factor


def _batch_len(targets: Any) -> int:
    if isinstance(targets, dict):
        targets = next(iter(targets.values()))
    return targets.shape[0] if hasattr(targets, "shape") else len(targets)


def evaluate(step, loader, workload: Workload, world: World) -> dict[str, float]:
    """Exact metrics over a split: ``step(inputs, targets)`` gives outputs (or None on ranks
    without any); padding positions of the shard get weight zero."""
    sums = MetricSums(world.device)
    real = loader.sampler.real  # positions beyond this on this rank are padding
    position = 0
    with torch.no_grad():
        for batch in loader:
            inputs, targets = workload.to_device(batch, world.device)
            outputs = step(inputs, targets)
            n = _batch_len(targets)
            if outputs is not None:
                per_sample = workload.sample_metrics(outputs, targets)
                positions = torch.arange(position, position + n, device=world.device)
                sums.add(per_sample, weight=(positions < real).to(torch.float64))
            position += n
    return sums.reduce(world)


def _fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def train(config: RunConfig, world: World, plugins: Plugins, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    workload, strategy, layout = build(config, world, plugins)
    data_dir = Path(config.data_dir)
    splits = workload.datasets(data_dir)

    seed_all(config.seed)  # identical initial weights on every rank
    model = workload.build_model()
    # counted before wrapping: a pipeline rank keeps only its own stages afterwards
    parameters = sum(p.numel() for p in model.parameters())
    model = strategy.wrap(model, world)
    # a pipeline rank may hold only parameter-free stages (MNIST's flatten); an empty group
    # keeps its optimizer, lr schedule and checkpoint valid (torch refuses an empty list)
    params = list(model.parameters()) or [{"params": []}]
    optimizer = strategy.prepare_optimizer(workload.optimizer(params, layout.lr))
    seed_all(config.seed + world.rank)  # then per-rank streams (dropout, augmentation)

    precision = Precision.create(config.precision, world.device)
    pin = world.device.type == "cuda"
    workers = loader_workers(config, world)
    dp_rank = strategy.data_parallel_rank(world)
    loader = train_loader(splits["train"], batch_size=layout.batch_per_replica,
                          replicas=layout.dp_size, rank=dp_rank, seed=config.seed,
                          workers=workers, pin_memory=pin)
    if len(loader) == 0:
        raise UsageError(f"the global batch {layout.global_batch} is larger than the "
                         f"{len(splits['train'])} training samples; use a smaller batch")
    layout.steps_per_epoch = min(len(loader), config.steps_per_epoch or len(loader))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_schedule(config, layout,
                                                                          workload))
    val_loader, test_loader = (
        eval_loader(splits[s], batch_size=layout.batch_per_replica, replicas=layout.dp_size,
                    rank=dp_rank, workers=workers, pin_memory=pin) for s in ("val", "test"))

    def eval_step(inputs, targets):
        return strategy.eval_step(model, inputs, targets, workload, precision)

    resumed_from = checkpoint.resolve(config.resume, run_dir)
    resumed = _resume(resumed_from, config, world, strategy, model, optimizer, scheduler,
                      layout, run_dir)
    step, first_epoch, first_position = ((resumed.step, resumed.epoch, resumed.position)
                                         if resumed else (0, 1, 0))
    epochs = _earlier_epochs(resumed_from, world, run_dir, first_epoch)

    guard = StepGuard(world, run_dir)
    profiler = profiling.StepProfiler(config.profile, run_dir, world.rank, world.device.type)
    profiler.start()
    usage = utilisation.Sampler(world.rank, world.device.type, world.device.index or 0,
                                rocm=torch.version.hip is not None)
    usage.start()

    def save_checkpoint(epoch: int, position: int) -> None:
        if config.keep_checkpoints == 0:
            return
        state = checkpoint.TrainerState(
            step=step, epoch=epoch, position=position, global_batch=layout.global_batch,
            world_size=world.size, scheduler=scheduler.state_dict(), plugin=config.plugin,
            preset=layout.preset, strategy=config.strategy)
        checkpoint.save(run_dir, world, strategy, model, optimizer, state,
                        config.keep_checkpoints)

    say(world, f"ddl: {config.plugin} ({layout.preset}) with {config.strategy} on "
               f"{world.size} process(es), {world.device.type}/{world.backend}, "
               f"{precision.name}, {workers} loader worker(s); global batch "
               f"{layout.global_batch} ({layout.batch_per_replica} per replica), lr "
               f"{layout.lr:g}, {layout.steps_per_epoch} steps/epoch, run dir {run_dir}")
    for epoch in range(first_epoch, layout.epochs + 1):
        loader.sampler.set_epoch(epoch)
        position = first_position if epoch == first_epoch else 0
        loader.sampler.start = position * layout.batch_per_replica
        model.train()
        sums = MetricSums(world.device)
        data_wait = 0.0
        _sync(world.device)
        t0 = time.perf_counter()
        batches = iter(loader)
        for i in range(position, layout.steps_per_epoch):
            t_fetch = time.perf_counter()
            batch = workload.to_device(next(batches), world.device)
            data_wait += time.perf_counter() - t_fetch
            loss, outputs = strategy.train_step(model, batch, workload, optimizer, precision)
            scheduler.step()
            profiler.step()
            step += 1
            if outputs is not None:
                with torch.no_grad():
                    sums.add(workload.sample_metrics(outputs, batch[1]))
            if world.is_main and (i + 1) % config.log_every == 0:
                print(f"  epoch {epoch} step {i + 1}/{layout.steps_per_epoch} "
                      f"loss {loss.item():.4f} (rank 0)", flush=True)
            saved = False
            if (config.checkpoint_every and step % config.checkpoint_every == 0
                    and i + 1 < layout.steps_per_epoch):
                save_checkpoint(epoch, i + 1)
                saved = True
            stop = guard.after_step(loss, step, epoch, i + 1, lambda: checkpoint.latest(run_dir))
            if stop:
                if not saved:
                    save_checkpoint(*((epoch, i + 1) if i + 1 < layout.steps_per_epoch
                                      else (epoch + 1, 0)))
                say(world, f"ddl: stopped after step {step} ({stop}); checkpoint "
                           f"{checkpoint.latest(run_dir)}; the same command with --resume "
                           "auto continues")
                return {}
        _sync(world.device)
        seconds = time.perf_counter() - t0
        train_metrics = sums.reduce(world)
        t_eval = time.perf_counter()
        model.eval()
        val_metrics = evaluate(eval_step, val_loader, workload, world)
        samples = (layout.steps_per_epoch - position) * layout.global_batch
        record = {"epoch": epoch, "warmup": epoch == first_epoch, "time_s": seconds,
                  "samples": samples, "samples_per_s": samples / seconds,
                  "data_wait_s": data_wait,
                  "data_wait_per_step_s": data_wait / layout.steps_per_epoch,
                  "eval_time_s": time.perf_counter() - t_eval,
                  "lr": optimizer.param_groups[0]["lr"], "train": train_metrics,
                  "val": val_metrics}
        if position:
            record["resumed_at_step"] = position  # a partial epoch: times cover the rest
        epochs.append(record)
        say(world, f"epoch {epoch}/{layout.epochs}  train {_fmt(train_metrics)} | val "
                   f"{_fmt(val_metrics)} | {seconds:.1f} s, {samples / seconds:.0f} samples/s"
                   + (" (warm-up, excluded from the summary)" if epoch == first_epoch else ""))
        if world.is_main:
            rundir.append_jsonl(run_dir / rundir.METRICS, record)
        save_checkpoint(epoch + 1, 0)

    profile = profiler.finish()
    used = usage.stop()
    model.eval()
    test_metrics = evaluate(eval_step, test_loader, workload, world)
    test_metrics.update(workload.test_report(strategy.eval_model(model), splits["test"], world))
    say(world, f"test  {_fmt(test_metrics)}")
    memory = gather(rank_memory(model, optimizer, world.device), world.size)
    strategy_report = strategy.report(world)
    state = strategy.full_state_dict(model)
    results = _results(config, world, layout, workload, epochs, val_metrics, test_metrics,
                       started, data_dir, parameters)
    results["memory_per_rank"] = memory
    results["checkpoints"] = {
        "latest": str(checkpoint.latest(run_dir) or ""), "keep": config.keep_checkpoints,
        "every_steps": config.checkpoint_every,
        "resumed_from": ({"checkpoint": str(resumed_from),
                          "step": resumed.step, "saved_by_world_size": resumed.world_size}
                         if resumed else None)}
    results["restarts"] = {"slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                           "worker_restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}
    results["strategy_report"] = strategy_report
    results["utilisation"] = gather(used, world.size)
    if profile is not None:
        results["profile"] = gather(profile, world.size)
    results["mfu"] = mfu.summary(workload.flops_per_sample(), results["summary"]["samples_per_s"],
                                 world.size, mfu.site_peak(config.site, plugins),
                                 f"site profile {config.site}")
    results["versions"]["plugins"] = {
        role: plugins.version_of(spec.plugin) or spec.plugin
        for role, spec in (("workload", plugins.workload(config.plugin)),
                           ("strategy", plugins.strategy(config.strategy)))}
    if world.is_main:
        _save_model(state, run_dir / rundir.MODEL)
        rundir.write_json(run_dir / rundir.RESULTS, results)
        say(world, f"results: {run_dir / rundir.RESULTS}")
    return results


def _resume(path: Path | None, config: RunConfig, world: World, strategy: Strategy, model,
            optimizer, scheduler, layout: Layout, run_dir: Path
            ) -> checkpoint.TrainerState | None:
    """Load the checkpoint ``--resume`` named (if any) into the freshly built run."""
    if path is None:
        if config.resume == "auto":
            say(world, f"ddl: --resume auto: no checkpoint in {run_dir}; starting from step 0")
        return None
    saved = checkpoint.read_trainer_state(path)
    if saved.plugin and (saved.plugin, saved.preset) != (config.plugin, layout.preset):
        raise UsageError(f"--resume: {path} holds {saved.plugin} ({saved.preset}), not "
                         f"{config.plugin} ({layout.preset}); resume with the same workload")
    if saved.position and saved.global_batch != layout.global_batch:
        raise UsageError(f"--resume: {path} stopped inside an epoch with global batch "
                         f"{saved.global_batch}; resume it with the same global batch (now "
                         f"{layout.global_batch}) or from an epoch-end checkpoint")
    if saved.epoch > layout.epochs:
        raise UsageError(f"--resume: {path} already completed {saved.epoch - 1} epoch(s); "
                         f"ask for more with --epochs (now {layout.epochs})")
    checkpoint.load(path, world, strategy, model, optimizer)
    scheduler.load_state_dict(saved.scheduler)
    say(world, f"ddl: resumed from {path} (step {saved.step}, epoch {saved.epoch}, "
               f"batch {saved.position} of the epoch; saved by {saved.world_size} rank(s) "
               f"under {saved.strategy})")
    return saved


def _earlier_epochs(path: Path | None, world: World, run_dir: Path,
                    first_epoch: int) -> list[dict[str, Any]]:
    """Per-epoch records of the epochs before the resume point, from the run that wrote the
    checkpoint; this run's metrics.jsonl is rewritten to hold exactly those."""
    source = path.parent.parent / rundir.METRICS if path else run_dir / rundir.METRICS
    records = [r for r in rundir.read_jsonl(source) if r.get("epoch", 0) < first_epoch]
    if world.is_main and (records or (run_dir / rundir.METRICS).exists()):
        rundir.rewrite_jsonl(run_dir / rundir.METRICS, records)
    return records


def _save_model(state: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _results(config: RunConfig, world: World, layout: Layout, workload: Workload,
             epochs: list[dict[str, Any]], val: dict[str, float], test: dict[str, float],
             started: float, data_dir: Path, parameters: int) -> dict[str, Any]:
    measured = [e for e in epochs if not e["warmup"]] or epochs  # one epoch: nothing to drop
    epoch_time = sum(e["time_s"] for e in measured) / len(measured)
    return {
        "ddl_version": __import__("ddl").__version__,
        "versions": rundir.versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_time_s": time.time() - started,
        "command": sys.argv,
        "plugin": config.plugin, "strategy": config.strategy, "site": config.site,
        "preset": layout.preset,
        "data": {"dir": str(data_dir.resolve()), "synthetic": workload.is_synthetic(data_dir)},
        "world": {"size": world.size, "dp_size": layout.dp_size, "backend": world.backend,
                  "device": world.device.type},
        "precision": Precision.create(config.precision, world.device).name,
        "loader_workers": loader_workers(config, world),
        "batch": {"per_replica": layout.batch_per_replica, "global": layout.global_batch},
        "lr": {"base": layout.base_lr, "scaled": layout.lr, "scaling": config.lr_scaling,
               "warmup_epochs": config.warmup_epochs},
        "steps_per_epoch": layout.steps_per_epoch,
        "epochs": epochs,
        "summary": {
            "epoch_time_s": epoch_time,
            "samples_per_s": sum(e["samples"] for e in measured) / sum(e["time_s"] for e in measured),
            "epochs_measured": [e["epoch"] for e in measured],
            "first_epoch_excluded": len(epochs) > 1,
        },
        "final": {"val": val, "test": test},
        "parameters": parameters,  # of the whole model, whatever the strategy
        "model_file": rundir.MODEL,
    }

