"""Per-step decisions all ranks must take together: stop on a non-finite loss, or stop
cleanly because someone asked (a Slurm job nearing its time limit).

At each check (every ``--check-every`` steps) every rank contributes two facts to one small
all-reduce: "my loss was not finite" and "a stop was requested here". All ranks then act
alike, so nobody waits in a collective for a rank that already left.

A stop is requested by SIGUSR1 (sent to the workers) or by a file ``STOP`` in the run
directory (what ddl's batch scripts create when Slurm signals the job; also a handy manual
brake). Rank 0 looks for the file at most once a second: one stat per second is cheap
even on a parallel file system. Rank 0 removes the file when it honours the stop, so the
``--resume auto`` it suggests does not stop again at once.

The SIGUSR1 handler is installed when the worker process starts (:func:`listen`), not only
when training begins: a signal during set-up is kept until the first step instead of killing
the worker (SIGUSR1's default action).
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ddl.contract.errors import DdlError

if TYPE_CHECKING:
    import torch

    from ddl.contract.world import World

STOP_FILE = "STOP"
#: Written by a local launcher that passed a signal on as SIGUSR1 (ddl.launch.local): the
#: name of the signal it received, so the stop line names that one (SIGTERM), not SIGUSR1.
STOP_SIGNAL_FILE = ".stop-signal"
_signalled: list[int] = []  # SIGUSR1 received by this process (kept from start-up on)


def request_stop(signum: int, frame=None) -> None:
    """A signal handler: stop cleanly after the current step (all ranks agree on it)."""
    _signalled.append(signum)


def stop_requested() -> bool:
    """Whether a stop signal came and has not been honoured yet."""
    return bool(_signalled)


def listen(*signals: signal.Signals) -> None:
    """Take SIGUSR1 (and ``signals``) as a stop request from now on (main thread only)."""
    try:
        for signum in (signal.SIGUSR1, *signals):
            signal.signal(signum, request_stop)
    except ValueError:  # not the main thread (an embedding application): the file only
        pass


class TrainingDiverged(DdlError):
    """A non-finite loss; reported once (by rank 0), naming the ranks that saw it."""

    once = True


class StepGuard:
    """Checks every ``every`` optimizer steps (``--check-every``), and whenever the trainer
    asks (before a checkpoint, at an epoch's end): one small all-reduce and a host sync per
    check instead of per step. Between checks a step costs one list append: the losses of
    the window are kept (detached, on their device) and looked at together at the check.

    A check is one stacked tensor: the window's losses and this rank's stop flag, summed
    over the ranks in float64. A step whose summed loss is not finite had a non-finite loss
    on some rank (NaN or infinity survive a sum); only then does a second, rare all-reduce
    find which ranks. Two operators per check on the way there (on MNIST tiny's CPU step a
    check of per-rank flags, eight operators, cost ~0.5 ms, 8 % of a step).

    With several ranks a periodic check does not wait for its all-reduce: it is issued
    asynchronously and read at the next step, whose compute hides its latency (gloo on
    this 2-core VM: ~1.5 ms per check, 2 % of MNIST tiny's step at ``--check-every 10``).
    So is the check of an epoch's last step, read by :meth:`settle` once the epoch's steps
    are done. A forced check waits at once. The price: a non-finite loss or a stop request
    is acted on up to ``every`` steps late (never after a checkpoint of non-finite weights:
    one is checked first, synchronously)."""

    def __init__(self, world: World, run_dir: Path, every: int = 1) -> None:
        self.world = world
        self.every = max(every, 1)
        self.stop_file = Path(run_dir) / STOP_FILE
        self._next_look = 0.0
        self._window: list[tuple[int, torch.Tensor]] = []  # (step, loss) since the last check
        # a check's all-reduce in flight: (its work, its summed values, its window, its step)
        self._pending: tuple[object, torch.Tensor, list, int] | None = None
        self._flags: dict[bool, torch.Tensor] = {}  # "stop requested here": one per value
        listen()

    def _stop_requested(self) -> bool:
        if _signalled:
            return True
        now = time.monotonic()
        if self.world.is_main and now >= self._next_look:
            self._next_look = now + 1.0
            return self.stop_file.exists()
        return False

    def _passed_on(self) -> str | None:
        """The signal the launcher received, when it passed one on as SIGUSR1."""
        try:
            name = (self.stop_file.parent / STOP_SIGNAL_FILE).read_text().strip()
        except OSError:
            return None
        return name if name in signal.Signals.__members__ else None

    def after_step(self, loss: torch.Tensor, step: int, epoch: int, batch: int,
                   last_checkpoint: Callable[[], Path | None], force: bool = False,
                   last: bool = False) -> str | None:
        """Raise TrainingDiverged on any rank's non-finite loss; return the reason to stop
        cleanly after this step, or None to go on. Collective on the checking steps only
        (the same on every rank: ``step`` counts alike and ``force`` is decided alike).
        ``last``: the epoch's last step, checked now and read by :meth:`settle`."""
        import torch.distributed as dist

        self._window.append((step, loss.detach()))  # no operator, no host sync
        reason = None
        if self._pending is not None:  # the last periodic check, issued a step ago
            reason = self._read_pending(epoch, last_checkpoint)
            # a stop writes a checkpoint: this step's loss is checked first (every rank
            # agreed on the stop, so every rank checks)
            force = force or reason is not None
        if not force and not last and step % self.every:
            return None
        window, self._window = self._window, []
        values = self._values(window)
        if self.world.size > 1:
            if not force:  # read later: the next step's compute (or the epoch's end) hides it
                work = dist.all_reduce(values, op=dist.ReduceOp.SUM, async_op=True)
                self._pending = (work, values, window, step)
                return None
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return self._act(values, window, step, epoch, last_checkpoint) or reason

    def settle(self, epoch: int, last_checkpoint: Callable[[], Path | None]) -> str | None:
        """Read a check still in flight (the epoch's last step's): raise or return the
        reason to stop, as :meth:`after_step` would have."""
        return self._read_pending(epoch, last_checkpoint) if self._pending else None

    def _read_pending(self, epoch: int, last_checkpoint: Callable[[], Path | None]
                      ) -> str | None:
        work, values, window, checked = self._pending
        self._pending = None
        work.wait()
        return self._act(values, window, checked, epoch, last_checkpoint)

    def _values(self, window: list) -> torch.Tensor:
        """The window's losses and this rank's stop flag, stacked (float64, to be summed
        over ranks without overflowing): two operators, no host sync."""
        import torch

        stop = self._stop_requested()
        device = window[0][1].device
        flag = self._flags.get(stop)
        if flag is None or flag.device != device:
            flag = self._flags[stop] = torch.tensor(float(stop), device=device)
        # a loss of any shape is non-finite if any element is: its sum is then inf or nan
        return torch.stack([loss if loss.dim() == 0 and loss.dtype == torch.float32
                            else loss.float().sum() for _, loss in window]
                           + [flag]).to(torch.float64)

    def _act(self, values: torch.Tensor, window: list, step: int, epoch: int,
             last_checkpoint: Callable[[], Path | None]) -> str | None:
        """The summed values of the check at ``step`` (over ``window``): raise on a
        non-finite loss, return the reason to stop, or None."""
        *losses, stop = values.tolist()  # the one host sync per check
        if not all(math.isfinite(v) for v in losses):
            self._diverged(window, step, epoch, last_checkpoint)
        if stop:
            reason = self._passed_on() or (signal.Signals(_signalled[0]).name if _signalled
                                           else f"{self.stop_file} found")
            _signalled.clear()  # honoured (an embedding process may train again)
            if self.world.is_main:  # consumed: the suggested --resume auto must not stop again
                self.stop_file.unlink(missing_ok=True)
            return reason
        return None

    def _diverged(self, window: list, step: int, epoch: int,
                  last_checkpoint: Callable[[], Path | None]) -> None:
        """Some rank's loss in ``window`` was not finite: find which ranks and from which
        step (every rank takes this path: the sums are the same everywhere), say it once
        and raise."""
        import torch
        import torch.distributed as dist

        mine = [s for s, loss in window if not torch.isfinite(loss.float()).all()]
        first = torch.zeros(self.world.size, dtype=torch.int64)
        first[self.world.rank] = mine[0] if mine else 0
        if self.world.size > 1:
            first = first.to(window[0][1].device)
            dist.all_reduce(first, op=dist.ReduceOp.SUM)
        first = first.tolist()
        bad = [rank for rank, s in enumerate(first) if s]
        ranks = ", ".join(str(r) for r in bad[:8]) + (" ..." if len(bad) > 8 else "")
        since = min((first[r] for r in bad), default=step)
        seen = "" if since == step else f", seen at the check of step {step}"
        message = (f"non-finite loss at step {since} (epoch {epoch}{seen}) on "
                   f"rank(s) {ranks or 'unknown'}; last good checkpoint: "
                   f"{last_checkpoint() or 'none'}; lower the learning rate (--lr) or check "
                   "the data, then resume from that checkpoint")
        # Rank 0 says it before anyone leaves: a rank that exits first makes the launcher
        # stop the others, which could cut rank 0 off mid-sentence.
        if self.world.is_main:
            print(f"ddl: error: {message}", file=sys.stderr, flush=True)
        if self.world.size > 1:
            dist.barrier()
        raise TrainingDiverged(message)
