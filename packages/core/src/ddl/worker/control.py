"""Per-step decisions all ranks must take together: stop on a non-finite loss, or stop
cleanly because someone asked (a Slurm job nearing its time limit).

Once per optimizer step every rank contributes two facts to one small all-reduce: "my loss
is not finite" and "a stop was requested here". All ranks then act alike, so nobody waits
in a collective for a rank that already left.

A stop is requested by SIGUSR1 (sent to the workers) or by a file ``STOP`` in the run
directory (what ddl's batch scripts create when Slurm signals the job; also a handy manual
brake). Rank 0 looks for the file at most once a second: one stat per second is cheap
even on a parallel file system.
"""

from __future__ import annotations

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


class TrainingDiverged(DdlError):
    """A non-finite loss; reported once (by rank 0), naming the ranks that saw it."""

    once = True


class StepGuard:
    def __init__(self, world: World, run_dir: Path) -> None:
        self.world = world
        self.stop_file = Path(run_dir) / STOP_FILE
        self._signalled = False
        self._next_look = 0.0
        try:
            signal.signal(signal.SIGUSR1, self._on_signal)
        except ValueError:  # not the main thread (an embedding application): file only
            pass

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def _stop_requested(self) -> bool:
        if self._signalled:
            return True
        now = time.monotonic()
        if self.world.is_main and now >= self._next_look:
            self._next_look = now + 1.0
            return self.stop_file.exists()
        return False

    def after_step(self, loss: torch.Tensor, step: int, epoch: int, batch: int,
                   last_checkpoint: Callable[[], Path | None]) -> str | None:
        """Raise TrainingDiverged on any rank's non-finite loss; return the reason to stop
        cleanly after this step, or None to go on."""
        import torch
        import torch.distributed as dist

        flags = torch.zeros(self.world.size + 1, device=loss.device)
        flags[self.world.rank] = (~torch.isfinite(loss.detach().float())).any().float()
        flags[-1] = float(self._stop_requested())
        if self.world.size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        bad = flags[:-1].nonzero().flatten().tolist()
        if bad:
            ranks = ", ".join(str(r) for r in bad[:8]) + (" ..." if len(bad) > 8 else "")
            message = (f"non-finite loss at step {step} (epoch {epoch}, batch {batch}) on "
                       f"rank(s) {ranks}; last good checkpoint: {last_checkpoint() or 'none'}; "
                       "lower the learning rate (--lr) or check the data, then resume from "
                       "that checkpoint")
            # Rank 0 says it before anyone leaves: a rank that exits first makes the launcher
            # stop the others, which could cut rank 0 off mid-sentence.
            if self.world.is_main:
                print(f"ddl: error: {message}", file=sys.stderr, flush=True)
            if self.world.size > 1:
                dist.barrier()
            raise TrainingDiverged(message)
        if flags[-1].item():
            return "SIGUSR1" if self._signalled else f"{self.stop_file} found"
        return None
