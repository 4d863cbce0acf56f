"""Everything that watches the training loop from outside, behind the few calls the loop
makes (ddl.worker.train.trainer, ddl.worker.train.epoch):

* rank 0's progress on the terminal or in the log (ddl.worker.observe.progress);
* every rank's live state file for ``ddl watch`` (ddl.worker.observe.live);
* rank 0's TensorBoard event files (ddl.worker.observe.tensorboard_events).

Per step that is the progress check (the loss is fetched every ``--log-every`` steps on rank
0, as the progress line always did) and one clock read; nothing waits for the device.
"""

from __future__ import annotations

from typing import Any

from ddl.worker import memory
from ddl.worker.observe.live import LiveState
from ddl.worker.observe.progress import Progress
from ddl.worker.train.setup import TrainingRun
from ddl.worker.observe.tensorboard_events import open_board


class Observers:
    def __init__(self, run: TrainingRun, sampler=None, *, live_every: float) -> None:
        config, world, numbers = run.config, run.world, run.numbers
        self.progress = Progress(world.is_main, config.log_every, numbers.steps_per_epoch,
                                 numbers.epochs, numbers.global_batch)
        about = {"plugin": config.plugin, "strategy": config.strategy,
                 "preset": numbers.preset, "device": world.device.type,
                 "epochs": numbers.epochs, "steps_per_epoch": numbers.steps_per_epoch,
                 "global_batch": numbers.global_batch}
        if world.device.type == "cuda":
            import torch

            about["device_total_bytes"] = torch.cuda.get_device_properties(
                world.device).total_memory
        self.live = LiveState(run.run_dir, world.rank, world.size, about, sampler=sampler,
                              memory=lambda: memory.current(world.device),
                              interval=live_every)
        self.board = open_board(run.run_dir, world.is_main, run.step, run.say)

    def begin_epoch(self, epoch: int, position: int, step: int) -> None:
        self.progress.begin_epoch(epoch, position)
        self.live.begin_epoch(epoch, position, step)

    def step(self, epoch: int, done: int, step: int, loss) -> None:
        """After optimizer step ``step`` (``done`` batches of ``epoch`` behind us)."""
        value = self.progress.step(epoch, done, loss)
        if value is not None:  # fetched for the progress line: pass it on
            self.live.loss(value, step)
            if self.board is not None:
                self.board.step_loss(step, value)
        self.live.step(epoch, done, step)

    def phase(self, name: str) -> None:
        """The rank leaves the steps for ``name`` (checkpointing, validating, testing)."""
        self.progress.finish_line(keep=name != "checkpointing")
        self.live.phase(name)

    def end_epoch(self, record: dict[str, Any], step: int) -> None:
        if self.board is not None:
            self.board.epoch(record, step)

    def close(self, state: str, reason: str | None = None) -> None:
        """The run ended: ``state`` finished, stopped or failed."""
        self.progress.finish_line()
        self.live.end(state, reason)
        if self.board is not None:
            self.board.close()
