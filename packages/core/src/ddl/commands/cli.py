"""The ``ddl`` command line.

Kept free of torch imports at module level: ``ddl --help``, ``ddl plugins`` and ``ddl sites``
answer in well under a second. Every error a user can cause ends as one line on stderr and
exit code 2 (see ddl.contract.errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ddl import __version__
from ddl.contract.errors import EXIT_STOPPED, DdlError, UsageError, as_one_line

DESCRIPTION = """\
ddl trains deep-learning models on many processes, GPUs and nodes with the same command
on a laptop, a CI machine or a supercomputer. Without arguments, `ddl train` trains the
MNIST CNN with DDP on 2 local CPU processes (generating synthetic MNIST on first use)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage plus the error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _mesh(text: str) -> dict[str, int]:
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not DIM=N with N >= 1 "
                                             "(e.g. dp=2,tp=2)")
        mesh[name] = int(size)
    return mesh


def _train_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS  # only flags actually given override the config file and site
    p.add_argument("--config", type=Path, default=S, help="TOML file of run settings")
    p.add_argument("--plugin", default=S, help="workload plugin (default: mnist)")
    p.add_argument("--strategy", default=S, help="parallelism strategy (default: ddp)")
    p.add_argument("--site", default=S, help="site profile (default: local)")
    p.add_argument("--preset", default=S, help="workload size preset (default: the course's)")
    p.add_argument("--mesh", type=_mesh, default=S, metavar="DIM=N,...",
                   help="parallel degrees: dp=2,tp=2 (fsdp+tp) or dp=2,pp=2 (pp)")
    p.add_argument("--microbatches", type=int, default=S,
                   help="pipeline microbatches per step (pp; default: 2 x stages)")
    p.add_argument("--strategy-option", dest="strategy_options", action="append",
                   type=_key_value, default=S, metavar="KEY=VALUE",
                   help="strategy setting, repeatable (see `ddl plugins`)")
    p.add_argument("--nproc", type=int, default=S,
                   help="local worker processes (default: the site's, 2 on `local`)")
    p.add_argument("--epochs", type=int, default=S, help="default: the preset's")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=int, default=S,
                       help="samples per replica per step (default: the preset's)")
    batch.add_argument("--global-batch-size", type=int, default=S,
                       help="samples per optimizer step over all replicas; keeps runs with "
                            "different layouts comparable")
    p.add_argument("--lr", type=float, default=S, help="learning rate (default: the preset's)")
    p.add_argument("--lr-scaling", choices=["none", "linear"], default=S,
                   help="linear: lr x global batch / preset batch (default: none)")
    p.add_argument("--warmup-epochs", type=float, default=S,
                   help="linear learning-rate warm-up length (default: 0)")
    p.add_argument("--seed", type=int, default=S, help="default: 1, as in the courses")
    p.add_argument("--data-dir", type=Path, default=S, help="default: the site's (./data)")
    p.add_argument("--run-dir", type=Path, default=S,
                   help="where results go (default: runs/<plugin>-<strategy>-<time>)")
    p.add_argument("--workers", type=int, default=S, help="DataLoader workers per process")
    p.add_argument("--steps-per-epoch", type=int, default=S,
                   help="cap on training steps per epoch (quick checks)")
    p.add_argument("--log-every", type=int, default=S, help="steps between progress lines")
    p.add_argument("--profile", type=int, nargs="?", const=5, default=S, metavar="STEPS",
                   help="trace STEPS training steps per rank with torch.profiler (default "
                        "5, after 2 skipped): trace-rank<r>.json + a summary in results.json")
    p.add_argument("--checkpoint-every", type=int, default=S, metavar="STEPS",
                   help="optimizer steps between checkpoints (default: every epoch's end)")
    p.add_argument("--keep-checkpoints", type=int, default=S, metavar="K",
                   help="newest checkpoints kept (default: 2; 0 = none)")
    p.add_argument("--max-restarts", type=int, default=S, metavar="N",
                   help="restart failed workers up to N times, resuming from the newest "
                        "checkpoint (local and torchrun launchers; default: 0)")
    p.add_argument("--resume", default=S, metavar="auto|none|PATH",
                   help="auto: continue the run dir's newest checkpoint if any; PATH: start "
                        "from a checkpoint or run directory (any world size/strategy)")
    p.add_argument("--rendezvous-timeout", type=float, default=S, metavar="SECONDS",
                   help="how long ranks wait for each other at start-up before the run "
                        "fails naming the address and the ranks that arrived (default: 300)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=S,
                   help="default: auto (the site's accelerator)")
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
    prepare.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS,
                         help="default: the site's (./data)")
    prepare.add_argument("--site", default=argparse.SUPPRESS, help="default: local")
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
    submit.add_argument("--output-dir", type=Path, default=Path("runs"),
                        help="job log and run directory go here (default: ./runs)")
    submit.add_argument("--container", nargs="?", const="", metavar="IMAGE",
                        help="run ddl in this Apptainer/Singularity image (alone: the site "
                             "profile's container.image)")
    submit.add_argument("--ddl-command", help="ddl as the job should call it (default: this "
                                              "installation's ddl)")
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

    _container_parser(sub)
    _measure_parsers(sub)

    sub.add_parser("plugins", help="list installed workloads and strategies")
    sites = sub.add_parser("sites", help="list known site profiles (name, short names, "
                           "description, file); `sites show NAME` prints one")
    sites.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    sites.add_argument("name", nargs="?", help="profile to show")
    doctor = sub.add_parser("doctor", help="check this node for what a job needs")
    doctor.add_argument("--site", default="auto", help="default: auto")
    doctor.add_argument("--data-dir", type=Path, help="data directory to check")
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
    scale.add_argument("--output", type=Path, help="study directory (default: "
                                                   "runs/scale-<plugin>-<strategy>-<time>)")
    scale.add_argument("--peak-flops", metavar="FLOPS|measure",
                       help="device peak for MFU instead of the site profile's; 'measure': "
                            "a one-thread matmul on this CPU")
    for flag in ("--account", "--partition", "--time"):
        scale.add_argument(flag, help=f"Slurm points: as `ddl submit {flag}`")
    scale.add_argument("--dry-run", action="store_true", help="Slurm points: print the "
                                                               "scripts, submit nothing")
    report = sub.add_parser("report", help="scaling table, JSON, CSV and plots from "
                                           "finished runs")
    report.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="finished runs, or a directory of them (a `ddl scale` output)")
    report.add_argument("--output", type=Path, help="default: the runs' common parent")
    report.add_argument("--peak-flops", metavar="FLOPS|measure",
                        help="device peak for MFU instead of the one in results.json")


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
               "setup")


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    skip = ("command", "config", "synthetic", *SUBMIT_ONLY)
    flags = {k: v for k, v in vars(ns).items() if k not in skip}
    if "strategy_options" in flags:
        flags["strategy_options"] = dict(flags["strategy_options"])
    return flags


def train_arguments(flags: dict[str, Any], leave_out: Collection[str] = ()) -> list[str]:
    """Parsed train flags written back as ``--key=value`` for a ``ddl train`` that starts
    elsewhere (a batch job, a point of ``ddl scale``): paths are made absolute because
    that run may start in another directory."""
    args = []
    for key, value in flags.items():
        if key in leave_out:
            continue
        if key == "strategy_options":  # a dict, or the (key, value) pairs argparse made
            args += [f"--strategy-option={k}={v}" for k, v in dict(value).items()]
            continue
        if key == "mesh":
            value = ",".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, Path):
            value = value.resolve()
        args.append(f"--{key.replace('_', '-')}={value}")
    return args


def cmd_train(ns: argparse.Namespace) -> int:
    import os

    from ddl.launch.environment import check_runtime

    check_runtime()  # first: an old Python or torch would fail the imports below untidily
    from ddl.settings import config as cfg
    from ddl.settings import rundir
    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import get_site
    from ddl.launch.slurm import choose_launcher

    plugins = Plugins()
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    built = cfg.build(_flags(ns), file_values, plugins)
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
        from ddl.worker import entry as worker
        from ddl.launch.slurm import srun_worker_env

        if launcher == "srun":
            os.environ.update(srun_worker_env(site))
        _preflight(config, plugins, int(os.environ["WORLD_SIZE"]), False)
        worker.run(config, create_run_dir=True)
        worker.exit_now(0)  # skip interpreter teardown (see worker.exit_now)

    from ddl.worker import entry as worker
    from ddl.launch.slurm import exec_node_launcher, node_launcher_command

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

    from ddl.contract.world import World
    from ddl.contract.errors import DataMissing
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
    from ddl.settings import config as cfg
    from ddl.contract.plugins import Plugins

    plugins = Plugins()
    config = cfg.build(_flags(ns), {}, plugins).config
    spec = plugins.workload(config.plugin)
    workload = spec.create(spec.presets[spec.default_preset])
    data_dir = Path(config.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise UsageError(f"--data-dir: {data_dir} exists and is not a directory")
    where = workload.prepare(data_dir, synthetic=ns.synthetic)
    kind = "synthetic" if ns.synthetic else "official"
    print(f"ddl: {config.plugin} data ({kind}) ready in {where}")
    return 0


def cmd_submit(ns: argparse.Namespace) -> int:
    import os
    import time

    from ddl.settings import config as cfg
    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import get_site
    from ddl.launch.container_launch import check_target, image_for
    from ddl.launch.submit import SubmitRequest, check_syntax, render, sbatch

    plugins = Plugins()
    flags = _flags(ns)
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    built = cfg.build(flags, file_values, plugins)  # validates everything the job will get
    config = built.config
    plugins.workload(config.plugin)
    plugins.strategy(config.strategy)
    site = get_site(config.site, plugins)
    if ns.nodes < 1:
        raise UsageError(f"--nodes: must be at least 1 (got {ns.nodes})")
    if ns.gpus_per_node is not None and ns.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node: must be 0 or more (got {ns.gpus_per_node})")
    launcher = config.launcher if config.launcher not in ("auto", "local") else site.launcher
    if launcher == "local":
        raise UsageError(f"--site: {site.name} is not a Slurm site; allowed: "
                         + ", ".join(n for n in _slurm_sites(plugins)))
    # The job gets the user's own flags (site, launcher, nproc, run dir are set by ddl).
    given = {"config": ns.config, **flags} if "config" in ns else flags
    forwarded = train_arguments(given, leave_out=("site", "launcher", "nproc", "run_dir"))
    output_dir = ns.output_dir.resolve()
    image = _image(ns.container, ns.dry_run)
    if image is not None:
        image = image_for(site, image)
    request = SubmitRequest(
        nodes=ns.nodes, launcher=launcher, train_args=forwarded, plugin=config.plugin,
        strategy=config.strategy, output_dir=output_dir, account=ns.account,
        partition=ns.partition, time=ns.time, gpus_per_node=ns.gpus_per_node,
        job_name=ns.job_name, run_dir=config.run_dir.resolve() if config.run_dir else None,
        ddl_command=ns.ddl_command or _this_ddl(), container=image,
        extra_sbatch=ns.sbatch, stop_margin_s=ns.stop_margin, setup=ns.setup,
        data_dir=Path(config.data_dir).resolve() if config.data_dir else None)
    script = render(site, request)
    check_syntax(script, site)
    if image is not None:  # the slow part (the runtime reads the image) comes last
        note = check_target(site, image, config.device)
        if note:
            print(f"ddl: note: {note}", file=sys.stderr)
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
    run_dir = config.run_dir or output_dir / f"{config.plugin}-{config.strategy}-{job_id}"
    print(f"ddl: submitted job {job_id} to {site.name} ({ns.nodes} node(s))")
    print(f"  script:  {path}")
    print(f"  log:     {output_dir / f'{job_name}-{job_id}.out'}")
    print(f"  results: {Path(run_dir) / 'results.json'}")
    return 0


def _image(given: str | None, dry_run: bool) -> str | None:
    """An image on this machine goes into the script as an absolute path (the job may
    start elsewhere); one that is not here is refused unless only printing."""
    if not given or "://" in given:
        return given
    if Path(given).exists():
        return str(Path(given).resolve())
    if not dry_run:
        raise UsageError(f"--container: {given} does not exist; give the path of a built "
                         "image (`ddl container build`)")
    return given


def _this_ddl() -> str:
    candidate = Path(sys.executable).with_name("ddl")
    return str(candidate) if candidate.exists() else "ddl"


def _slurm_sites(plugins) -> list[str]:
    from ddl.settings.sites import known_sites, load_profile

    return [n for n, p in known_sites(plugins).items() if load_profile(p).uses_slurm]


def cmd_plugins(ns: argparse.Namespace) -> int:
    from ddl.commands import plugin_listing
    from ddl.contract.plugins import Plugins

    print("\n".join(plugin_listing.render(Plugins())))
    return 0


def cmd_sites(ns: argparse.Namespace) -> int:
    import json

    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import aliases, get_site, known_sites, load_profile

    plugins = Plugins()
    if ns.action == "show":
        if not ns.name:
            raise UsageError("sites show: name a profile; allowed: "
                             + ", ".join(known_sites(plugins)))
        profile = get_site(ns.name, plugins)
        print(f"# {profile.source}")
        print(json.dumps(profile.model_dump(mode="json"), indent=2))
        return 0
    short = aliases(plugins)
    for name, path in known_sites(plugins).items():
        try:
            description = load_profile(path).description
        except UsageError as exc:
            description = f"INVALID: {exc}"
        also = ", ".join(a for a, p in short.items() if p == name)
        print(f"  {name:<16} {also or '-':<8} {description}  [{path}]")
    return 0


def cmd_container(ns: argparse.Namespace) -> int:
    import shlex

    from ddl.launch import container_build as container

    definition = ns.definition or container.definition_for(ns.target)
    request = container.BuildRequest(
        definition=definition, wheelhouse=ns.wheelhouse, base=ns.base, offline=ns.offline,
        build_args=dict(ns.build_args),
        output=getattr(ns, "output", None) or container.default_output())
    if ns.action == "check":
        container.validate(request)
        print(f"ddl: {definition} is fine")
        return 0
    request.force, request.no_compress, request.fakeroot = ns.force, ns.no_compress, ns.fakeroot
    request.no_test = ns.no_test
    try:
        runtime = container.detect_runtime(container.find_runtime(ns.runtime))
    except DdlError:
        if not ns.dry_run:
            raise
        runtime = ns.runtime or "apptainer"  # printing the command needs no runtime
    command = container.prepare(request, runtime, check=not ns.no_check)
    if ns.dry_run:
        print(shlex.join(command))
        return 0
    container.run_build(command, definition)
    name = Path(command[0]).name
    print(f"ddl: built {request.output}; try `{name} run {request.output} --help` and "
          f"`{name} test {request.output}`")
    return 0


def cmd_scale(ns: argparse.Namespace) -> int:
    from ddl.commands import report
    from ddl.commands import scaling

    flags = {k: v for k, v in vars(ns).items() if v is not None}
    scaling.check_mode(flags)
    points = scaling.parse_points(ns.nprocs or ns.nodes, "--nprocs" if ns.nprocs else "--nodes")
    peak = scaling.parse_peak(ns.peak_flops)
    out = scaling.output_dir(ns.output, flags)
    train_args = [*train_arguments(flags, leave_out=scaling.OWN),
                  scaling.batch_flag(flags, ns.scaling, points[0] if ns.nprocs else 1)]
    if ns.nodes:
        submit_args = [f"--{k.replace('_', '-')}={flags[k]}" for k in
                       ("account", "partition", "time") if k in flags]
        code = scaling.submit_slurm(points, train_args, out,
                                    submit_args + (["--dry-run"] if ns.dry_run else []))
        if code == 0 and not ns.dry_run:
            print(f"ddl scale: when the jobs have finished: ddl report {out}")
        return code
    runs = scaling.run_local(points, train_args, out)
    built = report.build(runs, peak)
    print(report.format_table(built))
    for path in report.write(built, out):
        print(f"  {path}")
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    import os

    from ddl.commands import report

    from ddl.commands import scaling

    runs = report.expand(ns.run_dirs)
    built = report.build(runs, scaling.parse_peak(ns.peak_flops))
    out = ns.output or Path(os.path.commonpath([str(Path(d).resolve().parent) for d in runs]))
    print(report.format_table(built))
    for path in report.write(built, out):
        print(f"  {path}")
    return 0


def cmd_doctor(ns: argparse.Namespace) -> int:
    from ddl.commands.doctor import run_checks

    return run_checks(ns.site, ns.data_dir)


COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "submit": cmd_submit,
            "container": cmd_container, "scale": cmd_scale, "report": cmd_report,
            "plugins": cmd_plugins, "sites": cmd_sites, "doctor": cmd_doctor}


def _is_secondary_task() -> bool:
    """In a job every task checks the same flags; only the first one reports a mistake."""
    import os

    rank = os.environ.get("RANK") or (os.environ.get("SLURM_PROCID")
                                      if "SLURM_STEP_ID" in os.environ else None)
    return rank not in (None, "0")


def _check_decodable(args: list[str]) -> None:
    """Bytes that are not UTF-8 reach argv as lone surrogates (PEP 383); they could be
    neither printed nor written into a script, so they stop here."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:
                shown = repr(arg.encode("utf-8", "surrogateescape"))  # the bytes as typed
            except UnicodeEncodeError:  # a surrogate no byte decodes to (a caller's str)
                shown = ascii(arg)
            raise UsageError(f"argument {shown} is not valid UTF-8; ddl takes UTF-8 text "
                             "(file names included)") from None


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = sys.argv[1:] if argv is None else argv
    try:
        _check_decodable(args)
        ns = parser.parse_args(args or ["--help"])
        if ns.command is None:
            parser.print_help()
            return 0
        return COMMANDS[ns.command](ns)
    except DdlError as exc:
        if not (isinstance(exc, UsageError) and _is_secondary_task()):
            print(f"ddl: error: {as_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`ddl sites | head -1`): not an error worth a traceback.
        # Point stdout at devnull so the interpreter's final flush cannot fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
