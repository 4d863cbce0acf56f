"""Where a run starts: from scratch, or from the checkpoint ``--resume`` names.

A checkpoint may come from a run with another world size or strategy (DCP reshards), but
it must hold the same workload and preset, and one saved inside an epoch needs the same
global batch to find its place in the epoch's shuffled order. The epochs finished before
the resume point keep their records: they are copied from the run that wrote the checkpoint,
so ``metrics.jsonl`` and ``results.json`` of the resumed run cover the whole training.
A run killed after its last epoch's checkpoint but before ``results.json`` resumes straight
to the test split and writes its results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError
from ddl.settings import rundir
from ddl.worker.checkpointing import checkpoint, checkpoint_choice
from ddl.worker.train.setup import TrainingRun


@dataclass
class Start:
    """The first epoch to run and the batch within it to start from."""

    epoch: int
    position: int
    checkpoint: Path | None  # what --resume resolved to, None for a fresh start
    saved: checkpoint.TrainerState | None  # that checkpoint's trainer state
    earlier_epochs: list[dict[str, Any]]  # records of the epochs before ``epoch``


def start(run: TrainingRun) -> Start:
    """Load the checkpoint ``--resume`` names (if any) into ``run`` and say where to begin;
    sets ``run.step`` to the checkpoint's step."""
    path = checkpoint_choice.choose(run.config.resume, run.run_dir, run.world, run.say)
    if run.world.is_main:  # what killed saves left (this run holds the directory's lock)
        checkpoint.remove_leftovers(run.run_dir)
    saved = _load(path, run)
    run.step, epoch, position = (saved.step, saved.epoch, saved.position) if saved else (0, 1, 0)
    return Start(epoch=epoch, position=position, checkpoint=path, saved=saved,
                 earlier_epochs=_earlier_epochs(path, run, epoch))


def _load(path: Path | None, run: TrainingRun) -> checkpoint.TrainerState | None:
    config, numbers = run.config, run.numbers
    if path is None:
        if config.resume == "auto":
            run.say(f"ddl: --resume auto: no checkpoint in {run.run_dir}; starting from step 0")
        return None
    saved = checkpoint.read_trainer_state(path)
    if saved.plugin and (saved.plugin, saved.preset) != (config.plugin, numbers.preset):
        raise UsageError(f"--resume: {path} holds {saved.plugin} ({saved.preset}), not "
                         f"{config.plugin} ({numbers.preset}); resume with the same workload")
    if saved.position and saved.global_batch != numbers.global_batch:
        raise UsageError(f"--resume: {path} stopped inside an epoch with global batch "
                         f"{saved.global_batch}; resume it with the same global batch (now "
                         f"{numbers.global_batch}) or from an epoch-end checkpoint")
    if saved.position >= numbers.steps_per_epoch:
        raise UsageError(f"--resume: {path} stopped after batch {saved.position} of epoch "
                         f"{saved.epoch}, but this run has {numbers.steps_per_epoch} steps per "
                         "epoch; resume with the same --steps-per-epoch or from an epoch-end "
                         "checkpoint")
    finished = (saved.epoch == numbers.epochs + 1 and not saved.position
                and path.parent.parent.resolve() == run.run_dir.resolve())  # this very run
    if saved.epoch > numbers.epochs and not finished:
        raise UsageError(f"--resume: {path} already completed {saved.epoch - 1} epoch(s); "
                         f"ask for more with --epochs (now {numbers.epochs})")
    checkpoint.load(path, run.world, run.strategy, run.context, run.model, run.optimizer)
    run.scheduler.load_state_dict(saved.scheduler)
    if finished:  # killed after its last checkpoint, before results.json: finish it
        run.say(f"ddl: resumed from {path}: all {numbers.epochs} epoch(s) were trained; "
                "testing and writing the results")
        return saved
    run.say(f"ddl: resumed from {path} (step {saved.step}, epoch {saved.epoch}, "
            f"batch {saved.position} of the epoch; saved by {saved.world_size} rank(s) "
            f"under {saved.strategy})")
    return saved


def _earlier_epochs(path: Path | None, run: TrainingRun, first_epoch: int) -> list[dict[str, Any]]:
    """Per-epoch records of the epochs before the resume point, from the run that wrote the
    checkpoint; this run's metrics.jsonl is rewritten to hold exactly those."""
    metrics = run.run_dir / rundir.METRICS
    source = path.parent.parent / rundir.METRICS if path else metrics
    records = [r for r in rundir.read_jsonl(source, run.say)
               if r.get("epoch", 0) < first_epoch]
    if first_epoch > run.numbers.epochs and len(records) < run.numbers.epochs:
        raise UsageError(f"--resume: {path} completed the training, but {source} lacks the "
                         "epochs' records needed for results.json; train again in a new "
                         "directory")
    if run.world.is_main and (records or metrics.exists()):
        rundir.rewrite_jsonl(metrics, records)
    return records
