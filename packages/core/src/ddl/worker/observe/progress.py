"""Rank 0's progress within an epoch, as people expect it where they look.

On an interactive terminal (rank 0's stdout is a tty: a local run in a shell) one bar per
epoch, redrawn in place at most five times a second::

      epoch 2/3 [##########..........]  45/100  45%  0:03<0:04  2345 samples/s  loss 0.2345

Anywhere else (batch logs under Slurm, pipes, tests) the plain line every ``--log-every``
steps, unchanged::

      epoch 2 step 50/100 loss 0.2345 (rank 0)

Either way the loss is fetched from the device (``loss.item()``, a host sync) only every
``--log-every`` steps, on rank 0; the bar's other numbers are host clocks. A plain ``\\r``
line, not tqdm: tqdm is no dependency of ddl's core.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

REDRAW_S = 0.2  # at most five redraws a second: a terminal write per step would show


class Progress:
    """``begin_epoch``, ``step`` after every optimizer step, ``finish_line`` before anything
    else prints (a checkpoint, the epoch's record)."""

    def __init__(self, is_main: bool, log_every: int, steps_per_epoch: int, epochs: int,
                 global_batch: int, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.on = is_main
        self.bar = is_main and _is_terminal(self.stream)
        self.log_every, self.steps, self.epochs = max(log_every, 1), steps_per_epoch, epochs
        self.global_batch = global_batch
        self.epoch, self.first, self.t0 = 0, 0, time.monotonic()
        self.loss: float | None = None
        self._next = 0.0
        self._drawn = False  # a bar is on the current line

    def begin_epoch(self, epoch: int, position: int) -> None:
        self.epoch, self.first, self.t0 = epoch, position, time.monotonic()
        self._next = 0.0

    def step(self, epoch: int, done: int, loss) -> float | None:
        """After a step (``done`` batches of the epoch behind us); the loss's value when it
        was fetched (every ``log_every`` steps on rank 0), else None."""
        if not self.on:
            return None
        value = None
        if done % self.log_every == 0:
            value = loss.item()
            if not self.bar:
                print(f"  epoch {epoch} step {done}/{self.steps} loss {value:.4f} (rank 0)",
                      flush=True)
                return value
            self.loss = value
        if self.bar:
            now = time.monotonic()
            if now >= self._next or done == self.steps:
                self._next = now + REDRAW_S
                self._draw(done, now)
        return value

    def finish_line(self, keep: bool = True) -> None:
        """End the bar's line (``keep``: leave it standing, else wipe it) so that the next
        print starts on a line of its own; the next step draws the bar again."""
        if self._drawn:
            self.stream.write("\n" if keep else "\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _draw(self, done: int, now: float) -> None:
        self.stream.write("\r" + self.line(done, now, shutil.get_terminal_size().columns)
                          + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def line(self, done: int, now: float, columns: int) -> str:
        """The bar's text for ``done`` steps at monotonic time ``now``, at most ``columns``
        - 1 characters (a full line would wrap on some terminals)."""
        elapsed = now - self.t0
        ran = done - self.first
        per_step = elapsed / ran if ran > 0 else None
        left = f"<{_clock(per_step * (self.steps - done))}" if per_step else ""
        rate = f"  {self.global_batch / per_step:.0f} samples/s" if per_step else ""
        loss = f"  loss {self.loss:.4f}" if self.loss is not None else ""
        tail = (f"  {done}/{self.steps}  {100 * done // max(self.steps, 1)}%  "
                f"{_clock(elapsed)}{left}{rate}{loss}")
        head = f"  epoch {self.epoch}/{self.epochs} "
        width = min(30, columns - 1 - len(head) - len(tail) - 2)
        if width < 5:  # a narrow terminal: no bar, the numbers only
            return (head + tail.lstrip())[:columns - 1]
        filled = width * done // max(self.steps, 1)
        return (head + "[" + "#" * filled + "." * (width - filled) + "]" + tail)[:columns - 1]


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stdout
        return False
