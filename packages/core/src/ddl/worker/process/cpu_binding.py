"""A rank's cores, as the run plan decided them: bind, then set the threads.

Which cores and how many threads are decided once, in the pre-flight, on this node
(ddl.settings.cores, the run plan's ``cores``, by local rank); this module only applies
its rank's entry. The one thing only the worker can learn is whether the system accepts
the binding (a shared node's cpuset may not hold those cores): then the rank runs
unbound with the threads the plan gave for that case, and says so in one line.
"""

from __future__ import annotations

import os
import sys

from ddl.settings.cores import RankCores, ranges
from ddl.worker.process import threads


def apply(cores: RankCores, local_rank: int) -> bool:
    """Bind this process as planned and set its threads; True if bound."""
    bound = bind(cores, local_rank)
    threads.apply(cores.threads if bound else cores.unbound)
    return bound


def bind(cores: RankCores, local_rank: int) -> bool:
    """Bind this process to ``cores.cpus`` (none: left as started); True if bound."""
    if cores.note:
        print(cores.note, file=sys.stderr, flush=True)
    if cores.cpus is None:
        return False
    try:
        os.sched_setaffinity(0, cores.cpus)
    except OSError as exc:  # none of them in the job's cpuset (a shared node)
        print(f"ddl: note: local rank {local_rank}: cannot bind to CPUs "
              f"{ranges(cores.cpus)} ({exc.strerror}); left unbound", file=sys.stderr,
              flush=True)
        return False
    return True
