"""The run's metrics also as TensorBoard event files, in ``RUN_DIR/tensorboard`` (rank 0):

* per logged step (``--log-every``): ``train/step_loss``, rank 0's loss of that step (the
  value the progress line fetched; no extra host sync);
* per epoch: ``train/<metric>`` and ``val/<metric>`` (averaged over all ranks, as in
  metrics.jsonl), ``perf/samples_per_s``, ``perf/data_wait_share`` (rank 0's time waiting
  for batches over the epoch's training time), ``perf/epoch_time_s`` and ``opt/lr``.

Every value is logged against the optimizer step of the whole run, so step and epoch curves
share one axis. A resumed run drops the events its previous attempt wrote past the step it
resumes from (``purge_step``). Read them with ``tensorboard --logdir RUN_DIR/tensorboard``
(or a parent directory, to compare runs).

torch.utils.tensorboard needs the ``tensorboard`` package (``pip install 'ddl[tensorboard]'``;
the development venv has it); without it the run says so in one line and writes no event
files. A write that fails (a full disk) says so once and stops the event files, not the
run. TensorBoard writes in a thread of its own, which hands its error to the next call of
the writer; the thread's own traceback (threading's excepthook) is kept off the terminal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddl.settings import rundir

#: Errors that ended a TensorBoard writer thread, oldest first (see _quiet_writer_threads).
_thread_errors: list[BaseException] = []


class Board:
    """Rank 0's SummaryWriter, made harmless: every call after a failure does nothing."""

    def __init__(self, writer, say: Callable[[str], None], seen: int = 0) -> None:
        self.writer, self.say = writer, say
        self.seen = seen  # writer-thread errors from before this board: not its own

    def step_loss(self, step: int, value: float) -> None:
        self._log({"train/step_loss": value}, step)

    def epoch(self, record: dict[str, Any], step: int) -> None:
        """One metrics.jsonl record (ddl.worker.train.epoch.validate), then a flush."""
        values = {f"{split}/{name}": v for split in ("train", "val")
                  for name, v in record.get(split, {}).items()}
        values.update({"perf/samples_per_s": record["samples_per_s"],
                       "perf/data_wait_share": record["data_wait_share"],
                       "perf/epoch_time_s": record["time_s"], "opt/lr": record["lr"]})
        self._log(values, step, flush=True)

    def close(self) -> None:
        """Flush and close; a thread error nothing has reported yet (the last events'
        write failed after the last call) is said here."""
        if self.writer is not None and self._call(self.writer.close):
            self.writer = None
            if len(_thread_errors) > self.seen:
                self._fail(_thread_errors[-1])

    def _log(self, values: dict[str, Any], step: int, flush: bool = False) -> None:
        if self.writer is None:
            return
        numbers = {t: v for t, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tag, value in numbers.items():
            if not self._call(self.writer.add_scalar, tag, value, step):
                return
        if flush:
            self._call(self.writer.flush)

    def _call(self, method, *args) -> bool:
        try:
            method(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: the run goes on
            self._fail(exc)
            return False

    def _fail(self, exc: BaseException) -> None:
        self.writer = None
        self.say(f"ddl: tensorboard: cannot write event files ({type(exc).__name__}: "
                 f"{exc}); no more event files in this run")


def _quiet_writer_threads() -> None:
    """Keep the traceback of a TensorBoard writer thread that failed (a full disk) off
    stderr: TensorBoard raises the same error again in the next call of the writer, where
    :class:`Board` says it in one line. Other threads' errors go to the hook as before."""
    previous = threading.excepthook
    if getattr(previous, "ddl_tensorboard", False):
        return  # already installed in this process

    def hook(args) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(
                args.exc_value, Exception):
            _thread_errors.append(args.exc_value)
            return
        previous(args)

    hook.ddl_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def open_board(run_dir: Path, is_main: bool, purge_step: int,
               say: Callable[[str], None]) -> Board | None:
    """Rank 0's event writer, or None (other ranks; tensorboard not installed: said once)."""
    if not is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "tensorboard"
        say("ddl: tensorboard not installed; no event files" if missing else
            f"ddl: tensorboard unusable ({exc}); no event files")
        return None
    _quiet_writer_threads()  # before the writer starts its thread
    seen = len(_thread_errors)
    try:
        writer = SummaryWriter(log_dir=str(run_dir / rundir.TENSORBOARD),
                               purge_step=purge_step or None)
    except Exception as exc:  # noqa: BLE001 - a directory it cannot create: not fatal
        say(f"ddl: tensorboard: cannot write event files ({exc}); no event files")
        return None
    return Board(writer, say, seen)
