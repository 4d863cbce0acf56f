"""What ``ddl plan`` plans for: processes per node, the device kind, and the memory each
process may use.

- A GPU site (juwels, lumi, ...): one process per GPU of a node (``--nproc`` fewer), each
  with the site's ``device_memory_bytes``.
- A CPU site that runs on this machine (``launcher = "local"``: the ``local`` profile, a
  workstation): ``--nproc`` processes (default: the site's ``defaults.nproc``), each with
  its share of the memory this machine has available now (``MemAvailable`` / processes),
  as ``ddl train --mesh auto`` counts it, unless the profile gives ``device_memory_bytes``.
  One node only: the machine is the node.
- A CPU site of other machines (a CPU Slurm cluster): ``device_memory_bytes`` must say what
  a process may use, since this machine's memory says nothing about those nodes; without
  it the plan is refused in one line.

No torch here (the planner imports it afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddl.contract.errors import UsageError
from ddl.contract.host_memory import available_bytes


@dataclass(frozen=True)
class Target:
    per_node: int  # processes (GPUs) per node
    device_kind: str  # cuda, rocm, cpu
    memory_bytes: int  # per process
    devices: str  # what a process drives, for the table: "GPUs", "processes"
    memory_source: str  # where memory_bytes comes from (one phrase)


def resolve(site, partition, nodes: int, nproc: int | None) -> Target:
    """The plan's target on ``site`` (``partition``: the site's chosen one, or None)."""
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc: {nproc}; allowed: a whole number >= 1")
    if site.accelerator != "cpu":
        if not partition or not partition.gpus_per_node or not site.device_memory_bytes:
            raise UsageError(f"--site: {site.name} gives no GPUs per node and device memory "
                             "(device_memory_bytes); allowed: a GPU site with both, e.g. "
                             "juwels, lumi, or a CPU site of this machine, e.g. local")
        gpus = partition.gpus_per_node
        if nproc is not None and nproc > gpus:
            raise UsageError(f"--nproc: {nproc}; a {site.name} node has {gpus} GPUs; "
                             f"allowed: 1 to {gpus}")
        return Target(nproc or gpus, site.accelerator, site.device_memory_bytes, "GPUs",
                      f"{site.name}'s device_memory_bytes")
    here = site.launcher == "local"
    if here and nodes > 1:
        raise UsageError(f"--nodes: {nodes}; site {site.name} is this machine, one node; "
                         "allowed: 1 (more processes: --nproc N)")
    per_node = nproc or (partition.gpus_per_node if partition and partition.gpus_per_node
                         else None) or site.defaults.nproc or 1
    if site.device_memory_bytes:
        return Target(per_node, "cpu", site.device_memory_bytes, "processes",
                      f"{site.name}'s device_memory_bytes")
    if not here:
        raise UsageError(f"--site: {site.name} is a CPU site of other machines and gives no "
                         "memory per process (device_memory_bytes); allowed: a profile "
                         "with device_memory_bytes, or --site local (this machine)")
    available = available_bytes()
    if not available:
        raise UsageError(f"--site: {site.name}: this machine's available memory could not be "
                         "read (/proc/meminfo MemAvailable); allowed: a profile with "
                         "device_memory_bytes")
    return Target(per_node, "cpu", available // per_node, "processes",
                  f"this machine's available memory ({available / 1024 ** 3:.1f} GiB, "
                  f"MemAvailable) / {per_node} processes")
