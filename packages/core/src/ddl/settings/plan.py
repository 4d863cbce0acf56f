"""The run plan: what ``ddl train`` decides before any worker starts, decided once.

:func:`make_plan` turns the merged configuration (:func:`ddl.settings.config.build`, which
loads the site profile) into one :class:`RunPlan`: the site profile, how the workers start
(the launcher), how many there are (per node, nodes, world size), the run directory, the
DataLoader processes per rank and each local rank's cores and threads
(ddl.settings.cores). The launcher hands the plan to the workers - in
``RUN_DIR/plan.json`` for local runs, in the ``DDL_RUN_PLAN`` variable for per-node
launchers whose workers start on several nodes at once - and they read it instead of
deciding again.

Only the environment of the process that makes the plan is read here (Slurm's variables,
torchrun's); nothing imports torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ddl.contract.errors import UsageError
from ddl.settings import rundir
from ddl.settings.config import Built, RunConfig
from ddl.settings.cores import RankCores, held_cpus, plan_cores
from ddl.settings.sites import SiteProfile

Launcher = Literal["local", "worker", "srun", "torchrun", "torchrun_jsc"]
PLAN_FILE = "plan.json"
PLAN_ENV = "DDL_RUN_PLAN"
MAX_LOADER_WORKERS = 8


class Resolved(BaseModel):
    """What the pre-flight worked out from the flags, the preset and the layout, for the
    workers to read instead of working it out again: one rule, applied once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str  # the workload preset's name (its values come with the workload's spec)
    degrees: dict[str, int]  # the parallel layout: pp, dp_replicate, dp_shard, tp
    batch_per_replica: int  # samples per replica per optimizer step
    global_batch: int
    micro_batch: int  # samples per replica per forward pass
    accumulation: int  # forward/backward passes per optimizer step
    base_lr: float  # the preset's or --lr
    lr: float  # after --lr-scaling
    epochs: int
    precision: str  # fp32, bf16 or fp16: "auto" decided for the device kind


class RunPlan(BaseModel):
    """One run, fully decided. ``config.run_dir`` and ``config.data_dir`` are absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: RunConfig
    site: SiteProfile
    site_note: str  # which site, and why (auto-detection says what matched)
    launcher: Launcher  # 'worker': this process was started as a rank by someone else
    nproc_per_node: int
    nnodes: int
    world_size: int
    loader_workers: int  # DataLoader processes per rank
    cores: list[RankCores]  # by local rank: the cores to bind to, threads to use
    live_every_s: float  # seconds between two writes of a rank's live state file
    data_dir_is_default: bool  # only then may synthetic data be generated into it
    # the pre-flight's results (None where no pre-flight ran: the workers decide then)
    resolved: Resolved | None = None
    # --mesh auto: what `ddl plan`'s models predicted for the layout chosen (results.json)
    predicted: dict | None = None
    # the command line that made this plan (results.json's ``command``): a worker's own
    # argv is only ``.../ddl/worker/__main__.py RUN_DIR``
    command: list[str] = Field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        assert self.config.run_dir is not None
        return self.config.run_dir


def in_slurm_step(env: Mapping[str, str] = os.environ) -> bool:
    """True inside an ``srun`` task (not merely inside the batch script)."""
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env


def job_launcher(requested: str, site: SiteProfile) -> str:
    """How a Slurm job of this site starts its workers: as asked, else the site's style
    (srun for a profile without one)."""
    if requested not in ("auto", "local"):
        return requested
    return site.launcher if site.launcher != "local" else "srun"


def choose_launcher(requested: str, site: SiteProfile,
                    env: Mapping[str, str] = os.environ) -> str:
    """'worker' (already started by a launcher), or how to start the workers from here."""
    if requested != "auto":
        return requested
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return "worker"  # e.g. started by torchrun by hand
    if in_slurm_step(env):
        return job_launcher(requested, site)
    return "local"


def _env_int(env: Mapping[str, str], names: tuple[str, ...], launcher: str) -> int:
    for name in names:
        if env.get(name, "").split("(")[0].isdigit():  # SLURM_NTASKS_PER_NODE: "4(x2)"
            return int(env[name].split("(")[0])
    raise UsageError(f"--launcher {launcher}: {' or '.join(names)} not set; run it as a task "
                     "its launcher started (an srun task inside a Slurm job)")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a cgroup or ``taskset`` limit
    counts, the machine's total does not)."""
    return len(held_cpus())


def loader_workers(configured: int | None, launcher: str, nproc_per_node: int,
                   env: Mapping[str, str] = os.environ, cores: int | None = None) -> int:
    """DataLoader processes per rank: as configured (``--workers``, the site's default),
    else from the CPUs per rank less one for the rank itself, at most
    :data:`MAX_LOADER_WORKERS`. On Slurm the CPUs are the task's ``SLURM_CPUS_PER_TASK``
    (what ``ddl submit`` asks for from the site profile; the JSC course sizes its workers
    the same way), shared by the node's ranks unless srun started one task per rank. Off
    Slurm (a workstation) they are the cores this process may use (``cores``, default
    :func:`usable_cores`), shared by the ranks of the node."""
    if configured is not None:
        return configured
    cpus = int(env.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if cpus:
        per_rank = cpus if launcher == "srun" else cpus // max(1, nproc_per_node)
    else:
        per_rank = (usable_cores() if cores is None else cores) // max(1, nproc_per_node)
    return max(0, min(MAX_LOADER_WORKERS, per_rank - 1))


def make_plan(built: Built, env: Mapping[str, str] = os.environ,
              runs: Path = Path("runs")) -> RunPlan:
    """Decide launcher, world size, run directory and loader workers for ``built``."""
    config, site = built.config, built.site
    launcher = choose_launcher(config.launcher, site, env)
    nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
    if launcher == "local":
        nproc, nnodes, world_size = config.nproc or 1, 1, config.nproc or 1
    elif launcher == "worker":  # torchrun's variables describe the world
        world_size = _env_int(env, ("WORLD_SIZE",), launcher)
        nproc = _env_int(env, ("LOCAL_WORLD_SIZE", "WORLD_SIZE"), launcher)
        nnodes = max(1, world_size // nproc)
    elif launcher == "srun":  # one task per rank
        world_size = _env_int(env, ("SLURM_NTASKS",), launcher)
        nproc = _env_int(env, ("SLURM_NTASKS_PER_NODE",), launcher) \
            if "SLURM_NTASKS_PER_NODE" in env else 1
        nnodes = nodes
    else:  # one launcher task per node, starting nproc workers each
        nproc, nnodes = config.nproc or 1, nodes
        world_size = nproc * nnodes

    if config.run_dir is not None:
        run_dir = config.run_dir
    elif launcher == "local":
        run_dir = rundir.timestamped(runs, config.plugin, config.strategy)
    else:  # every task of the job must arrive at the same name: the job's id
        job = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID", "job")
        run_dir = runs / rundir.name(config.plugin, config.strategy, job)
    # Its length first: resolving a name over NAME_MAX fails less clearly (ENAMETOOLONG);
    # then again resolved, which a symlink on the way may lengthen.
    rundir.check_length(os.path.abspath(run_dir))
    resolved = absolute(Path(run_dir), "--run-dir")
    rundir.check_length(resolved)
    config = config.model_copy(update={
        "run_dir": resolved,
        "data_dir": absolute(Path(config.data_dir or "data"), "--data-dir"), "nproc": nproc})
    return RunPlan(config=config, site=site, site_note=built.site_note, launcher=launcher,
                   nproc_per_node=nproc, nnodes=nnodes, world_size=world_size,
                   loader_workers=loader_workers(config.workers, launcher, nproc, env),
                   cores=plan_cores(site, launcher, nproc, env),
                   live_every_s=live_interval(config.live_every, world_size),
                   data_dir_is_default=built.data_dir_is_default, command=list(sys.argv))


LIVE_EVERY_S = 2.0  # how often a rank's live state file (ddl watch) is replaced ...
JOB_LIVE_WRITES_PER_S = 128  # ... unless the whole job would replace more files a second


def live_interval(given: float | None, world_size: int) -> float:
    """Seconds between two writes of each rank's live state file: ``--live-every`` if given,
    else 2, stretched beyond 256 ranks so that the job replaces at most ~128 files a second
    (each write is a create and a rename: metadata operations a parallel file system's
    metadata server serves for every job on the machine; 4096 ranks every 2 s would be
    ~4000 a second)."""
    if given is not None:
        return given
    return max(LIVE_EVERY_S, world_size / JOB_LIVE_WRITES_PER_S)


def absolute(path: Path, flag: str) -> Path:
    """``path`` resolved; a symlink loop on the way (or a path the system refuses) is one
    line naming the flag, not pathlib's traceback."""
    try:
        resolved = path.resolve()
        os.stat(resolved)  # a loop that Python 3.13's resolve() leaves in place
    except FileNotFoundError:
        pass  # not there yet: a new run directory
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python < 3.13's symlink loop
        why = getattr(exc, "strerror", None) or "a symlink loop"
        raise UsageError(f"{flag}: cannot resolve {path}: {why}; allowed: a path to a "
                         "directory (no symlink loop, no file on the way)") from None
    return resolved


def write(plan: RunPlan) -> Path:
    """``RUN_DIR/plan.json`` (the workers' copy) and ``RUN_DIR/config.json`` (the merged
    configuration, as users read it)."""
    rundir.write_json(plan.run_dir / rundir.CONFIG, plan.config.model_dump(mode="json"))
    path = plan.run_dir / PLAN_FILE
    rundir.write_json(path, plan.model_dump(mode="json"))
    return path


def read(run_dir: Path) -> RunPlan:
    return RunPlan.model_validate_json((Path(run_dir) / PLAN_FILE).read_text())
