"""``ddl scale``: one training run per point of a scaling study, then the report.

Local (``--nprocs 1,2,4``): each point is a real ``ddl train`` in a subprocess of this
same installation, run ``--rounds`` times in alternating rounds (1, 2, 4, 1, 2, 4, ...) into
``<output>/n<N>-r<round>``; the report (ddl.commands.report) follows, each point the median
of its rounds with their spread (ddl.commands.report_rounds).
Slurm (``--site S --nodes 1,2,4``): each point is submitted as its own job through
``ddl submit`` with run directory ``<output>/nodes<N>``; ``ddl report <output>`` renders
the study once the jobs have finished.

Weak scaling keeps the batch per replica (the global batch grows with the devices);
strong scaling keeps the global batch (each replica's share shrinks). Without a batch
flag, weak uses the preset's batch per replica and strong uses the preset's batch times
the smallest point's replicas, so the smallest point trains exactly the preset's batch.

Threads per rank are the same at every local point: the user's ``OMP_NUM_THREADS``, else 1.
ddl's usual rule (usable cores / local ranks, ddl.settings.cores) would give a 1-process
point all the cores, so its speedup would compare threads as well as processes; and a
rank of 2 threads collapses when other work takes one core (every operation waits for its
slower thread). On this 2-core machine with other work running, ``--nprocs 1,2`` under
that rule printed speedups of 3.8 and 14.7 (issue 38); with one thread per rank a busy
core slows the larger point, never only the baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddl.commands.flags import train_arguments
from ddl.commands.run_results import parse_peak
from ddl.contract.errors import DdlError, UsageError
from ddl.settings import cores

DEFAULT_ROUNDS = 3  # the median of 3 survives one round slowed by other work

# scale's own flags, not forwarded to the runs
OWN = ("command", "nprocs", "nodes", "scaling", "output", "peak_flops", "account",
       "partition", "time", "dry_run", "nproc", "run_dir", "batch_size", "global_batch_size",
       "rounds")


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
    elif "rounds" in flags:
        raise UsageError("--rounds: only for local points (--nprocs); each Slurm point "
                         "runs once, on nodes of its own")


def parse_rounds(value: int | None) -> int:
    if value is None:
        return DEFAULT_ROUNDS
    if value < 1:
        raise UsageError(f"--rounds: {value} is not a positive number of rounds (e.g. 3)")
    return value


def study_threads(points: list[int],
                  env: dict[str, str] = os.environ) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment that fixes every point's threads per rank, and the record of it for
    scale.json: the user's OMP_NUM_THREADS, else 1 (why: this module's docstring)."""
    given = env.get("OMP_NUM_THREADS", "").strip()
    if given and not (given.isdigit() and int(given) > 0):
        raise UsageError(f"OMP_NUM_THREADS: {given!r} is not a positive number of threads; "
                         "set one (every point then runs it per rank) or unset it (1 per rank)")
    per_rank = int(given) if given else 1
    fixed = {"OMP_NUM_THREADS": str(per_rank), cores.GIVEN: str(per_rank)}
    if given:
        source = f"OMP_NUM_THREADS={per_rank} (set by the user), at every point"
    else:
        fixed[cores.SET_BY] = "ddl scale, the same at every point"
        source = "1 per rank at every point (ddl scale's default; OMP_NUM_THREADS sets another)"
    record = {"per_rank": per_rank, "source": source}
    usable = len(os.sched_getaffinity(0))
    if per_rank * max(points) > usable:
        record["note"] = (f"{max(points)} ranks x {per_rank} threads exceed the {usable} "
                          "usable cores: the largest points share cores")
    return fixed, record


def parse_points(text: str, flag: str) -> list[int]:
    try:
        points = [int(part) for part in text.split(",")]
    except ValueError:  # '' included: an empty list is no study
        points = []
    if not points or min(points) < 1 or len(set(points)) != len(points):
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        raise UsageError(f"{flag}: {shown!r} is not a list of distinct positive integers "
                         "(e.g. 1,2,4)")
    from ddl.commands.flags import check_whole
    from ddl.launch.submit import MAX_NODES
    from ddl.settings.config import MAX_NPROC

    # each point's own bound (ddl train --nproc, ddl submit --nodes), before the first runs
    check_whole(flag, max(points), MAX_NPROC if flag == "--nprocs" else MAX_NODES)
    return sorted(points)


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


def run_local(points: list[int], rounds: int, train_args: list[str], out: Path,
              env: dict[str, str]) -> list[Path]:
    """Real `ddl train` runs, one at a time (they share the machine), in alternating rounds
    so that other work on the machine slows every point alike, not one of them."""
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = []
    for r in range(1, rounds + 1):
        for n in points:
            run_dir = out / f"n{n}-r{r}"
            command = [sys.executable, "-m", "ddl.commands.cli", "train", *train_args,
                       f"--nproc={n}", f"--run-dir={run_dir}"]
            print(f"ddl scale: round {r}/{rounds}, {n} process(es): {' '.join(command[3:])}",
                  flush=True)
            code = subprocess.call(command, env={**os.environ, **env})
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
    local = ns.nprocs is not None  # check_mode: exactly one of the two is given
    points = parse_points(ns.nprocs if local else ns.nodes, "--nprocs" if local else "--nodes")
    peak = parse_peak(ns.peak_flops)
    rounds = parse_rounds(ns.rounds)
    fixed, threads_record = study_threads(points) if ns.nprocs else ({}, {})
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
    runs = run_local(points, rounds, train_args, out, fixed)
    built = {**report.build(runs, peak), "rounds": rounds, "threads": threads_record}
    print(report.format_table(built))
    if "note" in threads_record:
        print(f"note: {threads_record['note']}")
    for path in report.write(built, out, study=True):
        print(f"  {path}")
    return 0
