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
import uuid
from pathlib import Path

from ddl.contract.errors import DdlError


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
    try:
        elastic_launch(config, sys.executable)("-m", "ddl.worker", str(run_dir))
    except ChildFailedError as exc:
        # When one rank fails the agent stops the others (SIGTERM): report the rank that
        # failed with ddl's own exit code (it already printed its one-line error).
        ddl_exits = sorted(f.exitcode for f in exc.failures.values() if f.exitcode in (1, 2))
        if ddl_exits:
            return ddl_exits[-1]
        rank, failure = min(exc.failures.items())
        raise DdlError(f"worker rank {rank} died (exit code {failure.exitcode}); "
                       "see its output above") from None
    return 0
