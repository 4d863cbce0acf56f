"""The site's CPU binding for an srun task that binds itself (issue 42).

``ddl submit`` starts one task per GPU with ``srun --cpu-bind=<site mask list>`` (LUMI: the
seven cores nearest each GCD). A hand-written ``srun ... ddl train --site lumi`` (or
``srun singularity run IMG train --site lumi``) gives no ``--cpu-bind``, and the task runs
where Slurm put it. So the rank binds itself, in the job, to the CPUs the site's list gives
its local rank, as srun would have. Not when srun was told ``--cpu-bind=none``
(``SLURM_CPU_BIND_TYPE=none`` in the task: the user asked for no binding), and not when
the list names CPUs this node does not have (a smaller node, a test machine): one line
says so and the rank runs unbound. Binding to the same CPUs srun already bound it to
changes nothing, so a submitted job's tasks are left as they were.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ddl.settings.sites import SiteProfile

ONLINE = Path("/sys/devices/system/cpu/online")


def online_cpus(listing: Path = ONLINE) -> set[int]:
    """The CPUs this node has (Linux's online list, e.g. ``0-63``), else 0..cpu_count-1."""
    try:
        return parse_list(listing.read_text())
    except (OSError, ValueError):
        return set(range(os.cpu_count() or 1))


def parse_list(text: str) -> set[int]:
    """A kernel CPU list (``0-3,8,10-11``) as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def ranges(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def srun_task_cpus(site: SiteProfile, local_rank: int, env: Mapping[str, str],
                   online: set[int]) -> tuple[set[int] | None, str | None]:
    """(the CPUs this srun task binds itself to, or None; a line to print, or None)."""
    cpus = site.cpu_binding.srun_cpus(local_rank)
    if cpus is None or "SLURM_JOB_ID" not in env:
        return None, None
    if env.get("SLURM_CPU_BIND_TYPE", "").strip() == "none":  # srun --cpu-bind=none
        return None, None
    if not cpus <= online:
        rank = env.get("RANK", env.get("SLURM_PROCID", "?"))
        return None, (f"ddl: note: rank {rank}: site {site.name} binds local rank "
                      f"{local_rank} to CPUs {ranges(cpus)}, but this node has CPUs "
                      f"{ranges(online)}; left unbound")
    return cpus, None


def bind_srun_task(site: SiteProfile, local_rank: int,
                   env: Mapping[str, str] = os.environ) -> bool:
    """Bind this process as the site's srun binding would; True if it did."""
    cpus, note = srun_task_cpus(site, local_rank, env, online_cpus())
    if note:
        print(note, file=sys.stderr, flush=True)
    if cpus is None:
        return False
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # none of them in the job's cpuset (a shared node)
        print(f"ddl: note: local rank {local_rank}: cannot bind to CPUs {ranges(cpus)} of "
              f"site {site.name} ({exc.strerror}); left unbound", file=sys.stderr, flush=True)
        return False
    return True
