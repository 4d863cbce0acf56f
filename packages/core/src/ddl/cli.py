"""The ``ddl`` command line.

Kept free of torch imports at module level: ``ddl --help``, ``ddl plugins`` and ``ddl sites``
answer in well under a second. Every error a user can cause ends as one line on stderr and
exit code 2 (see ddl.errors).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddl import __version__
from ddl.errors import DdlError, UsageError

DESCRIPTION = """\
ddl trains deep-learning models on many processes, GPUs and nodes with the same command
on a laptop, a CI machine or a supercomputer. Without arguments, `ddl train` trains the
MNIST CNN with DDP on 2 local CPU processes (generating synthetic MNIST on first use)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage plus the error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _train_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS  # only flags actually given override the config file and site
    p.add_argument("--config", type=Path, default=S, help="TOML file of run settings")
    p.add_argument("--plugin", default=S, help="workload plugin (default: mnist)")
    p.add_argument("--strategy", default=S, help="parallelism strategy (default: ddp)")
    p.add_argument("--site", default=S, help="site profile (default: local)")
    p.add_argument("--preset", default=S, help="workload size preset (default: the course's)")
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
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=S,
                   help="default: auto (the site's accelerator)")


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

    sub.add_parser("plugins", help="list installed workloads and strategies")
    sub.add_parser("sites", help="list known site profiles")
    return parser


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(ns).items() if k not in ("command", "config", "synthetic")}


def cmd_train(ns: argparse.Namespace) -> int:
    from ddl import config as cfg
    from ddl import rundir
    from ddl.plugins import Plugins

    plugins = Plugins()
    file_values = cfg.load_config_file(ns.config) if "config" in ns else {}
    config, default_data_dir = cfg.build(_flags(ns), file_values, plugins)
    nproc = config.nproc or 1
    _preflight(config, plugins, nproc, default_data_dir)

    run_dir = config.run_dir or rundir.default_run_dir(Path("runs"), config.plugin,
                                                       config.strategy)
    rundir.create(run_dir)
    config = config.model_copy(update={"run_dir": run_dir.resolve(), "nproc": nproc,
                                       "data_dir": Path(config.data_dir).resolve()})
    rundir.write_json(run_dir / rundir.CONFIG, config.model_dump(mode="json"))

    from ddl.launch import launch_local
    return launch_local(run_dir, nproc)


def _preflight(config, plugins, nproc: int, default_data_dir: bool) -> None:
    """Everything that can be checked before workers start, so mistakes cost seconds and
    give one line instead of N ranks' worth of errors."""
    import torch

    from ddl.distributed import World
    from ddl.errors import DataMissing
    from ddl.sites import get_site
    from ddl.trainer import build

    site = get_site(config.site, plugins)
    stand_in = World(rank=0, local_rank=0, size=nproc, device=torch.device("cpu"),
                     backend=site.backend)
    workload, _, _ = build(config, stand_in, plugins)
    data_dir = Path(config.data_dir)
    if not default_data_dir and not data_dir.is_dir():
        raise UsageError(f"--data-dir: {data_dir} does not exist; give an existing "
                         f"directory or run `ddl prepare --plugin {config.plugin} --data-dir "
                         f"{data_dir}` on a login node")
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
    from ddl import config as cfg
    from ddl.plugins import Plugins

    plugins = Plugins()
    config, _ = cfg.build(_flags(ns), {}, plugins)
    spec = plugins.workload(config.plugin)
    workload = spec.create(spec.presets[spec.default_preset])
    data_dir = Path(config.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise UsageError(f"--data-dir: {data_dir} exists and is not a directory")
    where = workload.prepare(data_dir, synthetic=ns.synthetic)
    kind = "synthetic" if ns.synthetic else "official"
    print(f"ddl: {config.plugin} data ({kind}) ready in {where}")
    return 0


def cmd_plugins(ns: argparse.Namespace) -> int:
    from ddl.plugins import Plugins

    plugins = Plugins()
    workloads, strategies = plugins.workloads(), plugins.strategies()
    print("Workloads (--plugin):")
    for spec in workloads.values():
        presets = ", ".join(p + (" (default)" if p == spec.default_preset else "")
                            for p in spec.presets)
        print(f"  {spec.name:<12} {spec.summary}")
        print(f"  {'':<12} presets: {presets}; from {plugins.version_of(spec.plugin) or spec.plugin}")
    print("Strategies (--strategy):")
    for spec in strategies.values():
        print(f"  {spec.name:<12} {spec.summary}; from "
              f"{plugins.version_of(spec.plugin) or spec.plugin}")
    if workloads and strategies:
        print("Support (workload x strategy):")
        names = list(strategies)
        print("  " + " " * 12 + " ".join(f"{n:<6}" for n in names))
        for w in workloads.values():
            cells = " ".join(f"{'yes' if strategies[n].supports(w) else '-':<6}" for n in names)
            print(f"  {w.name:<12} {cells}")
    for info in plugins.broken:
        print(f"BROKEN plugin {info.name!r} ({info.source}): {info.error}")
    return 0


def cmd_sites(ns: argparse.Namespace) -> int:
    from ddl.plugins import Plugins
    from ddl.sites import known_sites, load_profile

    for name, path in known_sites(Plugins()).items():
        try:
            description = load_profile(path).description
        except UsageError as exc:
            description = f"INVALID: {exc}"
        print(f"  {name:<16} {description}  [{path}]")
    return 0


COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "plugins": cmd_plugins,
            "sites": cmd_sites}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = sys.argv[1:] if argv is None else argv
    try:
        ns = parser.parse_args(args or ["--help"])
        if ns.command is None:
            parser.print_help()
            return 0
        return COMMANDS[ns.command](ns)
    except DdlError as exc:
        print(f"ddl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
