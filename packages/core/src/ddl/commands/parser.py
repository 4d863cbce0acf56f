"""The ``ddl`` argument parser: every command and flag, with help texts (docs/reference/cli.md
is generated from it). No torch: ``ddl --help`` must answer at once."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from ddl import __version__
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
        from ddl.commands.cli import bounded

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


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _mesh(text: str) -> dict[str, int] | str:
    if text == "auto":  # ddl train: the layout `ddl plan` ranks first (commands/auto_layout)
        return text
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not DIM=N with N >= 1 "
                                             "(e.g. dp=2,tp=2)")
        if name in mesh:  # a dict would keep the last silently
            raise argparse.ArgumentTypeError(f"{name!r} is named twice in {text!r}; "
                                             "allowed: each dimension once")
        mesh[name] = int(size)
    return mesh


#: What users of AMD GPUs (LUMI) type for the GPU device; torch's ROCm build drives them
#: through the ``cuda`` device type, so each means ``--device cuda``.
DEVICE_ALIASES = {"rocm": "cuda", "hip": "cuda", "gpu": "cuda"}
DEVICES = ("auto", "cpu", "cuda")


def _device(text: str) -> str:
    if text in DEVICES:
        return text
    if text.lower() in DEVICE_ALIASES:
        return DEVICE_ALIASES[text.lower()]
    shown = text if len(text) <= 40 else f"{text[:40]}..."
    near = difflib.get_close_matches(text.lower(), [*DEVICES, *DEVICE_ALIASES], n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise argparse.ArgumentTypeError(
        f"invalid choice: {shown!r}; {hint}allowed: {', '.join(DEVICES)} (rocm, hip and gpu "
        "mean cuda: torch drives AMD GPUs as cuda devices)")


def _name(text: str) -> str:
    """A name flag's value (--preset): an empty one is refused, not read as the default."""
    if not text:
        raise argparse.ArgumentTypeError("an empty name; allowed: a name (leave the flag out "
                                         "for the default)")
    return text


def _directory(text: str) -> Path:
    """A directory flag's path; an empty one is refused (Path("") is the current directory,
    so `--run-dir ''` would write a run into it)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path would mean the current directory; "
                                         "allowed: a directory name ('.' to mean the current "
                                         "one)")
    return Path(text)


def _train_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS  # only flags actually given override the config file and site
    p.add_argument("--config", type=Path, default=S, help="TOML file of run settings")
    p.add_argument("--plugin", default=S, help="workload plugin (default: mnist)")
    p.add_argument("--strategy", default=S, help="parallelism strategy (default: ddp; with "
                   "--mesh alone: mesh, which composes whatever --mesh names)")
    p.add_argument("--site", default=S, help="site profile (default: auto, the profile "
                   "whose detect rules match this machine, else local)")
    p.add_argument("--preset", type=_name, default=S,
                   help="workload size preset (default: the course's)")
    p.add_argument("--mesh", type=_mesh, default=S, metavar="DIM=N,...",
                   help="parallel degrees by name (pp, dp_replicate, dp_shard, tp; dp = the "
                        "strategy's data parallelism): pp=2,tp=2,dp_shard=2 (3-D), "
                        "dp_replicate=2,dp_shard=2 (HSDP); the unnamed rest is dp_shard")
    p.add_argument("--microbatches", type=int, default=S,
                   help="pipeline microbatches per step (pp; default: 2 x stages)")
    p.add_argument("--strategy-option", dest="strategy_options", action="append",
                   type=_key_value, default=S, metavar="KEY=VALUE",
                   help="strategy setting, repeatable (see `ddl plugins`)")
    p.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=S,
                   help="BatchNorm statistics over the whole global batch, not each rank's "
                        "share (data-parallel strategies; default: off)")
    p.add_argument("--nproc", type=int, default=S,
                   help="local worker processes (default: the site's, 2 on `local`)")
    p.add_argument("--epochs", type=int, default=S, help="default: the preset's")
    # both together: gradient accumulation (ddl.settings.config.resolve_batch)
    p.add_argument("--batch-size", type=int, default=S,
                   help="samples per replica per forward pass (default: the preset's)")
    p.add_argument("--global-batch-size", type=int, default=S,
                   help="samples per optimizer step over all replicas; keeps runs with "
                        "different layouts comparable; with --batch-size, gradients are "
                        "accumulated over global / (batch x replicas) micro-steps")
    p.add_argument("--activation-checkpointing", choices=["none", "full", "selective"],
                   default=S, help="recompute activations in the backward, per block unit: "
                                   "full or selective (default: none)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=S,
                   help="torch.compile each block unit of the model (default: off)")
    p.add_argument("--lr", type=float, default=S, help="learning rate (default: the preset's)")
    p.add_argument("--lr-scaling", choices=["none", "linear"], default=S,
                   help="linear: lr x global batch / preset batch (default: none)")
    p.add_argument("--clip-grad-norm", type=float, default=S, metavar="MAX",
                   help="scale gradients to a global 2-norm of at most MAX (default: off)")
    p.add_argument("--lr-schedule", choices=["workload", "constant", "cosine", "linear", "step"],
                   default=S, help="shape after warm-up (default: the workload's own; "
                                   "cosine/linear decay to 0 at the last step)")
    p.add_argument("--warmup-steps", type=int, default=S,
                   help="linear learning-rate warm-up in optimizer steps")
    p.add_argument("--warmup-epochs", type=float, default=S,
                   help="linear learning-rate warm-up length (default: 0)")
    p.add_argument("--seed", type=int, default=S, help="default: 1, as in the courses")
    p.add_argument("--data-dir", type=_directory, default=S,
                   help="default: the site's (./data)")
    p.add_argument("--run-dir", type=_directory, default=S,
                   help="where results go (default: runs/<plugin>-<strategy>-<time>)")
    p.add_argument("--workers", type=int, default=S, help="DataLoader workers per process")
    p.add_argument("--steps-per-epoch", type=int, default=S,
                   help="cap on training steps per epoch (quick checks)")
    p.add_argument("--eval-samples", type=int, default=S, metavar="N",
                   help="validate and test on the first N samples of each split "
                        "(quick checks; default: all)")
    p.add_argument("--log-every", type=int, default=S, help="steps between progress lines")
    p.add_argument("--check-every", type=int, default=S, metavar="STEPS",
                   help="steps between checks for a non-finite loss or a stop request "
                        "(default: 10; also before checkpoints and at epoch ends)")
    p.add_argument("--profile", type=int, nargs="?", const=5, default=S, metavar="STEPS",
                   help="trace STEPS training steps per rank with torch.profiler (default "
                        "5, after 2 skipped): trace-rank<r>.json + a summary in results.json")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=S,
                   help="on GPUs, fp32 matrix products on tensor cores (TF32; default: on; "
                        "--no-tf32 keeps full fp32 where autocast leaves it)")
    p.add_argument("--count-syncs", action=argparse.BooleanOptionalAction, default=S,
                   help="count each step's host-device synchronisations on rank 0 and say "
                        "where they come from (results.json step_breakdown.syncs)")
    p.add_argument("--checkpoint-every", type=int, default=S, metavar="STEPS",
                   help="optimizer steps between checkpoints (default: every epoch's end)")
    p.add_argument("--keep-checkpoints", type=int, default=S, metavar="K",
                   help="newest checkpoints kept (default: 2; 0 = none)")
    p.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=S,
                   help="write checkpoints while training goes on, from a host copy of the "
                        "state (default: off; docs/checkpoints.md)")
    p.add_argument("--max-restarts", type=int, default=S, metavar="N",
                   help="restart failed workers up to N times, resuming from the newest "
                        "checkpoint (local and torchrun launchers; default: 0)")
    p.add_argument("--resume", default=S, metavar="auto|none|PATH",
                   help="auto: continue the run dir's newest checkpoint if any; PATH: start "
                        "from a checkpoint or run directory (any world size/strategy)")
    p.add_argument("--rendezvous-timeout", type=float, default=S, metavar="SECONDS",
                   help="how long ranks wait for each other at start-up before the run "
                        "fails naming the address and the ranks that arrived (default: 300)")
    p.add_argument("--hang-timeout", type=float, default=S, metavar="SECONDS",
                   help="a rank without a heartbeat this long counts as hung: the run ends "
                        "with one line naming it (default: 120; 0 = off, else at "
                        "least 1)")
    p.add_argument("--device", type=_device, default=S, metavar="{auto,cpu,cuda}",
                   help="default: auto (the site's accelerator); rocm, hip and gpu mean "
                        "cuda (torch drives AMD GPUs as cuda devices)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default=S,
                   help="auto: bf16 on GPUs that have it, fp16 with loss scaling on older "
                        "GPUs, fp32 on CPU")
    p.add_argument("--launcher", choices=["auto", "local", "srun", "torchrun", "torchrun_jsc"],
                   default=S, help="how workers start (default: auto: local processes "
                   "outside Slurm, the site's style inside a job)")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ddl", description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    train = sub.add_parser("train", help="train a workload with a strategy")
    _train_flags(train)

    prepare = sub.add_parser("prepare", help="download a dataset (login node) or generate a "
                                             "synthetic one in the same format")
    prepare.add_argument("--plugin", default=argparse.SUPPRESS, help="workload (default: mnist)")
    prepare.add_argument("--data-dir", type=_directory, default=argparse.SUPPRESS,
                         help="default: the site's (./data)")
    prepare.add_argument("--site", default=argparse.SUPPRESS,
                         help="default: auto (detected, else local)")
    prepare.add_argument("--preset", type=_name, default=argparse.SUPPRESS,
                         help="the preset whose data and model files to fetch (default: the "
                              "workload's default; e.g. xsum's t5-large adds its weights)")
    prepare.add_argument("--synthetic", action="store_true",
                         help="generate learnable synthetic data in the official format "
                              "(offline machines, CI); marked as synthetic")

    submit = sub.add_parser("submit", help="render the run as an sbatch script for a site "
                                            "and submit it (or print it with --dry-run)")
    _train_flags(submit)
    submit.add_argument("--nodes", type=int, default=1, help="default: 1")
    submit.add_argument("--account", help="Slurm account / project")
    submit.add_argument("--partition", help="default: the site's default partition")
    submit.add_argument("--time", help="wall-clock limit (default: 01:00:00)")
    submit.add_argument("--gpus-per-node", type=int, help="default: all of the partition's")
    submit.add_argument("--job-name", help="default: ddl-<plugin>-<strategy>")
    submit.add_argument("--output-dir", type=_directory, default=Path("runs"),
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
    _train_flags(scale)
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
    layout.add_argument("--mesh", type=_mesh, default={}, metavar="DIM=N,...",
                        help="degrees by name, as `ddl train --mesh` without --strategy "
                             "(pp, dp_replicate, dp_shard, tp; dp = dp_shard; the rest is "
                             "dp_shard)")
    layout.add_argument("--nproc", type=int, help="processes per node (default: the "
                                                   "product of the degrees / --nodes)")
    layout.add_argument("--nodes", type=int, default=1, help="default: 1")


def _plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help="rank the layouts of a workload on N nodes of a site "
                          "by predicted memory and step time (ddl.worker.planner)")
    plan.add_argument("--plugin", required=True, help="workload")
    plan.add_argument("--preset", type=_name, help="default: the workload's")
    plan.add_argument("--site", required=True, help="site profile: a GPU site, or a CPU "
                      "site of this machine (local: each process gets its share of the "
                      "available memory)")
    plan.add_argument("--nodes", type=int, default=1, help="default: 1")
    plan.add_argument("--nproc", type=int, help="processes per node (default: a GPU site's "
                      "GPUs per node; on a CPU site its defaults.nproc, 2 on local)")
    plan.add_argument("--partition", help="default: the site's default partition")
    plan.add_argument("--global-batch-size", type=int,
                      help="samples per optimizer step (default: the preset's batch x GPUs)")
    plan.add_argument("--data-dir", type=_directory, help="a sample batch comes from here "
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
        p.add_argument("--build-arg", dest="build_args", action="append", type=_key_value,
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
    check.add_argument("--work-dir", type=Path, help="where the runs go, created if missing "
                       "(default: ./check-plugin-NAME)")
    check.add_argument("--data-dir", type=Path, help="the workload's data; synthetic data "
                       "is generated there if missing (default: WORK_DIR/data)")
    check.add_argument("--strategies", nargs="+", metavar="STRATEGY",
                       help="strategies to run against one process (default: every one "
                            "`ddl plugins` lists as supporting the workload)")
    check.add_argument("--checks", nargs="+", metavar="CHECK",
                       help="what to run through `ddl train`: strategies (one run each), "
                            "hsdp, 3d, degrees, accumulation, clipping, resume (default: all)")
    check.add_argument("--preset", default="tiny", help="default: tiny")
    check.add_argument("--tolerance", default="auto", help="weights comparison rule: auto, "
                       "elementwise or per-tensor (default: auto, by the optimizer)")
