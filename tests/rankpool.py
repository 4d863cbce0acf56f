"""Persistent rank pools: N worker processes started once per test session, each test sending
them a cell to run.

Starting N processes (python, torch, plugins) and meeting at a rendezvous takes several
seconds per run, far more than the 3 steps most equivalence cells train. A pool pays that once
per world size per pytest process (per xdist worker): its ranks join one gloo process group
and then wait for cells - a picklable module-level function plus arguments - which every rank
runs, sending back its result. The pattern is torch's ``MultiProcContinuousTest``
(torch/testing/_internal/common_distributed.py); this is a small version of our own, because
that one is internal API bound to unittest classes.

- Ports without races: the parent opens the rendezvous store itself (``TCPStore`` with
  ``port=0``: the kernel picks a free port and the store holds it) and the ranks join it, so
  no port is chosen first and bound later by someone else.
- A failing cell: any exception on any rank fails the test with the rank(s) and the end of
  each traceback; a cell that does not finish within its timeout (a hang in a collective one
  rank skipped) fails naming the ranks that did not answer. Either way the pool is killed
  and the next cell starts a fresh one, because a failed rank can leave the others inside a
  collective that will never complete.
- After every cell each rank destroys the process groups and the library state the cell
  created (DeviceMesh groups, DTensor's RNG tracker, Accelerate's singletons), and each
  cell runs in a thread of its own (DTensor's caches are per thread), so a strategy run
  leaves nothing behind for the next one.
- Ranks run like ddl's workers: ``OMP_NUM_THREADS=1`` and one intra-op thread, the launcher's
  environment variables (RANK, WORLD_SIZE, ...). They are daemonic and die with the parent
  (PR_SET_PDEATHSIG), and ``close_all`` (atexit, and the session fixture's finaliser) stops
  them: no orphans.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

DEFAULT_TIMEOUT_S = 600.0
# After the first rank fails, how long the others get to finish or fail too (a rank blocked
# in a collective with the failed one never will).
FAILURE_GRACE_S = 5.0
_TRACEBACK_LINES = 12


class CellFailed(AssertionError):
    """A cell raised on some rank, a rank died, or the cell ran past its timeout."""


class RankPool:
    """``size`` ranks in one gloo process group, started on first use."""

    def __init__(self, size: int, collective_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.size = size
        self.collective_timeout_s = collective_timeout_s
        self.starts = 0  # how many times the ranks were (re)started
        self._store = None
        self._procs: list = []
        self._conns: list = []
        self._busy = False  # a cell is in flight: closing must not wait for the ranks

    @property
    def running(self) -> bool:
        return bool(self._procs)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def run(self, cell: Callable[..., Any], *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
            **kwargs: Any) -> list[Any]:
        """Run ``cell(*args, **kwargs)`` on every rank; return the results by rank."""
        from multiprocessing.connection import wait

        self._start()
        gone = [(rank, proc.exitcode) for rank, proc in enumerate(self._procs)
                if not proc.is_alive()]
        if gone:  # ended between cells: the cell has not been sent; run it on a fresh pool
            print(f"rankpool: ranks (rank, exit code) {gone} of the pool of {self.size} "
                  "ended since its last cell; starting a fresh pool", file=sys.stderr)
            self.close(kill=True)
            self._start()
        payload = pickle.dumps((cell, args, kwargs))
        self._busy = True
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError as exc:  # died since the last cell (killed from outside?)
                self.close(kill=True)
                raise CellFailed(f"rank {rank} of the pool of {self.size} is gone ({exc}); "
                                 "the next cell starts a fresh pool") from None
        pending = dict(zip(self._conns, range(self.size)))
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for conn in wait(list(pending), timeout=left):
                rank = pending.pop(conn)
                try:
                    status, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._procs[rank].join(timeout=5)
                    status, value = "died", f"exited (code {self._procs[rank].exitcode})"
                if status == "ok":
                    results[rank] = value
                else:
                    failures[rank] = value
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        self._busy = False
        if failures or pending:
            self.close(kill=True)  # the survivors may sit in a collective forever
            raise CellFailed(_describe(cell, self.size, failures, sorted(pending.values()),
                                       timeout_s, bool(failures)))
        return [results[rank] for rank in range(self.size)]

    def _start(self) -> None:
        if self._procs:
            return
        import torch.distributed as dist

        # port 0: the kernel picks a free port, and this store holds it from now on
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=60))
        forks = context()
        for rank in range(self.size):
            ours, theirs = forks.Pipe()
            proc = forks.Process(target=_serve, name=f"rankpool-{self.size}-rank{rank}",
                                 args=(rank, self.size, self._store.port, theirs,
                                       self.collective_timeout_s),
                                 daemon=True)
            proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(ours)
        self.starts += 1
        try:
            self.run(_joined, timeout_s=120)
        except CellFailed as exc:
            raise CellFailed(f"rank pool of {self.size} did not start: {exc}") from None

    def close(self, kill: bool = False) -> None:
        """Stop the ranks: politely (they leave the process group and exit), or by SIGKILL
        (asked for, or a cell is still running: e.g. the test was interrupted)."""
        kill = kill or self._busy
        for conn in self._conns:
            if not kill:
                try:
                    conn.send_bytes(pickle.dumps(None))
                except OSError:
                    pass
        for proc in self._procs:
            if not kill:
                proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=30)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store, self._busy = [], [], None, False


# What every rank imports anyway (several seconds each: torch, and through torchvision and
# transformers torch._dynamo), and what a `ddl` command imports (tests/cli_fork.py forks CLI
# runs from the same server). A fork server imports them once per pytest process and forks
# each rank (or command) from itself, so a pool of N pays the imports once, not N times, and
# a restarted pool not at all. Not a fork of this process: it holds threads and an OpenMP
# pool, which a fork would copy half-alive; the fork server is a fresh interpreter that has
# run nothing. (Its sys.path is the interpreter's own: modules of tests/ load in each child.)
PRELOAD = ["torch", "torch.distributed", "torchvision", "transformers", "datasets",
           "ddl.worker.train.trainer", "ddl.commands.cli", "ddl.commands.train", "ddl.launch.local",
           "torch.distributed.launcher.api"]
_server_env: list[dict[str, str]] = []
_SESSION_ENV = dict(os.environ)  # at import: conftest imports this (via cli_fork) first


def context():
    """multiprocessing's forkserver context with PRELOAD, its server running (one per pytest
    process)."""
    import multiprocessing
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    if not _server_env:
        context.set_forkserver_preload(PRELOAD)  # a module that fails to import is skipped
        # The server starts with the session's environment, not that of the test that
        # happens to start it (a PATH or HF_* of its own would follow every later fork).
        during_test = dict(os.environ)
        os.environ.clear()
        os.environ.update(_SESSION_ENV)
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(during_test)
        _server_env.append(_SESSION_ENV)
    return context


def fork_server_env() -> dict[str, str]:
    """The environment the fork server was started with (before its imports)."""
    context()
    return _server_env[0]


class RankPools(dict):
    """One lazily started pool per world size."""

    def __missing__(self, size: int) -> RankPool:
        self[size] = RankPool(size)
        return self[size]

    def close_all(self) -> None:
        for pool in self.values():
            pool.close()


_pools = RankPools()
atexit.register(_pools.close_all)


def pools() -> RankPools:
    """This process's pools (the session fixture ``rank_pools`` hands them to tests)."""
    return _pools


def _describe(cell, size: int, failures: dict[int, str], silent: list[int],
              timeout_s: float, after_failure: bool) -> str:
    name = f"{getattr(cell, '__module__', '?')}.{getattr(cell, '__qualname__', cell)}"
    ranks = ", ".join(map(str, sorted(failures))) or "-"
    lines = [f"cell {name} on {size} ranks failed on rank(s) {ranks}"]
    for rank, text in sorted(failures.items()):
        lines.append(f"--- rank {rank}: {text}")
    if silent:
        why = (f"{FAILURE_GRACE_S:g} s after the first failure (waiting for it in a "
               "collective?)" if after_failure else
               f"the cell's {timeout_s:g} s timeout (a hang: a collective some rank skipped?)")
        lines.append(f"rank(s) {', '.join(map(str, silent))} did not answer within {why}")
    lines.append("the pool was stopped; the next cell starts a fresh one")
    return "\n".join(lines)


# --- the rank side ----------------------------------------------------------------------

def _serve(rank: int, size: int, port: int, conn, collective_timeout_s: float) -> None:
    """A rank's main loop: join the group, then run cells until told to stop."""
    os.environ.update({"OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    _die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=collective_timeout_s))
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the parent is gone
            break
        if message is None:
            break
        reply = _in_own_thread(*message)
        _forget_cell_state()
        try:
            conn.send_bytes(pickle.dumps(reply))
        except Exception as exc:  # noqa: BLE001 - e.g. a result that does not pickle
            conn.send_bytes(pickle.dumps(("error", f"result not sendable: {_summary(exc)}")))
    dist.destroy_process_group()
    conn.close()
    os._exit(0)  # skip interpreter teardown (gloo's can abort: ddl.worker.process.entry.exit_now)


def _in_own_thread(cell, args, kwargs) -> tuple[str, Any]:
    """("ok", result) or ("error", summary) of ``cell`` run in a thread of its own. A
    DeviceMesh equals every other of its shape made in the same thread, and DTensor keeps
    per-thread caches keyed by it: a later cell's mesh would find entries holding an
    earlier cell's mesh, whose process groups are destroyed. A fresh thread per cell is a
    fresh key, as a fresh process would be."""
    import threading

    reply: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            reply.append(("ok", cell(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
            reply.append(("error", _summary(exc)))

    thread = threading.Thread(target=run, name="cell")
    thread.start()
    thread.join()
    return reply[0]


def _joined() -> int:
    """The first cell of every pool: all ranks are in the process group."""
    import torch
    import torch.distributed as dist

    one = torch.ones(1)
    dist.all_reduce(one)
    return int(one.item())


def _summary(exc: BaseException) -> str:
    """The exception line first, then the traceback's last lines (where it was raised)."""
    lines = traceback.format_exception(exc)
    text = "".join(lines).rstrip().splitlines()
    head = traceback.format_exception_only(exc)[-1].strip()
    return head + "\n" + "\n".join(text[-_TRACEBACK_LINES:])


def _forget_cell_state() -> None:
    """Destroy what a cell's strategy created, so the next cell starts as a fresh process
    would: sub-groups (DeviceMesh dimensions, pipeline groups), DTensor's RNG tracker (it
    keeps the mesh it was first used with), Accelerate's process-wide state."""
    import gc
    import sys

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    for group in list(c10d._world.pg_map):
        if group is not default:
            dist.destroy_process_group(group)
    random = sys.modules.get("torch.distributed.tensor._random")
    if random is not None:
        random._rng_tracker = None
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    gc.collect()


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when the test process dies, whatever killed it."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
