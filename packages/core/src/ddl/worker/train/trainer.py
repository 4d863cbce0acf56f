"""The training loop every workload and strategy shares, readable top to bottom in ``train``.

Set-up (``ddl.worker.train.setup``): the workload and strategy plugins, the model wrapped by the
strategy, optimizer, learning-rate schedule and sharded loaders;
``ddl.worker.checkpointing.resume`` loads
the checkpoint ``--resume`` names. Per epoch (``ddl.worker.train.epoch``): reshuffle, train,
evaluate
on the validation split, average the metrics over all ranks, print one line on rank 0 and
append it to ``metrics.jsonl``; a checkpoint (``ddl.worker.checkpointing.checkpoint``) at every
epoch's end
and, with ``--checkpoint-every``, between. After the last epoch: evaluate on the test split,
export the weights and write ``results.json`` (``ddl.worker.observe.results``). Throughout,
the observers (``ddl.worker.observe.observers``) show progress on rank 0, keep each rank's
live state for ``ddl watch`` (finished, stopped or failed at the end) and write TensorBoard
events.

Timing follows the courses: the first epoch includes one-off costs (allocator warm-up, lazy
initialisation, data caching), so it is marked ``warmup`` and left out of the summary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ddl.contract.plugins import Plugins
from ddl.contract.world import World
from ddl.settings import rundir
from ddl.settings.plan import RunPlan
from ddl.worker.checkpointing import checkpoint, resume
from ddl.worker.process import threads
from ddl.worker.observe import profiling, results, utilisation
from ddl.worker.train.control import StepGuard
from ddl.worker.train.epoch import train_epoch, validate
from ddl.worker.train.evaluation import evaluate, fmt
from ddl.worker.memory import gather, rank_memory
from ddl.worker.observe.observers import Observers
from ddl.worker.train.setup import TrainingNumbers, TrainingRun, build, set_up

__all__ = ["TrainingNumbers", "build", "evaluate", "train"]


def train(plan: RunPlan, world: World, plugins: Plugins) -> dict[str, Any]:
    """Train as planned; returns results.json's content, or {} when stopped early (a
    checkpoint then holds the state to resume from)."""
    started = time.time()
    config, run_dir = plan.config, plan.run_dir
    run = set_up(config, world, plugins, run_dir, workers=plan.loader_workers,
                 resolved=plan.resolved)
    begin = resume.start(run)  # step, epoch and batch to begin at; earlier epochs' records

    # stop on a signal, a stop file or a non-finite loss, checked every --check-every steps
    guard = StepGuard(world, run_dir, every=config.check_every)
    profiler = profiling.StepProfiler(config.profile, run_dir, world.rank, world.device.type)
    profiler.start()
    usage = utilisation.Sampler(world.rank, world.device.type, world.device.index or 0,
                                rocm=torch.version.hip is not None)
    usage.start()

    run.say(_banner(run))
    # progress, live state (ddl watch), TensorBoard
    observers = Observers(run, usage, live_every=plan.live_every_s)
    try:
        epochs = begin.earlier_epochs
        for epoch in range(begin.epoch, run.numbers.epochs + 1):
            position = begin.position if epoch == begin.epoch else 0  # > 0: resumed mid-epoch
            trained = train_epoch(run, epoch, position, guard, profiler, observers)
            if trained.stop:
                run.checkpoint_writer().wait()  # --async-checkpoint: the stop's is written
                run.say(f"ddl: stopped after step {run.step} ({trained.stop}); checkpoint "
                        f"{checkpoint.latest(run_dir)}; the same command with --resume auto "
                        "continues")
                observers.close("stopped", trained.stop)
                return {}
            epochs.append(validate(run, epoch, position, trained,
                                   warmup=epoch == begin.epoch, observers=observers))
            observers.phase("checkpointing")
            run.save_checkpoint(epoch + 1, 0)  # epoch end: a resume starts the next epoch

        run.checkpoint_writer().wait()  # the last epoch's checkpoint, if written async
        profile, used = profiler.finish(), usage.stop()  # measure training, not the test split
        observers.phase("testing")
        document = _finish(run, plugins, begin, epochs, started, profile, used,
                           peak_flops=plan.site.device_peak_flops,
                           peak_accelerator=plan.site.accelerator, command=plan.command,
                           predicted=plan.predicted)
    except BaseException as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        observers.close("failed", why)
        raise
    observers.close("finished")
    return document


def _finish(run: TrainingRun, plugins: Plugins, begin: resume.Start, epochs: list[dict[str, Any]],
            started: float, profile: dict[str, Any] | None,
            used: dict[str, Any], peak_flops: float | None,
            command: list[str], predicted: dict[str, Any] | None = None,
            peak_accelerator: str | None = None) -> dict[str, Any]:
    """Test, export the full weights and write results.json (rank 0). Every rank calls it:
    the test metrics, memory, weights and per-rank reports are gathered collectively."""
    config, world, workload, strategy, model = (run.config, run.world, run.workload,
                                                run.strategy, run.model)
    model.eval()
    test = evaluate(run.eval_step, run.test_loader, workload, world)
    evaluated = strategy.eval_model(model)
    test.update(workload.test_report(evaluated, run.splits["test"], world,
                                     lambda: strategy.generation_model(evaluated, run.context)))
    run.say(f"test  {fmt(test)}")
    mine = rank_memory(model, run.optimizer, world.device)
    mine["build_peak_bytes"] = run.build_peak_bytes  # building and wrapping the model
    if run.saved_tensors is not None:  # activations: what one micro-step keeps for backward
        mine["saved_for_backward_bytes"] = run.saved_tensors.peak_bytes
    memory = gather(mine, world.size)
    strategy_report = strategy.report(model, run.context)
    state = strategy.full_state_dict(model, run.context)
    document = results.assemble(
        config=config, world=world, plugins=plugins, workload=workload, numbers=run.numbers,
        data_dir=run.data_dir, precision=run.precision.name, loader_workers=run.workers,
        parameters=run.parameters, epochs=epochs, val=epochs[-1]["val"], test=test,
        started=started, finished=time.time(), memory=memory,
        latest_checkpoint=checkpoint.latest(run.run_dir), resumed_from=begin.checkpoint,
        checkpoint_stall=run.checkpoint_writer().report(), predicted=predicted,
        resumed=begin.saved, strategy_report=strategy_report,
        utilisation=gather(used, world.size),
        profile=None if profile is None else gather(profile, world.size),
        peak_flops=peak_flops, peak_accelerator=peak_accelerator,
        parallel=run.context.layout.degrees(),
        compiled=_compile_report(run), threads=threads.report(), command=command,
        tf32=run.precision.tf32)
    if world.is_main:
        _save_model(state, run.run_dir / rundir.MODEL)
        rundir.write_json(run.run_dir / rundir.RESULTS, document)
        run.say(f"results: {run.run_dir / rundir.RESULTS}")
    return document


def _compile_report(run: TrainingRun) -> dict[str, Any]:
    """--compile: rank 0's seconds in torch.compile, and its first optimizer step (which
    contains them), apart from the steady step time in the summary."""
    if not run.config.compile:
        return {"enabled": False}
    from ddl.worker.build.compiling import compile_seconds

    return {"enabled": True, "units": "fsdp_units", "compile_time_s": compile_seconds(),
            "first_step_s": run.first_step_s}


def _banner(run: TrainingRun) -> str:
    config, world, numbers = run.config, run.world, run.numbers
    per_replica = f"{numbers.batch_per_replica} per replica" + (
        f" in {numbers.accumulation} micro-steps of {numbers.micro_batch}"
        if numbers.accumulation > 1 else "")
    return (f"ddl: {config.plugin} ({numbers.preset}) with {config.strategy} on "
            f"{world.size} process(es), {world.device.type}/{world.backend}, "
            f"{run.precision.name}, {run.workers} loader worker(s); global batch "
            f"{numbers.global_batch} ({per_replica}), lr "
            f"{numbers.lr:g}, {numbers.steps_per_epoch} steps/epoch, run dir {run.run_dir}")


def _save_model(state: dict[str, torch.Tensor], path: Path) -> None:
    # written aside and renamed: a crash mid-write never leaves a truncated model.pt
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)
