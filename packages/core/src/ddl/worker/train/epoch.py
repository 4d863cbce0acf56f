"""One epoch: its optimizer steps, then validation and the epoch's record.

``train_epoch`` runs the steps from batch ``position`` (non-zero when resuming inside an
epoch): each is ``ddl.worker.train.step.optimizer_step`` (zero_grad, the strategy's forward and
backward, clipping, the optimizer, the lr schedule). Between steps it reports progress
(ddl.worker.observe.observers: the
progress bar or line, the live state ``ddl watch`` reads, TensorBoard), writes the
``--checkpoint-every`` checkpoints and asks the step guard whether to stop (a signal, a stop
file, a non-finite loss); a stop leaves a checkpoint to resume from. ``validate`` evaluates
the epoch's model and writes its record to ``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ddl.settings import rundir
from ddl.worker.checkpointing import checkpoint
from ddl.worker.train.control import StepGuard
from ddl.worker.train.evaluation import evaluate, fmt, with_derived
from ddl.worker.train.loaders import DeviceBatches
from ddl.worker.train.metrics import TrainingMetrics
from ddl.worker.observe.observers import Observers
from ddl.worker.observe.profiling import StepProfiler
from ddl.worker.train.setup import TrainingRun
from ddl.worker.train.step import optimizer_step
from ddl.worker.observe.step_breakdown import StepBreakdown


@dataclass
class Trained:
    """What an epoch's steps measured; ``stop`` names why training stopped early, if it did
    (then nothing else is filled in)."""

    stop: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # averaged over all ranks
    seconds: float = 0.0
    data_wait: float = 0.0  # seconds this rank waited for its batches
    cpu_seconds: float = 0.0  # CPU time this rank's process used for the steps (all threads)
    grad_norm: float | None = None  # mean global gradient norm before clipping, if clipped
    breakdown: dict[str, Any] = field(default_factory=dict)  # ddl.worker.observe.step_breakdown


def train_epoch(run: TrainingRun, epoch: int, position: int, guard: StepGuard,
                profiler: StepProfiler, observers: Observers) -> Trained:
    numbers, world, workload, model = run.numbers, run.world, run.workload, run.model
    loader = run.train_loader
    loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    loader.sampler.start = position * numbers.batch_per_replica  # samples, not batches
    model.train()
    sums = TrainingMetrics(workload, world.device)
    data_wait = 0.0
    norms: list[float] = []
    observers.begin_epoch(epoch, position, run.step)
    breakdown = StepBreakdown(world.device, run.config.count_syncs)
    _sync(world.device)
    t0, cpu0 = time.perf_counter(), time.process_time()
    # batches arrive on the device one step ahead (on CUDA the copy and the workload's
    # to_device overlap the step before; ddl.worker.train.loaders.DeviceBatches)
    batches = DeviceBatches(loader, lambda batch: workload.to_device(batch, world.device),
                            world.device)
    for i in range(position, numbers.steps_per_epoch):
        with breakdown.step() as syncs:
            breakdown.started()
            t_fetch = time.perf_counter()
            micro = [next(batches) for _ in range(numbers.accumulation)]
            data_wait += time.perf_counter() - t_fetch
            breakdown.fetched()
            # the run's first two steps also count the bytes kept for backward (one Python
            # call per saved tensor: ~80 us a step on MNIST tiny, so not on every step, nor
            # every epoch's first two: the bytes are the same each epoch); two, since a
            # pipeline's first step adds its shape inference
            meter = run.saved_tensors if run.saved_tensors and run.saved_tensors.steps < 2 \
                else None
            with meter.measure() if meter else contextlib.nullcontext():
                loss, outputs, clipped = optimizer_step(run, micro)
            breakdown.stepped()
            if run.step == 0 and run.config.compile:
                run.first_step_s = time.perf_counter() - t_fetch
            if clipped is not None:  # --clip-grad-norm: the norm before clipping, kept on
                norms.append(clipped.detach())  # the device (read once, at the epoch's end)
            profiler.step()
            run.step += 1
            for out, batch in zip(outputs, micro):
                if out is not None:  # a pipeline rank without the last stage has none
                    sums.add(out, batch[1])  # small outputs: gathered, measured every few steps
            observers.step(epoch, i + 1, run.step, loss)  # fetches the loss every --log-every
            done = i + 1  # batches of this epoch behind us
            checkpoint_due = bool(run.config.checkpoint_every and done < numbers.steps_per_epoch
                                  and run.step % run.config.checkpoint_every == 0)
            # checked before any checkpoint is written, and at the epoch's end (read once
            # the steps are done, below)
            stop = guard.after_step(loss, run.step, epoch, done,
                                    lambda: checkpoint.latest(run.run_dir),
                                    force=checkpoint_due, last=done == numbers.steps_per_epoch)
            if checkpoint_due or stop:  # a stop resumes here (the next epoch if it is done)
                observers.phase("checkpointing")
                run.save_checkpoint(*((epoch, done) if done < numbers.steps_per_epoch
                                      else (epoch + 1, 0)))
                observers.phase("training")
        breakdown.ended(_asked(run, done, numbers.steps_per_epoch, checkpoint_due, stop), syncs)
        if stop:
            return Trained(stop=stop)
    sums.flush()  # the metrics still gathered belong to the epoch's steps and its time
    _sync(world.device)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    # the last step's check, in flight while the clock ran out: read before anything of
    # the epoch is written
    stop = guard.settle(epoch, lambda: checkpoint.latest(run.run_dir))
    if stop:
        observers.phase("checkpointing")
        run.save_checkpoint(epoch + 1, 0)
        return Trained(stop=stop)
    return Trained(metrics=with_derived(sums.reduce(world), workload), seconds=seconds,
                   data_wait=data_wait, cpu_seconds=cpu_seconds,
                   grad_norm=torch.stack(norms).mean().item() if norms else None,
                   breakdown=breakdown.record())


def _asked(run: TrainingRun, done: int, steps: int, checkpoint_due: bool, stop: str | None
           ) -> str | None:
    """The flag or event that reads a device value at this step (the step guard's check,
    the progress line's loss, a checkpoint), or None: then the step should make no
    host-device synchronisation (ddl.worker.observe.step_breakdown)."""
    if done == steps:
        return "epoch end"
    if checkpoint_due or stop:
        return "checkpoint"
    if run.step % run.config.check_every == 0:
        return "--check-every"
    if run.world.is_main and done % run.config.log_every == 0:
        return "--log-every"
    return None


def validate(run: TrainingRun, epoch: int, position: int, trained: Trained, warmup: bool,
             observers: Observers) -> dict[str, Any]:
    """Evaluate on the validation split; log, record (metrics.jsonl) and return the epoch.
    ``warmup`` marks the first epoch of this run: its one-off costs keep it out of the
    summary."""
    numbers, world = run.numbers, run.world
    observers.phase("validating")
    t_eval = time.perf_counter()
    run.model.eval()
    val = evaluate(run.eval_step, run.val_loader, run.workload, world)
    seconds = trained.seconds
    samples = (numbers.steps_per_epoch - position) * numbers.global_batch
    record = {"epoch": epoch, "warmup": warmup, "time_s": seconds,
              "samples": samples, "samples_per_s": samples / seconds,
              "data_wait_s": trained.data_wait,
              "data_wait_per_step_s": trained.data_wait / numbers.steps_per_epoch,
              # the process's CPU time over the same steps: on a shared machine a steadier
              # measure of the work done than wall time (benchmarks/overhead.py)
              "cpu_time_s": trained.cpu_seconds,
              "eval_time_s": time.perf_counter() - t_eval,
              "lr": run.optimizer.param_groups[0]["lr"], "train": trained.metrics,
              "val": val}
    if trained.grad_norm is not None:
        record["grad_norm"] = trained.grad_norm
    record["step_breakdown"] = trained.breakdown
    if position:
        record["resumed_at_step"] = position  # a partial epoch: times cover the rest
    record["data_wait_share"] = trained.data_wait / seconds
    run.say(f"epoch {epoch}/{numbers.epochs}  train {fmt(trained.metrics)} | val "
            f"{fmt(val)} | {seconds:.1f} s, {samples / seconds:.0f} samples/s"
            + (" (warm-up, excluded from the summary)" if warmup else ""))
    note = None if warmup or run.loader_noted else loader_note(
        epoch, numbers.steps_per_epoch - position, seconds, trained.data_wait, run.workers)
    if note:
        run.loader_noted = True
        run.say(note)
    if world.is_main:
        rundir.append_jsonl(run.run_dir / rundir.METRICS, record)
    observers.end_epoch(record, run.step)
    return record


LOADER_BOUND = 0.2  # a measured epoch waiting for data this share of its time says so


def loader_note(epoch: int, steps: int, seconds: float, data_wait: float,
                workers: int) -> str | None:
    """One line when the loader, not the model, sets the pace (rank 0's view): how fast it
    delivers batches (decode, augmentation, reading) against how fast the model consumes
    them, and what would help. ``None`` below ``LOADER_BOUND``."""
    if seconds <= 0 or data_wait / seconds < LOADER_BOUND or steps <= 0:
        return None
    training = max(seconds - data_wait, 1e-9)
    return (f"ddl: epoch {epoch} waited for data {data_wait / seconds:.0%} of its time: the "
            f"loader delivers {steps / data_wait:.1f} batches/s, the model trains "
            f"{steps / training:.1f} steps/s (rank 0, {workers} loader worker(s)); more "
            "loader processes (--workers, on Slurm from --cpus-per-task) or data already "
            "decoded would help")


def _sync(device: torch.device) -> None:
    # CUDA runs asynchronously: wait for the device so the epoch's clock covers its work
    if device.type == "cuda":
        torch.cuda.synchronize(device)
