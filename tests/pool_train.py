"""A `ddl train` run inside a rank pool (tests/rankpool.py): the same run configuration, the
same trainer, the same model.pt and results.json, without starting processes.

``prepare`` runs in the test process and does what ``ddl train`` does before it starts
local workers: parse the flags with ddl's own parser, merge them with the site defaults,
make the run plan (ddl.settings.plan), create the run directory, write plan.json and
config.json. ``train_cell`` is the cell every rank of the pool runs:
``ddl.worker.train.trainer.train`` - what ``python -m ddl.worker`` calls after joining the process
group - with a World for the pool's group. Rank 0 thus writes model.pt with the worker's own
export and results.json with its own memory numbers; the cell returns both from rank 0.
(``peak_rss_bytes`` there is the rank process's peak over every cell it has run so far.)

What the pool path does not exercise, and the CLI tests still do: the launcher (elastic
agent, Slurm), the rendezvous, pre-flight checks, exit codes. If ddl's worker start changes
(ddl.worker.process.entry, the run plan, trainer.train's signature), this is the one place to adapt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prepare(args: list[str], run_dir: Path, nproc: int):
    """The run plan ``ddl train ARGS --nproc NPROC --run-dir RUN_DIR`` makes for its local
    workers, with the run directory created and plan.json written as that command does."""
    from ddl.commands.flags import train_flags
    from ddl.commands.parser import make_parser
    from ddl.contract.plugins import Plugins
    from ddl.settings import config as cfg
    from ddl.settings import plan as run_plan
    from ddl.settings import rundir

    ns = make_parser().parse_args(["train", *args, "--nproc", str(nproc),
                                   "--run-dir", str(run_dir)])
    # env={}: a local run whatever this test process's environment says (e.g. inside Slurm)
    plan = run_plan.make_plan(cfg.build(train_flags(ns), {}, Plugins()), env={})
    rundir.create(plan.run_dir, plan.config.resume)
    run_plan.write(plan)
    return plan


def train_cell(plan) -> dict[str, Any] | None:
    """Train on every rank of the pool; rank 0 returns results.json's document and the
    weights it exported to model.pt (read back from the file, as a CLI test would)."""
    import torch
    import torch.distributed as dist

    from ddl.contract.world import World
    from ddl.settings import rundir
    from ddl.worker.train.trainer import train

    rank = dist.get_rank()
    world = World(rank=rank, local_rank=rank, size=dist.get_world_size(),
                  device=torch.device("cpu"), backend="gloo")
    document = train(plan, world, _plugins())
    if rank != 0:
        return None
    model = torch.load(plan.run_dir / rundir.MODEL, weights_only=True)
    return {"results": document, "model": model}


def train_cell_with_plugin(plan, site: str, plugin_modules: tuple[str, ...],
                           env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """:func:`train_cell` for a plugin the pool's discovery lacks: every rank trains with
    ``site`` on sys.path (and ``env`` set), as `ddl train` workers have them, through a
    discovery of its own; then neither the path, the variables nor the plugin's modules
    (names starting with ``plugin_modules``) are left behind for the pool's next cell.
    Rank 0 returns the weights it exported to model.pt."""
    import importlib
    import os
    import sys

    import torch
    import torch.distributed as dist

    from ddl.contract.plugins import Plugins
    from ddl.contract.world import World
    from ddl.settings import rundir
    from ddl.worker.train.trainer import train

    env = env or {}
    path, modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, site)
    os.environ.update(env)
    importlib.invalidate_caches()
    try:
        rank = dist.get_rank()
        world = World(rank=rank, local_rank=rank, size=dist.get_world_size(),
                      device=torch.device("cpu"), backend="gloo")
        train(plan, world, Plugins())
    finally:
        sys.path[:] = path
        for name in env:
            os.environ.pop(name, None)
        for name in set(sys.modules) - modules:
            if name.startswith(plugin_modules):
                del sys.modules[name]
    return torch.load(plan.run_dir / rundir.MODEL, weights_only=True) if rank == 0 else None


_PLUGINS = []


def _plugins():
    """One plugin manager per rank process (discovery reads every entry point)."""
    if not _PLUGINS:
        from ddl.contract.plugins import Plugins

        _PLUGINS.append(Plugins())
    return _PLUGINS[0]


# Three optimizer steps at a fixed global batch: the comparisons of equal runs use these.
THREE_STEPS = ["--epochs", "1", "--steps-per-epoch", "3", "--seed", "7"]
MNIST_3_STEPS = ["--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "32",
                 *THREE_STEPS]
XSUM_3_STEPS = ["--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16",
                *THREE_STEPS]


def run_on_pool(pools, run_dir: Path, nproc: int, args: list[str],
                timeout_s: float = 300) -> tuple[dict[str, Any], dict[str, Any]]:
    """``ddl train ARGS`` on the session's pool of NPROC ranks: (results.json's document,
    the exported weights)."""
    rank0 = pools[nproc].run(train_cell, prepare(args, run_dir, nproc), timeout_s=timeout_s)[0]
    return rank0["results"], rank0["model"]
