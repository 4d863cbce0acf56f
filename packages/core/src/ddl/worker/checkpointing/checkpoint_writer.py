"""Writing checkpoints: synchronously or (``--async-checkpoint``) while training goes on,
and how long each save held the training loop up (``results.json``: ``checkpoints.stall``).

An asynchronous save blocks the loop only to *stage*: the model and optimizer state is
copied to host memory (pinned on a GPU, by DCP's ``DefaultStager``, whose buffers are reused
from one save to the next; a plain copy on a CPU), and the RNG states and ``trainer.json``
are written. A thread of each rank then writes the shards with DCP and commits the checkpoint
exactly as a synchronous save does (``ddl.worker.checkpointing.checkpoint``: manifest, rename,
``latest``
last), over a gloo process group of its own, so that its collectives never interleave with
training's. Until that commit the checkpoint is a ``.step-N.partial`` directory, which no
resume reads: a kill mid-write leaves the previous checkpoint the newest.

One save is in flight at a time: the next save, a stop and the end of training wait for it
(``wait``) and raise what it raised (a full disk, say) on the training thread.

Why not ``torch.distributed.checkpoint.async_save`` itself: it stages the same way and runs
``dcp.save`` in a pool thread, but that thread is joined when the interpreter exits, so a
rank whose peer died mid-write would hang there until the collective timeout; and the commit
has to follow the write on the same thread. So the thread here is a daemon running the
stager and ``dcp.save`` that ``async_save`` would.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddl.worker.checkpointing import checkpoint

if TYPE_CHECKING:
    from ddl.contract.world import World

#: For the crash tests only: in the save of this step, each rank's writer thread creates
#: ``held-RANK`` in the ``.partial`` directory once its shards are written, then waits for
#: ever (the test kills the run while the checkpoint is in flight).
FAULT_HOLD_ENV = "DDL_TEST_HOLD_ASYNC_CHECKPOINT"
_GROUP_TIMEOUT = timedelta(minutes=30)  # a multi-GB write to a parallel file system


class Writer:
    """Writes a run's checkpoints; one per run, every rank calls ``save`` alike."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.stalls: list[float] = []  # seconds each save held the training loop up
        self.end_wait = 0.0  # seconds the end of training waited for the last write
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._group: Any = None
        self._stager: Any = None

    def save(self, run_dir: Path, world: World, strategy, context, model, optimizer,
             trainer: checkpoint.TrainerState, keep: int) -> None:
        started = time.perf_counter()
        self._finish()  # one write in flight at a time
        if self.asynchronous:
            self._start(run_dir, world, strategy.checkpoint_state(model, optimizer, context),
                        trainer, keep)
        else:
            checkpoint.save(run_dir, world, strategy, context, model, optimizer, trainer, keep)
        self.stalls.append(time.perf_counter() - started)

    def wait(self) -> None:
        """Return once no checkpoint is being written (at a stop, at the end of training);
        raise what the write raised."""
        started = time.perf_counter()
        self._finish()
        self.end_wait += time.perf_counter() - started

    def report(self) -> dict[str, Any]:
        """results.json's ``checkpoints.stall`` (this rank's; the loop waits for all ranks)."""
        n = len(self.stalls)
        return {"saves": n, "mean_s": sum(self.stalls) / n if n else 0.0,
                "max_s": max(self.stalls, default=0.0), "total_s": sum(self.stalls),
                "end_wait_s": self.end_wait}

    def _finish(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _start(self, run_dir: Path, world: World, state: dict[str, Any],
               trainer: checkpoint.TrainerState, keep: int) -> None:
        import torch.distributed as dist

        if self._group is None:  # every rank is here together: a collective call
            self._group = dist.new_group(backend="gloo", timeout=_GROUP_TIMEOUT)
            self._stager = _stager(world)
        partial = checkpoint.begin(run_dir, world, trainer)
        staged = self._stager.stage(state)  # the copy the thread writes; training goes on
        checkpoint.write_own_files(partial, world, trainer)
        self._thread = threading.Thread(
            target=self._write, args=(staged, partial, world, trainer.step, keep),
            name=f"ddl-checkpoint-{trainer.step}", daemon=True)  # see the module's doc
        self._thread.start()

    def _write(self, staged: dict[str, Any], partial: Path, world: World, step: int,
               keep: int) -> None:
        import torch.distributed.checkpoint as dcp

        try:
            dcp.save(staged, checkpoint_id=partial, process_group=self._group)
            if os.environ.get(FAULT_HOLD_ENV) == str(step):
                (partial / f"held-{world.rank}").touch()
                threading.Event().wait()  # until the test kills the run
            checkpoint.commit(partial, world, keep, self._group)
        except BaseException as exc:  # noqa: BLE001 - raised on the training thread instead
            self._failure = exc


def _stager(world: World):
    """DCP's stager: pinned host buffers on a GPU (reused by every save), a copy on a CPU."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    on_gpu = world.device.type == "cuda"
    return DefaultStager(StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))
