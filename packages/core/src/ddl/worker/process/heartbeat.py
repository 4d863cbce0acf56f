"""A heartbeat per rank, so that a rank which stops (SIGSTOP, a frozen node, a process
stuck where no Python runs) is named in one line within ``--hang-timeout`` seconds, instead
of surfacing as the collective timeout's traceback ten minutes later.

Each rank's thread adds 1 to its own counter in the rendezvous store every
``timeout / 6`` seconds, through a store connection of its own (a collective or a store
wait of the main thread never holds it up). Rank 0's thread also watches every other rank,
and rank 1's watches rank 0: a counter that did not move for ``timeout`` seconds of the
watcher's clock means that rank is hung. The watcher then

* kills the hung process if it runs on this host (a stopped process ignores the SIGTERM
  with which launchers end a run, until their own grace period ends),
* writes the failure record the local launcher turns into the run's one line (or prints
  the line itself under Slurm, where each rank speaks for itself), and
* ends its own process, which ends the run (the local agent, torchrun or srun stop the rest).

Under srun rank 0's own process hosts the store, so a stopped rank 0 takes the store with
it: rank 1 then counts the store's silence as rank 0's.

A watcher that was itself starved of CPU (its own look came late) starts counting again
rather than blaming the others. A rank that finished marks itself done and is not watched.
What it cannot see: a rank whose main thread waits forever while its Python threads still
run (a deadlock in the workload); that ends at the collective timeout.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from datetime import timedelta

from ddl.contract.world import World

_PREFIX = "ddl/heartbeat/"
#: The heartbeat's exit code: the run failed (the line names the hung rank).
HUNG_EXIT = 1


class Heartbeat:
    """The beating (and, on ranks 0 and 1, watching) thread of one rank; :meth:`stop` at
    the end of the run."""

    def __init__(self, store, world: World, timeout_s: float, run_dir) -> None:
        self.store = store
        self.world = world
        self.timeout_s = timeout_s
        self.interval_s = max(timeout_s / 6, 0.2)
        self.run_dir = run_dir
        self.stopped = threading.Event()
        self.watched = _watched_by(world.rank, world.size)
        self.where: dict[int, str] = {}  # "HOST PID" of each watched rank
        store.set(f"{_PREFIX}who/{world.rank}", f"{socket.gethostname()} {os.getpid()}")
        self._learn_where_at_start()
        self.answered = time.monotonic()  # the store's last answer to this rank
        threading.Thread(target=self._run, name="ddl-heartbeat", daemon=True).start()
        if world.rank == 1 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            threading.Thread(target=self._watch_the_store, name="ddl-heartbeat-store",
                             daemon=True).start()

    def stop(self) -> None:
        """This rank is done (finished or failing on its own): no longer watched. Bounded:
        a store whose host is stopped would hold the call forever."""
        self.stopped.set()
        marking = threading.Thread(target=self._mark_done, daemon=True)
        marking.start()
        marking.join(timeout=5)

    def _mark_done(self) -> None:
        try:
            self.store.set(f"{_PREFIX}done/{self.world.rank}", "1")
        except Exception:  # noqa: BLE001, S110 - the store may be gone with a failed run
            pass

    def _run(self) -> None:
        counts = {r: -1 for r in self.watched}
        since = {r: time.monotonic() for r in self.watched}
        last_look = time.monotonic()
        while not self.stopped.wait(self.interval_s):
            try:
                self.store.add(f"{_PREFIX}beat/{self.world.rank}", 1)
                now = self.answered = time.monotonic()
                if now - last_look > 3 * self.interval_s:  # we were starved: no verdict
                    since = dict.fromkeys(since, now)
                last_look = now
                for r in self.watched:
                    self._learn_where(r)
                    count = self.store.add(f"{_PREFIX}beat/{r}", 0)
                    if count != counts[r]:
                        counts[r], since[r] = count, now
                    elif now - since[r] > self.timeout_s and not self._done(r):
                        self._hung(r, now - since[r])
            except Exception:  # noqa: BLE001 - the store closed: the run is ending
                self.stopped.set()  # (a stopped host does not close it: calls just wait)
                return

    def _learn_where_at_start(self) -> None:
        """Where each watched rank runs, before this rank beats: every rank says so as it
        starts its heartbeat, right after joining, so the wait is short. Learnt only at the
        first pass, a beat later, a rank frozen before that pass was named without its pid
        and not killed: forked workers reached their first checkpoint within one interval
        (tests/distributed/test_faults_signals.py). Bounded by the hang timeout; a rank that
        has not said so by then is looked up on every pass (:meth:`_learn_where`)."""
        keys = [f"{_PREFIX}who/{r}" for r in self.watched]
        if not keys:
            return
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except Exception:  # noqa: BLE001, S110 - not yet there: learnt later, or never
            return
        for rank in self.watched:
            self._learn_where(rank)

    def _learn_where(self, rank: int) -> None:
        """Where ``rank`` runs, once it has said so. Looked up on every pass, not only at its
        first beat: a rank stopped before its first beat (a quick run reaches its first
        checkpoint within one interval) would otherwise be named without its pid, and not
        killed. ``check`` first: a ``get`` of a missing key waits for it."""
        key = f"{_PREFIX}who/{rank}"
        if rank not in self.where and self.store.check([key]):
            self.where[rank] = self.store.get(key).decode()

    def _watch_the_store(self) -> None:
        """Under srun rank 0's own process hosts the store: a stopped rank 0 takes it along,
        and a store call then waits forever (TCPStore's add has no timeout). Rank 1 counts
        the store's silence as rank 0's."""
        while not self.stopped.wait(self.interval_s):
            silent = time.monotonic() - self.answered
            if silent > self.timeout_s + self.interval_s:
                self._hung(0, silent)

    def _done(self, rank: int) -> bool:
        return self.store.check([f"{_PREFIX}done/{rank}"])

    def _hung(self, rank: int, silent_s: float) -> None:
        from ddl.worker.process import crash

        if self.stopped.is_set():
            return
        host, _, pid = self.where.get(rank, "? ?").partition(" ")
        ended = ""
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 9)
                ended = f"; its process (pid {pid}) was killed"
            except OSError:
                pass
        where = f"pid {pid} on {host}" if not ended else f"on {host}"
        message = (f"rank {rank} ({where}) sent no heartbeat for {silent_s:.0f} s "
                   f"(--hang-timeout {self.timeout_s:g}): stopped (SIGSTOP, a frozen node) or "
                   f"stuck outside Python{ended}; the run was ended, --resume auto continues "
                   "from the newest checkpoint")
        if not crash.record_line(self.run_dir / "logs", rank, message):
            print(f"ddl: error: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(HUNG_EXIT)


def _watched_by(rank: int, size: int) -> list[int]:
    """Rank 0 watches everyone else; rank 1 watches rank 0."""
    if size < 2:
        return []
    return list(range(1, size)) if rank == 0 else [0] if rank == 1 else []


def start(world: World, timeout_s: float, run_dir) -> Heartbeat | None:
    """The heartbeat of this rank, or None in a world of one or with ``timeout_s`` 0."""
    if world.size < 2 or not timeout_s or "MASTER_ADDR" not in os.environ:
        return None
    return Heartbeat(_own_connection(timeout_s), world, timeout_s, run_dir)


def _own_connection(timeout_s: float):
    """A client of the rendezvous store (the one ``distributed.join_store`` joined), in the
    same key space as this attempt's workers."""
    import torch.distributed as dist

    from ddl.worker.process.distributed import this_attempts_keys

    return this_attempts_keys(dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=timedelta(seconds=timeout_s)))
