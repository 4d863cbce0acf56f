"""The live state of a running job, for ``ddl watch`` (ddl.commands.watch).

Each rank keeps one small JSON file, ``RUN_DIR/live/rank-<r>.json``: where it is (epoch,
step within the epoch, phase), how fast it goes (its recent step time and the global
samples/s that rate gives), rank 0's latest logged loss, the newest CPU/GPU utilisation
reading (ddl.worker.observe.utilisation) and its memory (ddl.worker.memory.current), stamped with
the wall-clock time. At the end the file says ``state`` finished, stopped or failed.

What it costs a step: one clock read. The file is replaced (written aside, renamed: a reader
never sees half of it) at most every ``interval`` seconds (the run plan's: 2, longer for
jobs beyond 256 ranks, or ``--live-every``), from the training loop itself, so an old time
stamp means this rank's loop stopped moving (``ddl watch`` marks it stale). No
collective and no device sync is added: the loss is the one the progress line already
fetched (every ``--log-every`` steps, rank 0). A write that fails (a full disk) is skipped:
the live state must never end a run; checkpoints and results report such errors.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ddl.settings import rundir
from ddl.settings.plan import LIVE_EVERY_S


class LiveState:
    """One rank's live file. ``step`` after every optimizer step (writes when due),
    ``phase`` when the rank starts something else, ``end`` once at the end."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, about: dict[str, Any],
                 sampler=None, memory=None, interval: float = LIVE_EVERY_S) -> None:
        """``about``: the fixed facts (plugin, strategy, epochs, steps_per_epoch,
        global_batch, ...); ``sampler``: a utilisation.Sampler; ``memory``: a callable
        giving this process's memory now."""
        self.path = rundir.live_file(run_dir, rank)
        self.interval = interval
        self.sampler, self.memory = sampler, memory
        self.global_batch = about.get("global_batch", 0)
        self.doc: dict[str, Any] = {
            "rank": rank, "world_size": world_size, "host": socket.gethostname(),
            "pid": os.getpid(), **about, "write_interval_s": interval, "state": "running",
            "phase": "starting", "epoch": None, "step_in_epoch": 0, "step": 0,
            "samples_per_s": None, "step_time_s": None, "loss": None, "loss_step": None,
            "started": time.time()}
        self._next = 0.0  # monotonic time of the next write
        self._at = (None, 0, 0)  # (epoch, batches done in it, run step): set every step
        self._mark = (time.monotonic(), 0)  # (time, run step) the recent rate counts from
        try:
            self.path.parent.mkdir(exist_ok=True)
            if rank == 0:  # files of a resumed run's larger world would look like ranks
                for old in self.path.parent.glob("rank-*.json"):
                    if _rank_of(old) >= world_size:
                        old.unlink(missing_ok=True)
        except OSError:
            pass
        self._write()

    def begin_epoch(self, epoch: int, position: int, step: int) -> None:
        """An epoch's steps start (at batch ``position`` when resumed inside it)."""
        self._at = (epoch, position, step)
        self.phase("training")

    def step(self, epoch: int, done: int, step: int) -> None:
        """After an optimizer step: ``done`` batches of ``epoch`` behind us, ``step``
        optimizer steps in the whole run. Writes only when the interval has passed."""
        self._at = (epoch, done, step)
        now = time.monotonic()
        if now >= self._next:
            self._write(now)

    def loss(self, value: float, step: int) -> None:
        """The loss a progress line fetched (rank 0); goes out with the next write."""
        self.doc.update(loss=value, loss_step=step)

    def phase(self, name: str) -> None:
        """This rank now does ``name`` (training, validating, checkpointing, testing)."""
        if name == "training":  # the rate counts steps only, not the pause before
            self._mark = (time.monotonic(), self._at[2])
        self.doc["phase"] = name
        self._write()

    def end(self, state: str, reason: str | None = None) -> None:
        """The last write: ``state`` is finished, stopped or failed (``reason`` says why)."""
        self.doc.update(state=state, phase="done", reason=reason)
        self._write()

    def _write(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._next = now + self.interval
        doc = self.doc
        epoch, done, step = self._at
        then, before = self._mark
        if step > before and now > then:  # the rate since the last write (or epoch start)
            seconds = (now - then) / (step - before)
            doc.update(step_time_s=seconds, samples_per_s=self.global_batch / seconds)
            self._mark = (now, step)
        doc.update(epoch=epoch, step_in_epoch=done, step=step)
        if self.sampler is not None:
            doc.update(self.sampler.latest())
        if self.memory is not None:
            doc["memory"] = self.memory()
        doc["time"] = time.time()
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:  # no fsync: the file is replaced again in seconds, and lost with a crash anyway
            tmp.write_text(json.dumps(doc, default=str))
            os.replace(tmp, self.path)
        except OSError:
            pass


def _rank_of(path: Path) -> int:
    try:
        return int(path.stem.rpartition("-")[2])
    except ValueError:
        return -1
