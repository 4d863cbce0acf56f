"""``ddl plan --verify K --submit``: the K best layouts trained in one short Slurm job of the
plan's site and nodes, from a login node that has none of the GPUs.

The job script is ``ddl submit``'s (ddl.launch.submit.render: the site's #SBATCH lines,
setup, environment and rendezvous), with one difference: its batch shell runs
``ddl plan ... --verify K`` itself, which starts each layout as an srun step over the job's
nodes (commands/plan_verify). Everything lands in ``OUTPUT_DIR/plan-verify-JOBID/``:
``plan.json`` (the plan with predicted against measured per layout) and, while the job
runs, the layouts' run directories and any synthetic stand-in data (``TMPDIR`` points
there: the srun steps on other nodes must see them, which a node-local /tmp is not). The
table is in the job's log.

The plan is made on the login node first (printed as without ``--submit``): a plugin, preset
or site the job would refuse is refused before the queue.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ddl.contract.errors import UsageError

JOB_TIME = "00:30:00"  # a few steps per layout: short, so the job starts soon
# `ddl plan` flags the job repeats, as the user gave them
FORWARDED = (("--plugin", "plugin"), ("--preset", "preset"), ("--site", "site"),
             ("--nodes", "nodes"), ("--nproc", "nproc"), ("--partition", "partition"),
             ("--global-batch-size", "global_batch_size"), ("--data-dir", "data_dir"),
             ("--top", "top"), ("--verify", "verify"), ("--precision", "precision"))


@dataclass
class Job:
    script: str
    output_dir: Path
    job_name: str
    site: str


def prepare(ns: argparse.Namespace, site, partition, per_node: int) -> Job:
    """The job's script, checked (site, partition, nodes, time, setup, bash -n):
    ``per_node`` tasks on each node, with as many of the partition's GPUs (none on a
    CPU partition)."""
    from ddl.commands.submit import this_ddl
    from ddl.launch.submit import SubmitRequest, check_syntax, render
    from ddl.settings.plan import absolute

    if not site.uses_slurm:
        raise UsageError(f"--submit: site {site.name} is not a Slurm site; allowed: a Slurm "
                         "site's profile, or --verify without --submit to train here")
    output_dir = absolute(ns.output_dir, "--output-dir")
    ddl_command = this_ddl(ns.setup)
    ddl = shlex.quote(ddl_command)
    args = []
    for flag, key in FORWARDED:
        value = getattr(ns, key)
        if value is not None:
            if key == "data_dir":
                value = absolute(Path(value), "--data-dir")
            args += [flag, shlex.quote(str(value))]
    if ns.sync_bn:
        args.append("--sync-bn")
    out = shlex.quote(str(output_dir)) + '/plan-verify-"$SLURM_JOB_ID"'
    step = ["# The plan's layouts, each an srun step over this job's nodes (ddl plan --verify)",
            f"out={out}",
            'mkdir -p "$out"',
            'export TMPDIR="$out"  # run dirs and stand-in data: on the shared file system',
            f'{ddl} plan {" ".join(args)} --save "$out/plan.json"',
            'echo "ddl: predicted against measured: $out/plan.json"']
    job_name = ns.job_name or f"ddl-plan-{ns.plugin}"
    request = SubmitRequest(
        nodes=ns.nodes, launcher="srun", train_args=[], plugin=ns.plugin, strategy="plan",
        output_dir=output_dir, account=ns.account, partition=ns.partition,
        time=ns.time or JOB_TIME, job_name=job_name,
        gpus_per_node=min(per_node, partition.gpus_per_node if partition else 0),
        tasks_per_node=per_node, ddl_command=ddl_command, extra_sbatch=ns.sbatch,
        stop_margin_s=0, setup=ns.setup, batch_step=step)
    script = render(site, request)
    check_syntax(script, site)
    return Job(script, output_dir, job_name, site.name)


def submit(job: Job, dry_run: bool) -> dict:
    """Hand the script to sbatch (``--dry-run``: only keep it to print); where its output
    will be."""
    from ddl.launch.submit import sbatch

    if dry_run:
        return {"submitted": False, "script": job.script}
    try:
        job.output_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=job.output_dir, suffix=".sbatch",
                                    prefix=f"plan-verify-{time.strftime('%Y%m%d-%H%M%S')}-")
        with os.fdopen(fd, "w") as f:
            f.write(job.script)
    except OSError as exc:
        raise UsageError(f"--output-dir: cannot write the job script to {job.output_dir}: "
                         f"{exc.strerror or exc}; allowed: a directory you can write") from None
    job_id = sbatch(Path(name))
    return {"submitted": True, "job_id": job_id, "site": job.site, "script": name,
            "log": str(job.output_dir / f"{job.job_name}-{job_id}.out"),
            "results": str(job.output_dir / f"plan-verify-{job_id}" / "plan.json")}


def render(job: dict) -> str:
    if not job["submitted"]:
        return "\n# --dry-run: the job --submit would hand to sbatch\n" + job["script"]
    return (f"\nddl: submitted job {job['job_id']} to {job['site']}: the layouts above are "
            "trained there\n"
            f"  script:  {job['script']}\n  log:     {job['log']}\n"
            f"  results: {job['results']}\n")


def check_flags(ns: argparse.Namespace) -> None:
    """Job flags without --submit do nothing: refused rather than ignored."""
    given = [flag for flag, key in (("--account", "account"), ("--time", "time"),
                                    ("--job-name", "job_name"), ("--dry-run", "dry_run"))
             if getattr(ns, key)] + (["--setup"] if ns.setup else []) + (
        ["--sbatch"] if ns.sbatch else [])
    if given and not ns.submit:
        raise UsageError(f"{given[0]}: a Slurm job's setting; allowed: with --verify K "
                         "--submit")
