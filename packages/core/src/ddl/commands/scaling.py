"""``ddl scale``: one training run per point of a scaling study, then the report.

Local (``--nprocs 1,2,4``): each point is a real ``ddl train`` in a subprocess of this
same installation, its run directory ``<output>/n<N>``; the report (ddl.commands.report) follows.
Slurm (``--site S --nodes 1,2,4``): each point is submitted as its own job through
``ddl submit`` with run directory ``<output>/nodes<N>``; ``ddl report <output>`` renders
the study once the jobs have finished.

Weak scaling keeps the batch per replica (the global batch grows with the devices);
strong scaling keeps the global batch (each replica's share shrinks). Without a batch
flag, weak uses the preset's batch per replica and strong uses the preset's batch times
the smallest point's replicas, so the smallest point trains exactly the preset's batch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddl.commands.flags import train_arguments
from ddl.contract.errors import DdlError, UsageError

# scale's own flags, not forwarded to the runs
OWN = ("command", "nprocs", "nodes", "scaling", "output", "peak_flops", "account",
       "partition", "time", "dry_run", "nproc", "run_dir", "batch_size", "global_batch_size")


def check_mode(flags: dict[str, Any]) -> None:
    """Local points or Slurm points, and the Slurm-only flags only with the latter."""
    if ("nprocs" in flags) == ("nodes" in flags):
        raise UsageError("scale: give exactly one of --nprocs (local runs) or --nodes "
                         "(Slurm jobs, with --site)")
    if "nprocs" in flags:
        given = [f"--{k.replace('_', '-')}" for k in ("account", "partition", "time")
                 if k in flags] + (["--dry-run"] if flags.get("dry_run") else [])
        if given:
            raise UsageError(f"{given[0]}: only for Slurm points (--nodes); local points "
                             "(--nprocs) run here and now")


def parse_points(text: str, flag: str) -> list[int]:
    try:
        points = [int(part) for part in text.split(",")]
    except ValueError:
        points = []
    if not points or min(points) < 1 or len(set(points)) != len(points):
        raise UsageError(f"{flag}: {text!r} is not a list of distinct positive integers "
                         "(e.g. 1,2,4)")
    return sorted(points)


def parse_peak(text: str | None) -> float | None:
    """--peak-flops: a number of FLOP/s per device, or 'measure' (a one-thread fp32 matmul
    on this CPU, the peak of one local rank)."""
    if text is None:
        return None
    if text == "measure":
        from ddl.worker.mfu import measure_matmul_peak

        return measure_matmul_peak()
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"--peak-flops: {text!r} is not a positive number of FLOP/s per "
                         "device or 'measure'")
    return value


def batch_flag(flags: dict[str, Any], scaling: str, smallest_replicas: int) -> str:
    """The batch flag every point gets, so the chosen rule holds across points."""
    if scaling == "weak":
        if "global_batch_size" in flags:
            raise UsageError("--global-batch-size: weak scaling keeps the batch per replica; "
                             "give --batch-size, or use --scaling strong")
        if "batch_size" in flags:
            return f"--batch-size={flags['batch_size']}"
        return f"--batch-size={_preset_batch(flags)}"
    if "batch_size" in flags:
        raise UsageError("--batch-size: strong scaling keeps the global batch; give "
                         "--global-batch-size, or use --scaling weak")
    if "global_batch_size" in flags:
        return f"--global-batch-size={flags['global_batch_size']}"
    return f"--global-batch-size={_preset_batch(flags) * smallest_replicas}"


def _preset_batch(flags: dict[str, Any]) -> int:
    from ddl.contract.plugins import Plugins
    from ddl.settings import config as cfg

    plugins = Plugins()
    file_values = cfg.load_config_file(flags["config"]) if "config" in flags else {}
    train = {k: v for k, v in flags.items() if k not in (*OWN, "config")}
    if "strategy_options" in train:
        train["strategy_options"] = dict(train["strategy_options"])
    config = cfg.build(train, file_values, plugins).config
    return cfg.resolve_preset(config, plugins.workload(config.plugin))[1].batch_size


def output_dir(given: Path | None, flags: dict[str, Any]) -> Path:
    if given is None:
        name = (f"scale-{flags.get('plugin', 'mnist')}-{flags.get('strategy', 'ddp')}-"
                f"{time.strftime('%Y%m%d-%H%M%S')}")
        given = Path("runs") / name
    if (given / "scale.json").exists() or any(given.glob("n*/config.json")):
        raise UsageError(f"--output: {given} already holds a scaling study; choose a new "
                         "directory")
    return given


def run_local(points: list[int], train_args: list[str], out: Path) -> list[Path]:
    """One real `ddl train` per point, one after the other (they share the machine)."""
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = []
    for n in points:
        run_dir = out / f"n{n}"
        command = [sys.executable, "-m", "ddl.commands.cli", "train", *train_args, f"--nproc={n}",
                   f"--run-dir={run_dir}"]
        print(f"ddl scale: {n} process(es): {' '.join(command[3:])}", flush=True)
        code = subprocess.call(command)
        if code != 0:
            raise DdlError(f"the run with {n} process(es) failed (exit code {code}); its "
                           f"output is above, its directory {run_dir}")
        run_dirs.append(run_dir)
    return run_dirs


def submit_slurm(points: list[int], train_args: list[str], out: Path,
                 submit_args: list[str]) -> int:
    """One `ddl submit` per point (in this process: same parser, same checks)."""
    from ddl.commands.cli import main

    for n in points:
        code = main(["submit", *train_args, *submit_args, f"--nodes={n}",
                     f"--run-dir={(out / f'nodes{n}').resolve()}",
                     f"--output-dir={out.resolve()}"])
        if code != 0:
            return code
    return 0


def cmd_scale(ns: argparse.Namespace) -> int:
    from ddl.commands import report
    
    flags = {k: v for k, v in vars(ns).items() if v is not None}
    check_mode(flags)
    points = parse_points(ns.nprocs or ns.nodes, "--nprocs" if ns.nprocs else "--nodes")
    peak = parse_peak(ns.peak_flops)
    out = output_dir(ns.output, flags)
    train_args = [*train_arguments(flags, leave_out=OWN),
                  batch_flag(flags, ns.scaling, points[0] if ns.nprocs else 1)]
    if ns.nodes:
        submit_args = [f"--{k.replace('_', '-')}={flags[k]}" for k in
                       ("account", "partition", "time") if k in flags]
        code = submit_slurm(points, train_args, out,
                                    submit_args + (["--dry-run"] if ns.dry_run else []))
        if code == 0 and not ns.dry_run:
            print(f"ddl scale: when the jobs have finished: ddl report {out}")
        return code
    runs = run_local(points, train_args, out)
    built = report.build(runs, peak)
    print(report.format_table(built))
    for path in report.write(built, out):
        print(f"  {path}")
    return 0
