"""The ``ddl`` argument parser: every command and flag, with help texts (docs/reference/cli.md
is generated from it). No torch: ``ddl --help`` must answer at once."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from ddl import __version__
from ddl.commands.arguments import (
    DEVICE_ALIASES,  # noqa: F401 - the flag's spellings (the config file's are the same)
    add_train_flags,
    bounded,
    directory,
    key_value,
    mesh_degrees,
    nonempty_name,
)
from ddl.contract.errors import UsageError

DESCRIPTION = """\
ddl trains deep-learning models on many processes, GPUs and nodes with the same command
on a laptop, a CI machine or a supercomputer. Without arguments, `ddl train` trains the
MNIST CNN with DDP on 2 local CPU processes (generating synthetic MNIST on first use)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage plus the error), a
    flag is taken only as written (no abbreviations: `--epoch 2` is refused, not read as
    `--epochs 2`, and a flag added later cannot change what an old command line means), and
    a mistyped choice gets the nearest one suggested (`ddl trian`: did you mean 'train'?)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse quotes the bad value whole ("invalid int value: 'xxx...'"): cut a long
        # one to 40 characters, as ddl's own messages do (issue 52).
        raise UsageError(f"{bounded(message, longest=60)} (see `{self.prog} --help`)")

    def parse_known_args(self, args=None, namespace=None):
        """A flag this parser does not know is refused here, where its own flags are known,
        with the nearest one suggested (`--epoch`: did you mean --epochs?)."""
        ns, extras = super().parse_known_args(args, namespace)
        for extra in extras:
            flag = extra.partition("=")[0]
            if flag.startswith("--"):
                known = [s for s in self._option_string_actions if s.startswith("--")]
                # what argparse's abbreviations took first, then the nearest spelling
                near = [s for s in known if s.startswith(flag)][:3] or \
                    difflib.get_close_matches(flag, known, n=1)
                shown = flag if len(flag) <= 40 else f"{flag[:40]}..."
                hint = f"; did you mean {' or '.join(near)}?" if near else ""
                self.error(f"unrecognized argument {shown}{hint}")
        return ns, extras

    def _check_value(self, action, value) -> None:
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            names = [str(choice) for choice in choices]
            shown = value if len(value) <= 40 else f"{value[:40]}..."
            near = difflib.get_close_matches(value, names, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise argparse.ArgumentError(action, f"invalid choice: {shown!r}; {hint}"
                                                 f"allowed: {', '.join(names)}")
        super()._check_value(action, value)


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ddl", description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    train = sub.add_parser("train", help="train a workload with a strategy")
    add_train_flags(train)

    prepare = sub.add_parser("prepare", help="download a dataset (login node) or generate a "
                                             "synthetic one in the same format")
    prepare.add_argument("--plugin", default=argparse.SUPPRESS, help="workload (default: mnist)")
    prepare.add_argument("--data-dir", type=directory, default=argparse.SUPPRESS,
                         help="default: the site's (./data)")
    prepare.add_argument("--site", default=argparse.SUPPRESS,
                         help="default: auto (detected, else local)")
    prepare.add_argument("--preset", type=nonempty_name, default=argparse.SUPPRESS,
                         help="the preset whose data and model files to fetch (default: the "
                              "workload's default; e.g. xsum's t5-large adds its weights)")
    prepare.add_argument("--synthetic", action="store_true",
                         help="generate learnable synthetic data in the official format "
                              "(offline machines, CI); marked as synthetic")

    submit = sub.add_parser("submit", help="render the run as an sbatch script for a site "
                                            "and submit it (or print it with --dry-run)")
    add_train_flags(submit)
    submit.add_argument("--nodes", type=int, default=1, help="default: 1")
    submit.add_argument("--account", help="Slurm account / project")
    submit.add_argument("--partition", help="default: the site's default partition")
    submit.add_argument("--time", help="wall-clock limit (default: 01:00:00)")
    submit.add_argument("--gpus-per-node", type=int, help="default: all of the partition's")
    submit.add_argument("--job-name", help="default: ddl-<plugin>-<strategy>")
    submit.add_argument("--output-dir", type=directory, default=Path("runs"),
                        help="job log and run directory go here (default: ./runs)")
    submit.add_argument("--container", nargs="?", const="", metavar="IMAGE",
                        help="run ddl in this Apptainer/Singularity image (alone: the site "
                             "profile's container.image)")
    submit.add_argument("--ddl-command", help="ddl as the job should call it (default: this "
                                              "installation's ddl; with --setup, `ddl` "
                                              "from the PATH the setup makes)")
    submit.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="extra #SBATCH option, e.g. --sbatch=--qos=debug (repeatable)")
    submit.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="a shell line the job runs before the launch, after the site's "
                             "setup, e.g. --setup 'source /p/project1/x/activate.sh' "
                             "(repeatable). Your own shell: written as given, NOT quoted; "
                             "one line each, checked with bash -n")
    submit.add_argument("--stop-margin", type=int, default=300, metavar="SECONDS",
                        help="before the time limit: checkpoint, stop and requeue the job "
                             "this many seconds early (default: 300; 0 = off)")
    submit.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    submit.add_argument("--force", action="store_true",
                        help="submit a layout predicted not to fit the GPUs' memory anyway")

    _container_parser(sub)
    _measure_parsers(sub)

    _layout_parser(sub)
    _plan_parser(sub)
    sub.add_parser("plugins", help="list installed workloads and strategies")
    _check_plugin_parser(sub)
    sites = sub.add_parser("sites", help="list known site profiles (name, short names, "
                           "description, file); `sites show NAME` prints one")
    sites.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    sites.add_argument("name", nargs="?", help="profile to show")
    doctor = sub.add_parser("doctor", help="check this node for what a job needs")
    doctor.add_argument("--site", default="auto", help="default: auto")
    doctor.add_argument("--data-dir", type=Path, help="data directory to check")
    doctor.add_argument("--collectives", action="store_true",
                        help="instead of the checks: time all-reduce, all-gather, "
                             "reduce-scatter and point-to-point between --nproc processes "
                             "on this node and fit latency and bandwidth (docs/plan.md)")
    doctor.add_argument("--nproc", type=int, help="--collectives: processes (default: the "
                        "GPUs visible, on a CPU the site's nproc or 2)")
    doctor.add_argument("--format", choices=["text", "json"], default="text",
                        help="--collectives: a table or the timings and fits as JSON")
    return parser


def _measure_parsers(sub) -> None:
    scale = sub.add_parser("scale", help="a scaling study: one run per point (--nprocs "
                                          "locally, --nodes as Slurm jobs), then its report")
    add_train_flags(scale)
    scale.add_argument("--nprocs", help="local points, e.g. 1,2,4 (processes)")
    scale.add_argument("--nodes", help="Slurm points, e.g. 1,2,4 (nodes; with --site)")
    scale.add_argument("--scaling", choices=["weak", "strong"], default="weak",
                       help="weak: keep the batch per replica; strong: keep the global "
                            "batch (default: weak)")
    scale.add_argument("--rounds", type=int, help="local points: run every point this "
                       "many times, in alternating rounds; each point is the median, with "
                       "its spread (default: 3)")
    scale.add_argument("--output", type=Path, help="study directory (default: "
                                                   "runs/scale-<plugin>-<strategy>-<time>)")
    scale.add_argument("--peak-flops", metavar="FLOPS|measure",
                       help="device peak for MFU instead of the site profile's; 'measure': "
                            "a one-thread matmul on this CPU")
    for flag in ("--account", "--partition", "--time"):
        scale.add_argument(flag, help=f"Slurm points: as `ddl submit {flag}`")
    scale.add_argument("--dry-run", action="store_true", help="Slurm points: print the "
                                                               "scripts, submit nothing")
    report = sub.add_parser("report", help="scaling table, JSON, CSV, plots and a "
                                           "self-contained report.html from finished runs")
    report.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="finished runs, or a directory of them (a `ddl scale` output)")
    report.add_argument("--output", type=Path, help="where the files go (default: the "
                                                     "runs' common parent)")
    report.add_argument("--peak-flops", metavar="FLOPS|measure",
                        help="device peak for MFU instead of the one in results.json")
    watch = sub.add_parser("watch", help="a live view of a running job from its run "
                                         "directory: progress, throughput, ETA, per-rank "
                                         "utilisation and memory")
    watch.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run's directory "
                       "(`ddl train --run-dir`, or the one its first line names)")
    watch.add_argument("--once", action="store_true",
                       help="print the view once and exit 0 (scripts)")
    watch.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                       help="seconds between refreshes (default: 1); ends by itself when "
                            "the run does: 0 finished, 3 stopped, 1 failed")
    watch.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                       help="how long to wait for RUN_DIR to appear, e.g. right after "
                            "`ddl train &` (default: 60, or 0 with --once)")


def _layout_parser(sub) -> None:
    layout = sub.add_parser("layout", help="which rank holds what under a --mesh: "
                                           "coordinates, process groups, node crossings")
    layout.add_argument("--mesh", type=mesh_degrees, default={}, metavar="DIM=N,...",
                        help="degrees by name, as `ddl train --mesh` without --strategy "
                             "(pp, dp_replicate, dp_shard, tp; dp = dp_shard; the rest is "
                             "dp_shard)")
    layout.add_argument("--nproc", type=int, help="processes per node (default: the "
                                                   "product of the degrees / --nodes)")
    layout.add_argument("--nodes", type=int, default=1, help="default: 1")


def _plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help="rank the layouts of a workload on N nodes of a site "
                          "by predicted memory and step time (ddl.planning.planner)")
    plan.add_argument("--plugin", required=True, help="workload")
    plan.add_argument("--preset", type=nonempty_name, help="default: the workload's")
    plan.add_argument("--site", required=True, help="site profile: a GPU site, or a CPU "
                      "site of this machine (local: each process gets its share of the "
                      "available memory)")
    plan.add_argument("--nodes", type=int, default=1, help="default: 1")
    plan.add_argument("--nproc", type=int, help="processes per node (default: a GPU site's "
                      "GPUs per node; on a CPU site its defaults.nproc, 2 on local)")
    plan.add_argument("--partition", help="default: the site's default partition")
    plan.add_argument("--global-batch-size", type=int,
                      help="samples per optimizer step (default: the preset's batch x GPUs)")
    plan.add_argument("--data-dir", type=directory, help="a sample batch comes from here "
                      "if it holds the data (default ./data; else a synthetic stand-in)")
    plan.add_argument("--top", type=int, default=10, help="layouts shown (default: 10)")
    plan.add_argument("--verify", type=int, nargs="?", const=3, metavar="K",
                      help="train the K best layouts (default 3) here for a few steps and "
                      "print predicted against measured memory and step time; needs the "
                      "plan's processes on this machine (commands/plan_verify)")
    plan.add_argument("--sync-bn", action="store_true", help="the runs use --sync-bn")
    plan.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                      help="the runs' (default auto: 16-bit on GPUs, fp32 on CPUs)")
    plan.add_argument("--format", choices=["table", "json"], default="table")
    plan.add_argument("--save", type=Path, metavar="FILE", help="also write it as JSON")
    job = plan.add_argument_group("one Slurm job for --verify (commands/plan_job)")
    job.add_argument("--submit", action="store_true", help="with --verify: train the "
                     "layouts in one short Slurm job of the plan's site and nodes (from a "
                     "login node); results in OUTPUT_DIR/plan-verify-JOBID/plan.json")
    job.add_argument("--account", help="Slurm account / project")
    job.add_argument("--time", help="wall-clock limit (default: 00:30:00)")
    job.add_argument("--job-name", help="default: ddl-plan-<plugin>")
    job.add_argument("--output-dir", type=Path, default=Path("runs"), help="default: runs")
    job.add_argument("--setup", action="append", default=[], metavar="LINE",
                     help="as `ddl submit --setup`")
    job.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                     help="as `ddl submit --sbatch`")
    job.add_argument("--dry-run", action="store_true",
                     help="print the job script, submit nothing")


def _container_parser(sub) -> None:
    container = sub.add_parser("container", help="build an Apptainer image of ddl, or check "
                                                  "a definition file first")
    actions = container.add_subparsers(dest="action", metavar="ACTION", required=True,
                                       parser_class=_Parser)
    build = actions.add_parser("build", help="apptainer (or singularity) build of "
                                             "containers/<target>.def")
    check = actions.add_parser("check", help="check a definition file before a long build")
    for p in (build, check):
        p.add_argument("--target", choices=["cpu", "cuda", "rocm"], default="cpu",
                       help="which definition in containers/ (default: cpu)")
        p.add_argument("--def", dest="definition", type=Path, metavar="PATH",
                       help="a definition file instead of the target's")
        p.add_argument("--base", help="base image: an existing local image or directory "
                                      "(Bootstrap: localimage), or docker://REF, library://, "
                                      "oras://, shub:// (default: the definition's)")
        p.add_argument("--wheelhouse", type=Path, default=Path("wheelhouse"),
                       help="ddl's wheels from scripts/build-wheelhouse.sh (default: "
                            "./wheelhouse)")
        p.add_argument("--offline", action="store_true",
                       help="install only from the wheelhouse, never from a package index")
        p.add_argument("--build-arg", dest="build_args", action="append", type=key_value,
                       default=[], metavar="KEY=VALUE",
                       help="a build argument of the definition (repeatable)")
    build.add_argument("--output", type=Path,
                       help="image file (default: containers/ddl.sif of the ddl checkout, "
                            "else ./ddl.sif)")
    build.add_argument("--runtime", choices=["apptainer", "singularity"],
                       help="default: apptainer if on PATH, else singularity")
    build.add_argument("--force", action="store_true", help="replace an existing image")
    build.add_argument("--no-compress", action="store_true",
                       help="uncompressed squashfs: much faster on few cores, larger image")
    build.add_argument("--fakeroot", action="store_true",
                       help="pass --fakeroot (unprivileged builds where the site requires it)")
    build.add_argument("--no-check", action="store_true",
                       help="skip ddl's check; the runtime's own parser still runs")
    build.add_argument("--no-test", action="store_true",
                       help="skip the image's %%test at the end of the build (--notest)")
    build.add_argument("--dry-run", action="store_true",
                       help="check and print the build command, build nothing")


SUBMIT_ONLY = ("nodes", "account", "partition", "time", "gpus_per_node", "job_name",
               "output_dir", "container", "ddl_command", "sbatch", "dry_run", "stop_margin",
               "setup", "force")


def _check_plugin_parser(sub) -> None:
    check = sub.add_parser("check-plugin", help="run the conformance kit on an installed "
                           "workload: one line per check, exit 0 if none fails")
    check.add_argument("name", help="workload name (as `ddl plugins` lists it)")
    check.add_argument("--work-dir", type=directory, help="where the runs go, created if "
                       "missing (default: ./check-plugin-NAME)")
    check.add_argument("--data-dir", type=directory, help="the workload's data; synthetic data "
                       "is generated there if missing (default: WORK_DIR/data)")
    check.add_argument("--strategies", nargs="+", metavar="STRATEGY",
                       help="strategies to run against one process (default: every one "
                            "`ddl plugins` lists as supporting the workload)")
    check.add_argument("--checks", nargs="+", metavar="CHECK",
                       help="what to run through `ddl train`: strategies (one run each), "
                            "hsdp, 3d, degrees, accumulation, clipping, resume (default: all)")
    check.add_argument("--preset", type=nonempty_name, default="tiny", help="default: tiny")
    check.add_argument("--tolerance", default="auto", help="weights comparison rule: auto, "
                       "elementwise or per-tensor (default: auto, by the optimizer)")
