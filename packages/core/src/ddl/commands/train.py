"""``ddl train`` and ``ddl prepare``: check the run before any worker starts, then start the
workers here (torch's elastic agent) or in the Slurm launch style the job asks for."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddl.commands.flags import train_flags
from ddl.contract.errors import EXIT_STOPPED, UsageError


def cmd_train(ns: argparse.Namespace) -> int:
    import os

    from ddl.launch.environment import check_runtime

    check_runtime()  # first: an old Python or torch would fail the imports below untidily
    from ddl.contract.plugins import Plugins
    from ddl.launch.slurm import choose_launcher
    from ddl.settings import config as cfg
    from ddl.settings import rundir
    from ddl.settings.sites import get_site

    plugins = Plugins()
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    built = cfg.build(train_flags(ns), file_values, plugins)
    config = built.config
    site = get_site(config.site, plugins)
    launcher = choose_launcher(config.launcher, site)

    if launcher == "local":
        print(f"ddl: {built.site_note}", flush=True)
        nproc = config.nproc or 1
        run_dir = config.run_dir or rundir.default_run_dir(Path("runs"), config.plugin,
                                                           config.strategy)
        _results_kept(run_dir)
        _preflight(config, plugins, nproc, built.data_dir_is_default)
        rundir.create(run_dir, config.resume)
        config = config.model_copy(update={"run_dir": run_dir.resolve(), "nproc": nproc,
                                           "data_dir": Path(config.data_dir).resolve()})
        rundir.write_json(run_dir / rundir.CONFIG, config.model_dump(mode="json"))
        from ddl.launch.local import launch_local
        code = launch_local(run_dir, nproc, config.max_restarts)
        if code == 0 and not (run_dir / rundir.RESULTS).exists():
            return EXIT_STOPPED  # stopped on request after a checkpoint; it said so
        return code

    # Inside a Slurm job (or under a launcher started by hand): every task sees the same
    # flags, so every task checks them and all stop alike on a mistake.
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "job")
    run_dir = (config.run_dir or Path("runs") / f"{config.plugin}-{config.strategy}-{job}")
    _results_kept(run_dir)
    config = config.model_copy(update={"run_dir": Path(run_dir).resolve(),
                                       "data_dir": Path(config.data_dir).resolve()})
    nnodes = int(os.environ.get("SLURM_NNODES", "1"))
    if launcher in ("srun", "worker"):
        from ddl.launch.slurm import srun_worker_env
        from ddl.worker import entry as worker

        if launcher == "srun":
            os.environ.update(srun_worker_env(site))
        _preflight(config, plugins, int(os.environ["WORLD_SIZE"]), False)
        worker.run(config, create_run_dir=True)
        worker.exit_now(0)  # skip interpreter teardown (see worker.exit_now)

    from ddl.launch.slurm import exec_node_launcher, node_launcher_command
    from ddl.worker import entry as worker

    nproc = config.nproc or 1
    _preflight(config, plugins, nproc * nnodes, False)
    command = node_launcher_command(launcher, site, nproc, max_restarts=config.max_restarts,
                                    rendezvous_timeout=config.rendezvous_timeout)
    exec_node_launcher(command, {worker.CONFIG_ENV: config.model_dump_json(),
                                 worker.PER_NODE_ENV: "1"})
    return 0  # not reached: exec replaced this process


def _results_kept(run_dir: Path) -> None:
    """Inside a container, a run dir the container takes with it is refused (one line)."""
    from ddl.launch import container_inside

    container_inside.check_kept(run_dir, "--run-dir", container_inside.detect())


def _preflight(config, plugins, world_size: int, default_data_dir: bool) -> None:
    """Everything that can be checked before workers start, so mistakes cost seconds and
    give one line instead of N ranks' worth of errors."""
    from ddl.launch.environment import check_strategy_torch, installed_torch

    found = installed_torch()
    check_strategy_torch(config.strategy, found.version if found else None)
    import torch

    from ddl.contract.errors import DataMissing
    from ddl.contract.world import World
    from ddl.settings.sites import get_site
    from ddl.worker.trainer import build

    site = get_site(config.site, plugins)
    if config.resume not in ("none", "auto"):
        from ddl.worker.checkpoint import resolve

        resolve(config.resume, Path("."))  # a wrong path: one line now, not from N workers
    gpu = config.device == "cuda" or (config.device == "auto" and site.accelerator != "cpu")
    if gpu and not torch.cuda.is_available():
        # One line before any worker starts (each would otherwise fail alike, exit 1).
        why = ("--device cuda" if config.device == "cuda" else
               f"site {site.name} has {site.accelerator} GPUs")
        raise UsageError(f"--device: {why}, but torch sees no GPU on this node; allowed "
                         "here: --device cpu (or run inside a job that requests GPUs)")
    stand_in = World(rank=0, local_rank=0, size=world_size,
                     device=torch.device("cuda" if gpu else "cpu"), backend=site.backend)
    workload, _, _ = build(config, stand_in, plugins)
    data_dir = Path(config.data_dir)
    if not default_data_dir and not data_dir.is_dir():
        from ddl.launch import container_inside

        prepare = (f"run `ddl prepare --plugin {config.plugin} --data-dir {data_dir}` on a "
                   "login node")
        container = container_inside.detect()
        if container:  # it may exist on the host, not bound in: say so, not only "prepare"
            raise UsageError(container_inside.missing_dir(data_dir, "--data-dir", container,
                                                          prepare))
        raise UsageError(f"--data-dir: {data_dir} does not exist; give an existing "
                         f"directory or {prepare}")
    try:
        workload.check_data(data_dir)
    except DataMissing:
        if not (default_data_dir and config.synthetic_if_missing):
            raise
        print(f"ddl: no {config.plugin} data in {data_dir}; generating a SYNTHETIC stand-in "
              f"in the official format (site {site.name!r} allows it). For the real data run "
              f"`ddl prepare --plugin {config.plugin}` on a machine with internet access.",
              flush=True)
        workload.prepare(data_dir, synthetic=True)
        workload.check_data(data_dir)


def cmd_prepare(ns: argparse.Namespace) -> int:
    from ddl.contract.plugins import Plugins
    from ddl.settings import config as cfg

    plugins = Plugins()
    config = cfg.build(train_flags(ns), {}, plugins).config
    spec = plugins.workload(config.plugin)
    workload = spec.create(spec.presets[spec.default_preset])
    data_dir = Path(config.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise UsageError(f"--data-dir: {data_dir} exists and is not a directory")
    where = workload.prepare(data_dir, synthetic=ns.synthetic)
    kind = "synthetic" if ns.synthetic else "official"
    print(f"ddl: {config.plugin} data ({kind}) ready in {where}")
    return 0
