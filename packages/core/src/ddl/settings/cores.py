"""Which cores each rank of a node computes on, and with how many threads: decided once.

The pre-flight decides (:func:`plan_cores`, called by ``ddl.settings.plan.make_plan``, on
the node the ranks run on) into the run plan's ``cores``; a worker applies its local
rank's entry and decides nothing (ddl.worker.process.cpu_binding). ``ddl submit`` renders
srun's ``--cpu-bind`` from :func:`srun_cpu_bind` here, so the script's binding and the
one a rank gives itself come from the same list.

Binding (issue 42). The site's CPU binding (``[cpu_binding]``) names the cores next to
each GPU of a whole node:

- one srun task per rank: ``srun --cpu-bind=<srun>`` binds a submitted job's tasks; a
  hand-written ``srun ... ddl train --site lumi`` gives no ``--cpu-bind``, so each rank
  binds itself to what the list gives its local rank, as srun would have. Not when srun
  was told ``--cpu-bind=none`` (``SLURM_CPU_BIND_TYPE=none``: the user asked for none), and
  not to CPUs this node does not have (a smaller node, a test machine: one line, unbound).
- a per-node launcher (torchrun): srun binds only the launcher, so each worker binds to
  ``worker_cores[LOCAL_RANK]``, where the job holds all the node's ranks' cores (on part
  of a shared node, LUMI's small-g, it holds others: one line, all unbound).

Threads per rank (one rule for every launcher): the user's ``OMP_NUM_THREADS`` wins;
else all cores bound to the rank; else under Slurm ``SLURM_CPUS_PER_TASK`` (an srun task
is one rank; a per-node launcher's task shares them among its local ranks); else the
process's CPU affinity shared by the local ranks. More threads than cores made every rank
5-10x slower (2 ranks on 2 cores), and a scaling study whose 1-process point ran with
torch's default thread count against 1 thread per rank at 2 processes reported 260 %
efficiency. ddl's launchers set ``OMP_NUM_THREADS=1`` for their workers' start-up (as
torchrun does) and keep the user's own value in ``DDL_OMP_NUM_THREADS_GIVEN``.

Nothing here imports torch; the environment and CPU lists are those of the process that
makes the plan (the ranks' node, the affinity they inherit).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ddl.contract.errors import UsageError
from ddl.settings.sites import SiteProfile

#: The user's OMP_NUM_THREADS as the launcher found it ("" when unset).
GIVEN = "DDL_OMP_NUM_THREADS_GIVEN"
#: Who set that value when not the user (``ddl scale`` pins it the same for every point).
SET_BY = "DDL_OMP_NUM_THREADS_SET_BY"
PER_NODE_LAUNCHERS = ("torchrun", "torchrun_jsc")
ONLINE = Path("/sys/devices/system/cpu/online")


class Threads(BaseModel):
    """Torch's intra-op threads for a rank, and why that many (results.json's
    ``threads``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_rank: int
    source: str


class RankCores(BaseModel):
    """One local rank's cores: ``cpus`` to bind to (None: stay as started) and the threads
    to compute with; ``unbound``: the threads if the system refuses the binding (a shared
    node's cpuset); ``note``: one line the rank prints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: list[int] | None = None
    threads: Threads
    unbound: Threads
    note: str | None = None


def capture_user_setting(env: dict[str, str] = os.environ) -> None:  # type: ignore[assignment]
    """In a launcher, before it sets its own OMP_NUM_THREADS: remember the user's."""
    env.setdefault(GIVEN, env.get("OMP_NUM_THREADS", ""))


def online_cpus(listing: Path = ONLINE) -> set[int]:
    """The CPUs this node has (Linux's online list, e.g. ``0-63``), else 0..cpu_count-1."""
    try:
        return parse_list(listing.read_text())
    except (OSError, ValueError):
        return set(range(os.cpu_count() or 1))


def held_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity: a cgroup or ``taskset`` counts)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def parse_list(text: str) -> set[int]:
    """A kernel CPU list (``0-3,8,10-11``) as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def ranges(cpus: set[int] | list[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def srun_cpu_bind(site: SiteProfile, gpus: int | None, *, per_node_launcher: bool = False,
                  whole_node: bool = True) -> str:
    """``srun --cpu-bind=`` for the tasks of a job with ``gpus`` GPUs per node: the site's
    list cut to ``gpus`` entries; ``none`` under a per-node launcher (the workers bind
    themselves) and on part of a shared node (the masks of GPUs 0..k-1 name cores Slurm
    may have given another job)."""
    bind = site.cpu_binding.srun
    if per_node_launcher or not whole_node:
        return "none"
    kind, _, masks = bind.partition(":")
    if not (gpus and kind in ("mask_cpu", "map_cpu") and "," in masks):
        return bind
    return f"{kind}:{','.join(masks.split(',')[:gpus])}"


def decide_threads(*, launcher: str, local_ranks: int, bound: bool, affinity: int,
                   env: Mapping[str, str] = os.environ) -> Threads:
    """Threads per rank by the one rule (module docstring)."""
    user = env[GIVEN] if GIVEN in env else env.get("OMP_NUM_THREADS", "")
    if user.strip().isdigit() and int(user) > 0:
        who = env.get(SET_BY) or "the user"
        return Threads(per_rank=int(user), source=f"OMP_NUM_THREADS={int(user)} (set by {who})")
    ranks = max(local_ranks, 1)
    if bound:
        return Threads(per_rank=max(affinity, 1), source=f"the {affinity} cores bound to "
                                                         "this rank")
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and int(cpus) > 0:
        if launcher == "srun":
            return Threads(per_rank=int(cpus),
                           source=f"SLURM_CPUS_PER_TASK={cpus} (one rank per task)")
        if launcher in PER_NODE_LAUNCHERS:
            return Threads(per_rank=max(int(cpus) // ranks, 1),
                           source=f"SLURM_CPUS_PER_TASK={cpus} / {ranks} local ranks")
    return Threads(per_rank=max(affinity // ranks, 1),
                   source=f"{affinity} usable cores / {ranks} local ranks")


def plan_cores(site: SiteProfile, launcher: str, nproc_per_node: int,
               env: Mapping[str, str] = os.environ, *, online: set[int] | None = None,
               held: set[int] | None = None) -> list[RankCores]:
    """Each local rank's cores and threads on this node, by local rank. ``online``: the
    CPUs the node has; ``held``: those this process (and the ranks it starts) may use."""
    online = online_cpus() if online is None else online
    held = held_cpus() if held is None else held
    own = env.get("SLURM_LOCALID" if launcher == "srun" else "LOCAL_RANK", "0")
    count = max(nproc_per_node, int(own) + 1 if own.isdigit() else 1)
    chosen = [_srun_task_cpus(site, rank, env, online) if launcher == "srun"
              else _worker_cpus(site, rank, count, held, launcher) for rank in range(count)]
    unbound = decide_threads(launcher=launcher, local_ranks=nproc_per_node, bound=False,
                             affinity=len(held), env=env)
    return [RankCores(cpus=sorted(cpus) if cpus else None, note=note, unbound=unbound,
                      threads=decide_threads(launcher=launcher, local_ranks=nproc_per_node,
                                             bound=True, affinity=len(cpus), env=env)
                      if cpus else unbound)
            for cpus, note in chosen]


def _srun_task_cpus(site: SiteProfile, local_rank: int, env: Mapping[str, str],
                    online: set[int]) -> tuple[set[int] | None, str | None]:
    """(the CPUs an srun task binds itself to, or None; a line to print, or None)."""
    cpus = site.cpu_binding.srun_cpus(local_rank)
    if cpus is None or "SLURM_JOB_ID" not in env:
        return None, None
    if env.get("SLURM_CPU_BIND_TYPE", "").strip() == "none":  # srun --cpu-bind=none
        return None, None
    if not cpus <= online:
        return None, (f"ddl: note: site {site.name} binds local rank {local_rank} to CPUs "
                      f"{ranges(cpus)}, but this node has CPUs {ranges(online)}; left "
                      "unbound")
    return cpus, None


def _worker_cpus(site: SiteProfile, local_rank: int, ranks: int, held: set[int],
                 launcher: str) -> tuple[set[int] | None, str | None]:
    """Under a per-node launcher: the cores next to the rank's GPU (LUMI: GCD -> cores)."""
    cores = site.cpu_binding.worker_cores
    if launcher not in PER_NODE_LAUNCHERS or not cores:
        return None, None
    if ranks > len(cores):
        raise UsageError(f"site {site.name} lists CPU cores (cpu_binding.worker_cores) for "
                         f"{len(cores)} devices, but this node runs {ranks} ranks; allowed: "
                         f"--nproc at most {len(cores)}")
    # The lists map GPU i to the cores next to it on a node the job has whole. On part of
    # a shared node (LUMI's small-g) the job holds other cores (srun --cpu-bind=none left
    # the launcher all of them): binding there would fail or land off the job's cores, so
    # no rank of the node binds unless the job holds every rank's cores.
    if not set().union(*cores[:ranks]) <= held:
        return None, (f"ddl: note: site {site.name}'s per-GPU cores are for a whole node; "
                      f"this job holds CPUs {ranges(held)}: workers left unbound"
                      if local_rank == 0 else None)
    return set(cores[local_rank]), None
