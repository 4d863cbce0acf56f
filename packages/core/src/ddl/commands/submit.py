"""``ddl submit``: the run as the site's sbatch script (ddl.launch.submit renders it), printed
with --dry-run or handed to sbatch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddl.commands.flags import train_arguments, train_flags
from ddl.contract.errors import UsageError, as_one_line
from ddl.settings.plan import absolute


def cmd_submit(ns: argparse.Namespace) -> int:
    import os
    import time

    from ddl.contract.plugins import Plugins
    from ddl.launch.container_launch import check_target, image_for
    from ddl.launch.submit import SubmitRequest, check_syntax, render, sbatch
    from ddl.launch.submit_checks import check_path_lengths, check_run
    from ddl.settings import config as cfg
    from ddl.settings import rundir
    from ddl.settings.plan import job_launcher

    plugins = Plugins()
    flags = train_flags(ns)
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    built = cfg.build(flags, file_values, plugins)  # validates everything the job will get
    config, site = built.config, built.site
    if ns.nodes < 1:
        raise UsageError(f"--nodes: must be at least 1 (got {ns.nodes})")
    if ns.gpus_per_node is not None and ns.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node: must be 0 or more (got {ns.gpus_per_node})")
    # What `ddl train` would refuse in the job, refused before the queue wait.
    check_path_lengths({"--container": ns.container, "--output-dir": ns.output_dir,
                        "--run-dir": config.run_dir, "--data-dir": config.data_dir,
                        "--resume": config.resume})
    _one_line({"--ddl-command": ns.ddl_command, "--run-dir": config.run_dir})
    notes = check_run(config, plugins, site, nodes=ns.nodes, partition=ns.partition,
                      gpus=ns.gpus_per_node, data_dir_given=not built.data_dir_is_default,
                      force=ns.force)
    if config.launcher in ("auto", "local") and not site.uses_slurm:
        raise UsageError(f"--site: {site.name} is not a Slurm site; allowed: "
                         + ", ".join(n for n in _slurm_sites(plugins)))
    launcher = job_launcher(config.launcher, site)
    # The job gets the user's own flags (site, launcher, nproc, run dir are set by ddl).
    given = {"config": ns.config, **flags} if "config" in ns else flags
    forwarded = train_arguments(given, leave_out=("site", "launcher", "nproc", "run_dir"))
    output_dir = absolute(ns.output_dir, "--output-dir")  # a symlink loop: one line
    image = _image(ns.container, ns.dry_run)
    if image is not None:
        image = image_for(site, image)
    request = SubmitRequest(
        nodes=ns.nodes, launcher=launcher, train_args=forwarded, plugin=config.plugin,
        strategy=config.strategy, output_dir=output_dir, account=ns.account,
        partition=ns.partition, time=ns.time, gpus_per_node=ns.gpus_per_node,
        job_name=ns.job_name,
        run_dir=absolute(config.run_dir, "--run-dir") if config.run_dir else None,
        ddl_command=ns.ddl_command or this_ddl(ns.setup), container=image,
        extra_sbatch=ns.sbatch, stop_margin_s=ns.stop_margin, setup=ns.setup,
        data_dir=absolute(Path(config.data_dir), "--data-dir") if config.data_dir else None)
    script = render(site, request)
    check_syntax(script, site)
    notes += site_notes(site, request)
    if image is not None:  # the slow part (the runtime reads the image) comes last
        notes.append(check_target(site, image, config.device))
    elif not (ns.setup or ns.ddl_command):
        notes.append(_own_arch_mismatch(site, request.ddl_command))
        warning = config.device != "cpu" and _own_torch_mismatch(site, request.ddl_command)
        if warning:
            print(f"ddl: warning: {warning}", file=sys.stderr)
    for note in notes:
        if note:
            print(f"ddl: note: {as_one_line(note)}", file=sys.stderr)
    if ns.dry_run:
        print(script, end="")
        return 0
    output_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the log's folder
    import tempfile

    fd, name = tempfile.mkstemp(dir=output_dir, suffix=".sbatch",
                                prefix=f"{config.plugin}-{config.strategy}-"
                                       f"{time.strftime('%Y%m%d-%H%M%S')}-")
    with os.fdopen(fd, "w") as f:  # a unique name: two submits in one second keep both
        f.write(script)
    path = Path(name)
    job_id = sbatch(path)
    job_name = ns.job_name or f"ddl-{config.plugin}-{config.strategy}"
    run_dir = config.run_dir or output_dir / rundir.name(config.plugin, config.strategy, job_id)
    print(f"ddl: submitted job {job_id} to {site.name} ({ns.nodes} node(s))")
    print(f"  script:  {path}")
    print(f"  log:     {output_dir / f'{job_name}-{job_id}.out'}")
    print(f"  results: {Path(run_dir) / 'results.json'}")
    return 0


def _image(given: str | None, dry_run: bool) -> str | None:
    """An image on this machine goes into the script as an absolute path (the job may
    start elsewhere); one that is not here is refused unless only printing."""
    if given and (given.strip() != given or not given.isprintable()):
        raise UsageError(f"--container: {given!r} has a control character or surrounding "
                         "blanks; allowed: an image file's path or a registry reference "
                         "(docker://..., oras://...)")
    if not given or "://" in given:
        return given
    if Path(given).exists():
        return str(Path(given).resolve())
    if not dry_run:
        raise UsageError(f"--container: {given} does not exist; give the path of a built "
                         "image (`ddl container build`)")
    return given


def _one_line(values: dict[str, object]) -> None:
    """Values the job's command line carries: quoted safely, but a newline or control
    character in a command or a directory name would fail the job after the queue wait."""
    for flag, value in values.items():
        if value is not None and not str(value).isprintable():
            from ddl.launch.submit import shown

            raise UsageError(f"{flag}: {shown(str(value))} holds a newline or control "
                             "character; allowed: printable characters only")


def site_notes(site, request) -> list[str]:
    """What the site would do with this job that the user may not expect, one note each:
    no account where its sbatch refuses a job without one (JSC); part of a node on a
    partition that allocates and bills whole nodes (LUMI's standard-g)."""
    import os

    notes = []
    accounted = (request.account or os.environ.get("SBATCH_ACCOUNT") or any(
        opt.startswith(("--account=", "-A")) for opt in request.extra_sbatch))
    if site.slurm.account_required and not accounted:
        notes.append(f"no --account: {site.name}'s sbatch refuses a job without a compute "
                     "project; add --account PROJECT (or set SBATCH_ACCOUNT, as `jutil env "
                     "activate -p PROJECT` does on JSC systems)")
    name, part = site.partition(request.partition)
    gpus = request.gpus_per_node
    if part.whole_nodes and gpus is not None and 0 < gpus < part.gpus_per_node:
        notes.append(f"--gpus-per-node {gpus}: partition {name} of {site.name} allocates and "
                     f"bills whole nodes, so the job pays for all {part.gpus_per_node} GPUs "
                     f"of each node; use all {part.gpus_per_node}, or a partition that shares "
                     "nodes" + (" (small-g)" if site.name == "lumi-g" else ""))
    return notes


def _own_arch_mismatch(site, ddl_command: str) -> str | None:
    """Without --container or --setup the job runs this installation's ddl: one built for
    this machine's CPU (ddl doctor's platform check), which may not be the nodes' (an
    x86_64 venv submitting to CTE-POWER's ppc64le nodes)."""
    from ddl.launch.environment import arch_mismatch, machine

    why = arch_mismatch(site, machine())
    if not why:
        return None
    return (f"no --container: the job runs {ddl_command} from this installation, and {why}; "
            "give --container IMAGE (an image built for the nodes) or --setup lines that "
            "activate an environment there")


def _own_torch_mismatch(site, ddl_command: str) -> str | None:
    """Without --container or --setup the job runs this installation's ddl and torch: say
    so when that torch cannot drive the site's GPUs (a login node's venv with PyPI's CUDA
    torch submitting to LUMI), read from torch/version.py, without importing torch."""
    from ddl.launch.environment import build_mismatch, installed_torch

    build = installed_torch()
    why = build and build_mismatch(build, site.name, site.accelerator)
    if not why:
        return None
    return (f"no --container: the job runs {ddl_command} with this installation's torch: "
            f"{why}; give --container IMAGE (docs/containers.md) or --setup lines that "
            "activate a fitting environment")


def this_ddl(setup: list[str]) -> str:
    """This installation's ddl by absolute path; with --setup, `ddl` from the PATH the
    user's setup makes in the job (the venv or module it activates), not the submitter's."""
    if setup:
        return "ddl"
    candidate = Path(sys.executable).with_name("ddl")
    return str(candidate) if candidate.exists() else "ddl"


def _slurm_sites(plugins) -> list[str]:
    from ddl.settings.sites import known_sites, load_profile

    return [n for n, p in known_sites(plugins).items() if load_profile(p).uses_slurm]
