"""Running ``ddl train`` inside a Slurm allocation: the two launch styles.

- ``srun``: srun starts one ddl process per GPU. Each is a worker; its rank comes from
  SLURM_PROCID, its local rank from SLURM_LOCALID, the world size from SLURM_NTASKS.
- ``torchrun`` / ``torchrun_jsc``: srun starts one ddl process per node, which becomes
  that node's launcher (torch's elastic agent) and spawns one worker per GPU. All nodes meet
  at the c10d rendezvous on MASTER_ADDR:MASTER_PORT.

The JSC catch (pytorch/pytorch#73656): the rendezvous endpoint is the InfiniBand name of
node 0 (jwb0001i), which differs from its hostname, so plain torchrun cannot tell that it
is the node that must host the rendezvous store; every agent waits for a store nobody
started. ``torchrun_jsc`` fixes this by passing ``--rdzv_conf is_host=1`` on node 0 (from
SLURM_NODEID) and, on PyTorch >= 2.5, ``--local_addr``. With plain torchrun ddl passes
both itself. SLURM_NODEID is read here in Python, in the task, so it cannot be expanded too
early by the batch shell (the bug of huggingface/accelerate#2816).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping

from ddl.contract.errors import DdlError, UsageError
from ddl.launch.rendezvous import endpoint_from_env
from ddl.settings.plan import in_slurm_step
from ddl.settings.sites import SiteProfile
from ddl.settings import cores


def srun_worker_env(site: SiteProfile, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The torch.distributed variables of an srun task, from Slurm's own."""
    missing = [v for v in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS") if v not in env]
    if missing:
        raise UsageError(f"--launcher srun: {', '.join(missing)} not set; run it as an srun "
                         "task inside a Slurm job")
    host, port = endpoint_from_env(site.rendezvous, env)
    return {"RANK": env["SLURM_PROCID"], "LOCAL_RANK": env["SLURM_LOCALID"],
            "WORLD_SIZE": env["SLURM_NTASKS"], "LOCAL_WORLD_SIZE":
            env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0],
            "MASTER_ADDR": host, "MASTER_PORT": str(port)}


def node_launcher_command(launcher: str, site: SiteProfile, nproc_per_node: int,
                          env: Mapping[str, str] = os.environ, max_restarts: int = 0,
                          rendezvous_timeout: float | None = None) -> list[str]:
    """The torchrun (or torchrun_jsc) command this node's task execs."""
    if not in_slurm_step(env):
        raise UsageError(f"--launcher {launcher}: run it as an srun task (one per node) "
                         "inside a Slurm job")
    host, port = endpoint_from_env(site.rendezvous, env)
    node_id = int(env.get("SLURM_NODEID", "0"))
    nnodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
    if launcher == "torchrun_jsc":
        try:
            import torchrun_jsc  # noqa: F401
        except ImportError:
            raise DdlError("the site launches with torchrun_jsc, which is not installed; "
                           "`pip install torchrun-jsc` (or use --launcher torchrun)") from None
        module = "torchrun_jsc"
    else:
        module = "torch.distributed.run"
    command = [sys.executable, "-m", module, f"--nnodes={nnodes}",
               f"--nproc_per_node={nproc_per_node}", "--rdzv_backend=c10d",
               f"--rdzv_endpoint={host}:{port}",
               f"--rdzv_id={env.get('SLURM_JOB_ID', 'ddl')}", f"--max_restarts={max_restarts}"]
    conf = []
    if rendezvous_timeout is not None:
        # The nodes' launchers meet before the workers do: the same limit (torchrun takes
        # whole seconds; torchrun_jsc appends its is_host to this conf).
        conf.append(f"join_timeout={math.ceil(rendezvous_timeout)}")
    if launcher == "torchrun":
        # What torchrun_jsc does for us: say which node hosts the store, and on that node
        # bind it to the rendezvous address rather than the hostname (pytorch#73656).
        conf.append(f"is_host={1 if node_id == 0 else 0}")
    if conf:
        command.append("--rdzv_conf=" + ",".join(conf))
    if launcher == "torchrun" and node_id == 0:
        command.append(f"--local_addr={host}")
    return command + ["-m", "ddl.worker"]


def exec_node_launcher(command: list[str], extra_env: dict[str, str]) -> None:
    """Replace this process by the node's launcher (no Python process left in between)."""
    os.environ.update(extra_env)
    cores.capture_user_setting()  # the worker tells the user's value from ours
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
