"""Starting the workers of a run on this machine.

``--nproc 1`` trains in this process (easiest to debug). ``--nproc N`` hands the workers to
torch's own elastic agent (the engine behind torchrun, ``torch.distributed.launcher``): it
picks a free port for a c10d rendezvous on 127.0.0.1, sets RANK/LOCAL_RANK/WORLD_SIZE and
MASTER_ADDR/MASTER_PORT for each worker, streams their output and reports failures.
Each worker runs ``python -m ddl.worker RUN_DIR``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from pathlib import Path

from ddl.contract.errors import DdlError
from ddl.worker import crash


def launch_local(run_dir: Path, nproc: int, max_restarts: int = 0) -> int:
    """Run the workers; return the exit code of the run (0, or the first failing rank's)."""
    if nproc == 1:
        from ddl.worker.entry import main as worker_main

        return worker_main([str(run_dir)])

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Several ranks on few cores: more than one thread per rank makes them all slower
    # (measured: 5-10x on 2 cores). torchrun does the same.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The agent logs every failure at length; ddl reports the worker's own one-line error.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts,
                          monitor_interval=0.1,
                          start_method="spawn")
    started = time.time()
    os.environ[crash.LAUNCHER_REPORTS] = "1"  # workers leave the crash line to us
    try:
        elastic_launch(config, sys.executable)("-m", "ddl.worker", str(run_dir))
    except ChildFailedError as exc:
        # When one rank fails the agent stops the others (SIGTERM). Its failures list the
        # rank(s) that ended by themselves first, then those it stopped; a rank that only
        # lost contact with a failed one is not the one to name.
        first = next((r for r, f in exc.failures.items() if f.exitcode != crash.LOST_CONTACT),
                     next(iter(exc.failures)))
        crashed = crash.read(run_dir / "logs", since=started)
        if crashed:  # exceptions in plugin (or ddl) code: one line for all ranks
            raise DdlError(crash.summary(crashed, first)) from None
        ddl_exits = sorted(f.exitcode for f in exc.failures.values() if f.exitcode in (1, 2))
        if ddl_exits:  # the worker printed ddl's own one-line error
            return ddl_exits[-1]
        raise DdlError(_died(first, exc.failures[first].exitcode, len(exc.failures))) from None
    finally:
        os.environ.pop(crash.LAUNCHER_REPORTS, None)
    return 0


def _died(rank: int, code: int, failed: int) -> str:
    """A worker that ended without a word of its own (killed, or a crash of the interpreter)."""
    import signal

    if code == crash.LOST_CONTACT:  # none said why (all lost contact): unusual
        return f"worker rank {rank} lost contact with the other ranks; none reported an error"
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else \
            f"exited with code {code}"
    except ValueError:
        how = f"was killed by signal {-code}"
    rest = f"; {failed - 1} other rank(s) stopped with it" if failed > 1 else ""
    return (f"worker rank {rank} {how} without an error message (out of memory, or killed "
            f"from outside?){rest}")
