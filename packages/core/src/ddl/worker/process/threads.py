"""How many CPU threads one rank computes with: one rule for every launcher.

Threads per rank = the cores this rank may use / the ranks that share them, unless the user
set ``OMP_NUM_THREADS``, which wins. "The cores it may use", in order:

1. cores bound to this rank alone (a site's per-GPU core map, ``ddl.worker.process.entry``): all
   of them;
2. under Slurm, ``SLURM_CPUS_PER_TASK``: an srun task is one rank and gets them all; a
   per-node launcher's task (torchrun) shares them among its local ranks;
3. otherwise the CPU affinity of the process (``os.sched_getaffinity``: what a container,
   cgroup or ``taskset`` allows), shared by the local ranks.

Why one rule: more threads than cores makes every rank slower (measured 5-10x with 2 ranks
on 2 cores), and a scaling study whose 1-process point ran with torch's default thread
count while its 2-process point ran 1 thread per rank reported 260 % efficiency. With this
rule each point uses the whole machine, split evenly. ddl's launchers set
``OMP_NUM_THREADS=1`` for their workers' start-up (as torchrun does) and pass the user's
own value on in ``DDL_OMP_NUM_THREADS_GIVEN``, so the worker can tell the two apart.
results.json records the choice (``threads``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

#: The user's OMP_NUM_THREADS as the launcher found it ("" when unset).
GIVEN = "DDL_OMP_NUM_THREADS_GIVEN"
#: Who set that value when not the user (``ddl scale`` pins it the same for every point).
SET_BY = "DDL_OMP_NUM_THREADS_SET_BY"
PER_NODE_LAUNCHERS = ("torchrun", "torchrun_jsc")


@dataclass(frozen=True)
class Threads:
    per_rank: int
    source: str  # why: what the number was derived from


_chosen: Threads | None = None


def capture_user_setting(env: dict[str, str] = os.environ) -> None:  # type: ignore[assignment]
    """In a launcher, before it sets its own OMP_NUM_THREADS: remember the user's."""
    env.setdefault(GIVEN, env.get("OMP_NUM_THREADS", ""))


def decide(*, launcher: str, local_ranks: int, bound: bool, affinity: int,
           env: Mapping[str, str] = os.environ) -> Threads:
    user = env[GIVEN] if GIVEN in env else env.get("OMP_NUM_THREADS", "")
    if user.strip().isdigit() and int(user) > 0:
        who = env.get(SET_BY) or "the user"
        return Threads(int(user), f"OMP_NUM_THREADS={int(user)} (set by {who})")
    ranks = max(local_ranks, 1)
    if bound:
        return Threads(max(affinity, 1), f"the {affinity} cores bound to this rank")
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and int(cpus) > 0:
        if launcher == "srun":
            return Threads(int(cpus), f"SLURM_CPUS_PER_TASK={cpus} (one rank per task)")
        if launcher in PER_NODE_LAUNCHERS:
            return Threads(max(int(cpus) // ranks, 1),
                           f"SLURM_CPUS_PER_TASK={cpus} / {ranks} local ranks")
    return Threads(max(affinity // ranks, 1), f"{affinity} usable cores / {ranks} local ranks")


def apply(launcher: str, local_ranks: int, bound: bool) -> Threads:
    """Decide for this process and set torch's intra-op threads (and OMP_NUM_THREADS for
    what it starts)."""
    import torch

    global _chosen
    _chosen = decide(launcher=launcher, local_ranks=local_ranks, bound=bound,
                     affinity=len(os.sched_getaffinity(0)))
    torch.set_num_threads(_chosen.per_rank)
    os.environ["OMP_NUM_THREADS"] = str(_chosen.per_rank)
    return _chosen


def report() -> dict[str, object]:
    """results.json's ``threads``: the choice, or torch's own count where ddl's worker
    entry did not decide (an embedding application, the test suite's rank pools)."""
    if _chosen is not None:
        return asdict(_chosen)
    import torch

    return {"per_rank": torch.get_num_threads(), "source": "not set by ddl (embedded run)"}
