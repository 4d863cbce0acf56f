"""``ddl submit``: the same run as an sbatch script in the site's idiom, handed to sbatch.

The script is self-contained and readable: #SBATCH lines as the site's documentation
writes them, the site's setup and environment, the rendezvous derived inside the job (see
ddl.launch.rendezvous), and one srun line that starts ``ddl train`` in the site's launch style
(ddl.launch.slurm) with the run configuration the user gave.

Safety: every user value on the srun line is shell-quoted (shlex.quote), so spaces,
quotes, ``$(...)`` and backticks stay literal. #SBATCH lines are read by sbatch, not by
the shell, and cannot be quoted: values there must match a conservative pattern or are
rejected with one line. The one exception is ``--setup LINE``: those lines are the user's
own shell (``source .../activate.sh``), written as given; they must be one line each and
pass ``bash -n``.

Sized as the site bills it: a job with part of a node asks for the CPUs (and memory) of
the GPUs it asks for, the node's CPUs per GPU each, not the node's; the site's per-GPU CPU
masks bind only a job that has the whole node (LUMI documents them for full-node
allocations); a partition whose name the profile only stands in for gets no --partition
line.

Checked here, before anything reaches sbatch: the partition's node and time limits
(ddl.launch.slurm_time), empty values, so a job the site would refuse (or only reject
after queueing) fails at once in one line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ddl import __version__

from ddl.launch import container_launch, site_env
from ddl.contract.errors import DdlError, UsageError
from ddl.launch.rendezvous import shell_lines
from ddl.launch.slurm_time import check_stop_margin, check_time, shown
from ddl.launch.slurm_time import slurm_seconds  # noqa: F401 - where callers found it
from ddl.settings import cores, rundir
from ddl.settings.sites import SiteProfile

SAFE_SBATCH = re.compile(r"^[A-Za-z0-9._:/+@%=,-]+$")
# Well above the node count of any system with a profile here (the largest have some
# thousand GPU nodes [K]): a typo of a count, refused before a script is written.
MAX_NODES = 10_000
# Account, partition and job names: Slurm's own are short; a longer one is a paste mistake
# that sbatch would refuse only after ddl had written the script.
NAME_LONGEST = 255
HF_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
              "HF_EVALUATE_OFFLINE")


@dataclass
class SubmitRequest:
    nodes: int
    launcher: str  # srun, torchrun or torchrun_jsc
    train_args: list[str]  # flags for `ddl train`, as the user gave them
    plugin: str
    strategy: str
    output_dir: Path  # absolute; holds the job log and the run directory
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    job_name: str | None = None
    run_dir: Path | None = None
    ddl_command: str = "ddl"
    container: str | None = None  # an image; "" = the site's default image
    extra_sbatch: list[str] = field(default_factory=list)
    stop_margin_s: int = 300  # seconds before the time limit to checkpoint, stop, requeue
    setup: list[str] = field(default_factory=list)  # the user's shell lines, run as given
    data_dir: Path | None = None  # absolute; bound into the container with the run dir
    # Instead of the srun of `ddl train`: shell lines the batch script itself runs (after
    # the environment and rendezvous), e.g. `ddl plan --verify`, which starts its own sruns.
    batch_step: list[str] | None = None
    tasks_per_node: int | None = None  # default: one per GPU requested (at least one)


def _given(flag: str, value: str | None) -> str | None:
    """An optional flag's value; an empty one is refused (it would silently mean the
    default, or drop a value given earlier on the command line)."""
    if value == "":
        raise UsageError(f"{flag}: {value!r} is empty; allowed: a value, or leave the flag "
                         "out for the default")
    return value


def _names_cpus(binding: str) -> bool:
    return binding.partition(":")[0] in ("mask_cpu", "map_cpu")


def _sbatch_value(flag: str, value: str, longest: int = 4096) -> str:
    if len(value) > longest:
        raise UsageError(f"{flag}: {value[:20]}... is {len(value)} characters long; allowed: "
                         f"at most {longest}")
    if not SAFE_SBATCH.match(value):
        raise UsageError(f"{flag}: {shown(value)} cannot go into an #SBATCH line; allowed: "
                         "letters, digits and . _ : / + @ % = , -")
    return value


def _setup_lines(lines: list[str]) -> list[str]:
    """The user's ``--setup`` lines, as given (their own shell: not quoted), one line each
    and valid bash together (a block may span several --setup values)."""
    for line in lines:
        if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
            raise UsageError(f"--setup: {shown(line)} holds a newline or control character; "
                             "allowed: one shell line per --setup (repeat the flag)")
    if not lines:
        return lines
    # A warning counts too: an unterminated here-document would swallow the launch.
    proc = subprocess.run(["bash", "-n"], input="\n".join(lines) + "\n", capture_output=True,
                          text=True)
    problem = proc.stderr.strip()
    if proc.returncode or problem:
        first = problem.splitlines()[0] if problem else f"exit {proc.returncode}"
        raise UsageError(f"--setup: not valid bash: {first}")
    return lines


def _setup_block(site_setup: list[str], user_setup: list[str]) -> list[str]:
    """The site's setup lines, then the user's; with ``set -u`` off around them, since
    module files and activate scripts are often not written for it."""
    if not (site_setup or user_setup):
        return []
    block = ["set +u"]
    if site_setup:
        block += ["# Site setup (from the site profile)", *site_setup]
    if user_setup:
        block += ["# Your setup (--setup), as given", *user_setup]
    return block + ["set -u", ""]


def render(site: SiteProfile, req: SubmitRequest) -> str:
    if not site.uses_slurm:
        raise UsageError(f"--site: {site.name} is not a Slurm site (launcher 'local'); "
                         "use `ddl train` there")
    part_name, part = site.partition(_given("--partition", req.partition))
    if req.nodes > MAX_NODES:
        raise UsageError(f"--nodes: {req.nodes} is more than any system ddl knows has; "
                         f"allowed: 1 to {MAX_NODES} (and the partition's limit)")
    if part.max_nodes and req.nodes > part.max_nodes:
        raise UsageError(f"--nodes: partition {part_name} of {site.name} allows at most "
                         f"{part.max_nodes} nodes (got {req.nodes})")
    gpus = req.gpus_per_node if req.gpus_per_node is not None else part.gpus_per_node
    if gpus > part.gpus_per_node:
        raise UsageError(f"--gpus-per-node: partition {part_name} has {part.gpus_per_node} "
                         f"GPUs per node (got {gpus})")
    procs = req.tasks_per_node or max(gpus, 1)
    per_node_launcher = req.launcher in ("torchrun", "torchrun_jsc")
    tasks = 1 if per_node_launcher else procs
    # The CPUs that go with the GPUs asked for (the node's CPUs per GPU), not the node's: on
    # a shared partition a 2-GPU job asking for the whole node's CPUs is billed as the node
    # and blocks its other GPUs (issue 52).
    cpus_per_task = max(part.cpus_for(gpus) // tasks, 1)
    partial = 0 < gpus < part.gpus_per_node  # part of a node's GPUs
    job_name = _sbatch_value("--job-name", _given("--job-name", req.job_name)
                             or f"ddl-{req.plugin}-{req.strategy}", NAME_LONGEST)
    out_dir = _sbatch_value("--output-dir", str(req.output_dir))

    sb = [f"--job-name={job_name}"]
    if _given("--account", req.account):
        sb.append(f"--account={_sbatch_value('--account', req.account, NAME_LONGEST)}")
    if not part.placeholder:  # a stand-in name would send the job to a partition not there
        sb.append(f"--partition={_sbatch_value('--partition', part_name, NAME_LONGEST)}")
    sb += [f"--nodes={req.nodes}", f"--ntasks-per-node={tasks}", f"--cpus-per-task={cpus_per_task}"]
    if gpus and site.slurm.gpu_request == "gres":
        sb.append(f"--gres=gpu:{gpus}")
    elif gpus and site.slurm.gpu_request == "gpus-per-node":
        sb.append(f"--gpus-per-node={gpus}")
    if per_node_launcher and site.slurm.mem and not (partial and site.slurm.mem_per_gpu):
        sb.append(f"--mem={site.slurm.mem}")
    elif site.slurm.mem_per_gpu and gpus and (partial or not per_node_launcher):
        sb.append(f"--mem-per-gpu={site.slurm.mem_per_gpu}")  # a node's memory for its GPUs
    elif site.slurm.mem:
        sb.append(f"--mem={site.slurm.mem}")
    # Short by default (the partition max may be days), but never above the partition's.
    time = check_time(_given("--time", req.time) or "01:00:00", part_name, part.max_time, site)
    check_stop_margin(req.stop_margin_s, time)
    sb.append(f"--time={time}")
    sb.append(f"--output={out_dir}/%x-%j.out")
    if req.stop_margin_s:
        # The time limit: Slurm signals this script (B:) the margin before the end; the
        # trap below asks the run to checkpoint and stop, then the job requeues itself.
        sb += [f"--signal=B:USR1@{req.stop_margin_s}", "--requeue", "--open-mode=append"]
    if site.slurm.exclusive:
        sb.append("--exclusive")
    sb += site.slurm.extra + [_sbatch_value("--sbatch", e) for e in req.extra_sbatch]

    lines = ["#!/bin/bash",
             f"# Rendered by ddl {__version__} for site {site.name}: {site.description}",
             f"# Launch style: {_style_note(req.launcher, procs)}"]
    if part.placeholder:
        lines.append(f"# No --partition: {part_name!r} is the profile's stand-in (the site's "
                     "name is not known); Slurm's default partition takes the job "
                     "(--sbatch=--partition=NAME to choose one)")
    bind_masks = not (partial and not part.whole_nodes and not site.slurm.exclusive)
    if not bind_masks and _names_cpus(site.cpu_binding.srun):
        # The site's masks map GCD i to the cores next to it on a node the job has whole
        # (LUMI documents binding for full-node allocations only). On part of a shared
        # node Slurm hands out any free GPUs and cores: Slurm's own placement instead.
        lines.append(f"# {gpus} of {part.gpus_per_node} GPUs on {part_name}, a shared "
                     "partition: the site's per-GPU CPU masks are for whole nodes, so "
                     "tasks are not bound to them")
    if site.setup or req.setup:
        # File-wide (before the first command): setup lines source files that exist only on
        # the cluster, which shellcheck cannot follow.
        lines.append("# shellcheck disable=SC1091")
    lines += [f"#SBATCH {opt}" for opt in sb]
    lines += ["", "set -euo pipefail", ""]
    lines += _setup_block(site.setup, _setup_lines(req.setup))
    lines.append("# Environment")
    lines.append('export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"  '
                 "# srun no longer inherits --cpus-per-task (Slurm >= 22.05)")
    lines += env_lines(site, gpus)
    if site.offline:
        lines.append("# Compute nodes are offline: never try the model/data hubs")
        lines += [f"export {name}=1" for name in HF_OFFLINE]
    lines.append("")
    lines += shell_lines(site.rendezvous)
    lines.append('echo "ddl: job $SLURM_JOB_ID on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST; '
                 'rendezvous $MASTER_ADDR:$MASTER_PORT"')
    lines.append("")
    if req.batch_step is not None:
        return "\n".join(lines + req.batch_step) + "\n"

    if req.run_dir:
        run_dir = shlex.quote(str(req.run_dir))
    else:
        run_dir = (shlex.quote(f"{req.output_dir}/{rundir.name(req.plugin, req.strategy, '')}")
                   + '"$SLURM_JOB_ID"')
    lines.append(f"run_dir={run_dir}  # the same after a requeue: the run continues there")
    # Under a per-node launcher srun would bind only the launcher, and all its workers with
    # it: the workers bind themselves instead (worker_cores). One failed rank (or node)
    # ends the step at once instead of leaving the others waiting out their timeouts.
    cpu_bind = cores.srun_cpu_bind(site, gpus, per_node_launcher=per_node_launcher,
                                   whole_node=bind_masks)
    srun = ["srun", f"--ntasks-per-node={tasks}", f"--cpu-bind={cpu_bind}",
            "--kill-on-bad-exit=1"]
    if req.container is not None:  # "" = the site's default image
        lines += container_launch.bind_lines(site, _host_dirs(req))
        entry = container_launch.entry(site, container_launch.image_for(site, req.container))
    else:
        entry = [shlex.quote(req.ddl_command)]
    train = ["train", f"--site={shlex.quote(site.name)}", f"--launcher={req.launcher}",
             f"--nproc={procs}", '--run-dir="$run_dir"']
    train += [shlex.quote(a) for a in req.train_args]
    lines.append(f"# {_launch_note(req.launcher)}")
    launch = " \\\n    ".join([" ".join(srun + entry), " ".join(train)])
    if not req.stop_margin_s:
        lines.append(launch)
        return "\n".join(lines) + "\n"
    lines += _stoppable(launch, req.stop_margin_s)
    return "\n".join(lines) + "\n"


def _host_dirs(req: SubmitRequest) -> list[container_launch.HostDir]:
    """What the container must see of the host: the run directory (shell word: it holds
    the job id) and the data directory."""
    # The default run dir lies in output_dir.
    where = (req.run_dir, "--run-dir") if req.run_dir else (req.output_dir, "--output-dir")
    dirs = [container_launch.HostDir('"$run_dir"', *where)]
    if req.data_dir is not None:
        dirs.append(container_launch.HostDir(shlex.quote(str(req.data_dir)), req.data_dir,
                                             "--data-dir"))
    return dirs


def _stoppable(launch: str, margin_s: int) -> list[str]:
    """Run the step in the background so the USR1 trap fires at once (bash runs traps only
    between commands), and requeue the job when it stopped early. The trap only creates
    RUN_DIR/STOP, which the ranks poll: that reaches ranks behind torchrun or inside a
    container alike, and requeueing from this script (outside any container) finds
    scontrol wherever the login environment has it."""
    return [
        'rm -f "$run_dir/STOP"  # a requeued job starts without the previous stop request',
        "stop_requested=0",
        f"trap 'stop_requested=1; mkdir -p \"$run_dir\"; touch \"$run_dir/STOP\"; "
        f"echo \"ddl: {margin_s} s to the time limit: checkpointing and stopping\"' USR1",
        launch + " &",
        "step=$!",
        'status=0; wait "$step" || status=$?',
        'while kill -0 "$step" 2>/dev/null; do status=0; wait "$step" || status=$?; done',
        'if [ "$stop_requested" = 1 ] && [ ! -e "$run_dir/results.json" ]; then',
        "  if command -v scontrol >/dev/null; then",
        '    echo "ddl: requeueing job $SLURM_JOB_ID; the run resumes from its checkpoint"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "  else",
        '    echo "ddl: cannot requeue (no scontrol here): submit this script again;'
        ' the run resumes from its checkpoint in $run_dir" >&2',
        "  fi",
        "fi",
        'exit "$status"',
    ]


def _style_note(launcher: str, procs: int) -> str:
    if launcher == "srun":
        return f"srun starts {procs} ddl worker(s) per node, one per GPU"
    return f"srun starts one {launcher} per node, which starts {procs} worker(s)"


def _launch_note(launcher: str) -> str:
    if launcher == "torchrun":
        return ("One plain torchrun per node; ddl passes is_host and --local_addr itself "
                "(pytorch/pytorch#73656)")
    if launcher == "torchrun_jsc":
        return "One torchrun_jsc per node (JSC's fix for IB-suffixed rendezvous hosts)"
    return "One process per GPU; ranks from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS"


def env_lines(site: SiteProfile, gpus: int | None = None) -> list[str]:
    return [f'export {k}="{v}"' for k, v in site_env.variables(site, gpus).items()]


def _bash_n(text: str) -> str:
    """bash's complaint about the syntax of ``text``; empty if there is none."""
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    return proc.stderr.strip() if proc.returncode else ""


def check_syntax(script: str, site: SiteProfile | None = None) -> None:
    """The rendered script must parse. If it does not, and the site profile's own shell
    (setup lines, environment) is what fails, that is the profile author's to fix."""
    problem = _bash_n(script)
    if not problem:
        return
    if site is not None:
        own = _bash_n("\n".join([*site.setup, *env_lines(site)]))
        if own:
            raise UsageError(f"{site.source}: setup/env: not valid bash: "
                             f"{own.splitlines()[0]}")
    raise DdlError(f"internal error: rendered script fails `bash -n`: {problem}")


def sbatch(script_path: Path) -> str:
    """Submit; return the job id."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True,
                              text=True, timeout=120)
    except FileNotFoundError:
        raise DdlError("sbatch not found: run `ddl submit` on a login node of the site, or "
                       "use --dry-run to print the script") from None
    if proc.returncode:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise DdlError(f"sbatch refused the job: {reason} (script kept at {script_path})")
    return proc.stdout.strip().split(";")[0]
