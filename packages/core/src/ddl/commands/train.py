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
    from ddl.settings import config as cfg
    from ddl.settings import plan as run_plan
    from ddl.settings import rundir
    from ddl.worker.process import entry as worker

    plugins = Plugins()
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    flags = train_flags(ns)
    auto = flags.get("mesh") == "auto"  # --mesh auto: the planner's best layout (below)
    if auto:
        del flags["mesh"]
        flags.setdefault("strategy", "mesh")
    plan = run_plan.make_plan(cfg.build(flags, file_values, plugins))
    if auto:
        from ddl.commands import auto_layout

        plan = auto_layout.choose(plan, plugins)
        chosen = ",".join(f"{d}={n}" for d, n in plan.predicted["mesh"].items() if n > 1)
        print(f"ddl: --mesh auto: {chosen or '1 process'} (best of "
              f"{plan.predicted['candidates']} "
              f"layouts that fit, ranked by {plan.predicted['ranked_by']}; docs/plan.md)",
              flush=True)
    cfg.check_names(plan.config, plugins)  # a misspelt name: one line before torch loads
    _results_kept(plan.run_dir)

    if plan.launcher == "local":
        print(f"ddl: {plan.site_note}", flush=True)
        from ddl.launch import local

        if plan.nproc_per_node > 1:
            local.one_thread_per_rank()  # before the pre-flight imports torch
        plan = _preflight(plan, plugins, may_generate_data=plan.data_dir_is_default)
        rundir.create(plan.run_dir, plan.config.resume)
        run_plan.write(plan)
        code = local.launch_local(plan.run_dir, plan.nproc_per_node, plan.config.max_restarts,
                                  cpu_only=not _uses_gpu(plan.config, plan.site))
        if code == 0 and not (plan.run_dir / rundir.RESULTS).exists():
            return EXIT_STOPPED  # stopped on request after a checkpoint; it said so
        return code

    # Inside a Slurm job (or under a launcher started by hand): every task sees the same
    # flags, so every task checks them and all stop alike on a mistake. The site's
    # variables come from here too, not only from a `ddl submit` script (a hand-written srun).
    from ddl.launch import site_env

    os.environ.update(site_env.in_job(plan.site))
    if plan.launcher in ("srun", "worker"):
        if plan.launcher == "srun":
            from ddl.launch.slurm import srun_worker_env

            os.environ.update(srun_worker_env(plan.site))
        plan = _preflight(plan, plugins, may_generate_data=False)
        worker.run(plan, create_run_dir=True)
        worker.exit_now(0)  # skip interpreter teardown (see worker.exit_now)

    from ddl.launch.slurm import exec_node_launcher, node_launcher_command

    plan = _preflight(plan, plugins, may_generate_data=False)
    command = node_launcher_command(plan.launcher, plan.site, plan.nproc_per_node,
                                    max_restarts=plan.config.max_restarts,
                                    rendezvous_timeout=plan.config.rendezvous_timeout)
    exec_node_launcher(command, {run_plan.PLAN_ENV: plan.model_dump_json()})
    return 0  # not reached: exec replaced this process


def _results_kept(run_dir: Path) -> None:
    """Inside a container, a run dir the container takes with it is refused (one line)."""
    from ddl.launch import container_inside

    container_inside.check_kept(run_dir, "--run-dir", container_inside.detect())


def _preflight(plan, plugins, may_generate_data: bool):
    """Everything that can be checked before workers start, so mistakes cost seconds and
    give one line instead of N ranks' worth of errors. Returns the plan with what the
    checks worked out (preset, layout, batch split, lr, precision: ``plan.resolved``), so
    the workers read it instead of working it out again."""
    from ddl.launch.environment import check_strategy_torch, installed_torch

    config, site = plan.config, plan.site
    _check_path_length(Path(config.data_dir), "--data-dir")
    found = installed_torch()
    check_strategy_torch(config.strategy, found.version if found else None)
    if not may_generate_data:
        _data_dir_exists(Path(config.data_dir), config.plugin)  # before torch: 0.2 s, not 2.5
    import torch

    from ddl.contract.world import World
    from ddl.worker.train.trainer import build

    if config.resume not in ("none", "auto"):
        from ddl.worker.checkpointing.checkpoint import resolve

        resolve(config.resume, Path("."))  # a wrong path: one line now, not from N workers
    gpu = _uses_gpu(config, site)
    if gpu and not torch.cuda.is_available():
        # One line before any worker starts (each would otherwise fail alike, exit 1).
        why = ("--device cuda" if config.device == "cuda" else
               f"site {site.name} has {site.accelerator} GPUs")
        raise UsageError(f"--device: {why}, but torch sees no GPU on this node; allowed "
                         "here: --device cpu (or run inside a job that requests GPUs)")
    stand_in = World(rank=0, local_rank=0, size=plan.world_size,
                     device=torch.device("cuda" if gpu else "cpu"), backend=site.backend)
    strategy, context, numbers = build(config, stand_in, plugins)
    workload = context.workload
    data_dir = Path(config.data_dir)
    try:
        _data_ready(workload, data_dir, config, site.name, may_generate_data)
    except PermissionError as exc:  # e.g. a data dir of mode 000: one line, not a traceback
        raise _refused(exc, data_dir, "read") from None
    except OSError as exc:  # generating a synthetic stand-in on a full disk
        raise _write_failed(exc, data_dir) from None
    from ddl.worker.train.setup import check_model_fits

    check_model_fits(strategy, context, numbers, data_dir)
    from ddl.worker.train.setup import resolved_of

    # build() decided the precision for this device kind (auto: bf16 or fp16 on GPUs)
    return plan.model_copy(update={"resolved": resolved_of(numbers, context,
                                                            context.precision)})


def _data_ready(workload, data_dir: Path, config, site: str, may_generate_data: bool) -> None:
    """The workload's data is in ``data_dir``, generated there if the site allows it."""
    from ddl.contract.errors import DataMissing

    try:
        workload.check_data(data_dir)
    except DataMissing:
        if not (may_generate_data and config.synthetic_if_missing):
            raise
        print(f"ddl: no {config.plugin} data in {data_dir}; generating a SYNTHETIC stand-in "
              f"in the official format (site {site!r} allows it). For the real data run "
              f"`ddl prepare --plugin {config.plugin}` on a machine with internet access.",
              flush=True)
        workload.prepare(data_dir, synthetic=True)
        workload.check_data(data_dir)


def _check_path_length(path: Path, flag: str) -> None:
    """A path the file system cannot take (a name over 255 bytes, a path over 4095) is one
    line, not an ENAMETOOLONG traceback from the first file written below it."""
    from ddl.settings.rundir import NAME_MAX, PATH_MAX

    text = str(path)
    longest = max(Path(text).parts, key=lambda part: len(part.encode()), default="")
    if len(longest.encode()) > NAME_MAX or len(text.encode()) >= PATH_MAX:
        raise UsageError(f"{flag}: {_short(text)} ({len(text.encode())} bytes, a name of "
                         f"{len(longest.encode())}); allowed: names of at most {NAME_MAX} "
                         f"bytes in a path of less than {PATH_MAX} (the file system's limits)")


def _short(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"


def _write_failed(exc: OSError, data_dir: Path) -> UsageError:
    """The data could not be written (ENOSPC, EDQUOT, ...): one line; the writers build a
    set in a scratch directory beside it and remove it, so nothing half-written is left."""
    import shutil

    free = ""
    try:
        free = f" ({shutil.disk_usage(data_dir).free / 2**20:.1f} MiB free there)"
    except OSError:
        pass
    return UsageError(f"--data-dir: cannot write the data into {_short(str(data_dir))}: "
                      f"{exc.strerror or exc}{free}; nothing was left half-written; allowed: "
                      "a directory with room for the data set (free space, or choose "
                      "another --data-dir)")


def _refused(exc: PermissionError, data_dir: Path, needs: str) -> UsageError:
    return UsageError(f"--data-dir: cannot {needs} {exc.filename or data_dir}: "
                      f"{exc.strerror}; allowed: a directory this user may {needs} (chmod, or "
                      "ask its owner)")


def _uses_gpu(config, site) -> bool:
    return config.device == "cuda" or (config.device == "auto" and site.accelerator != "cpu")


def _data_dir_exists(data_dir: Path, plugin: str) -> None:
    """A --data-dir that is not there: one line saying how to make it (or, inside a
    container, that it may exist on the host but is not bound in)."""
    if data_dir.is_dir():
        return
    from ddl.launch import container_inside

    prepare = f"run `ddl prepare --plugin {plugin} --data-dir {data_dir}` on a login node"
    container = container_inside.detect()
    if container:  # it may exist on the host, not bound in: say so, not only "prepare"
        raise UsageError(container_inside.missing_dir(data_dir, "--data-dir", container,
                                                      prepare))
    if data_dir.exists():
        raise UsageError(f"--data-dir: {data_dir} is not a directory; give the directory "
                         f"that holds the data, or {prepare}")
    raise UsageError(f"--data-dir: {data_dir} does not exist; give an existing "
                     f"directory or {prepare}")


def cmd_prepare(ns: argparse.Namespace) -> int:
    from ddl.contract.plugins import Plugins
    from ddl.settings import config as cfg

    plugins = Plugins()
    config = cfg.build(train_flags(ns), {}, plugins).config
    _check_path_length(Path(config.data_dir), "--data-dir")  # before the workload's imports
    spec = plugins.workload(config.plugin)
    _, preset = cfg.resolve_preset(config, spec)  # --preset: unknown names refused there
    workload = spec.create(preset)
    data_dir = Path(config.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise UsageError(f"--data-dir: {data_dir} exists and is not a directory")
    try:
        where = workload.prepare(data_dir, synthetic=ns.synthetic)
    except PermissionError as exc:
        raise _refused(exc, data_dir, "write") from None
    except OSError as exc:  # a full disk, a quota: the writers leave no half-written set
        raise _write_failed(exc, data_dir) from None
    # "official" only where ddl knows the data came from a download (the workload's data
    # module); a plugin's own prepare() may generate its data
    if ns.synthetic or workload.is_synthetic(Path(where)):
        kind = "synthetic"
    else:
        kind = "official" if workload.data_module else "as the plugin's prepare made it"
    print(f"ddl: {config.plugin} data ({kind}) ready in {where}")
    return 0
