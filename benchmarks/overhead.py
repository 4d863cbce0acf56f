"""ddl's overhead: the same training under ddl, a plain hand-written DDP loop and an HF
Accelerate loop, side by side in one invocation.

Same workload and preset (the plugin's model, data, loss, optimizer and batch), same
number of processes (gloo, one thread each) and steps. Every run trains ``--epochs`` epochs
of ``--steps`` steps; its time per step is that of its median epoch after the first (the
first carries one-off costs; ddl's rule), so one slow moment of the machine does not
decide a run. The
three loops run alternately, ``--rounds`` times, so a busy moment of the shared machine hits
them alike; the ratios are of the medians of the per-step times:

    ddl/plain       target <= 1.02 (issue 23; the exit code says whether each workload met it)
    ddl/plain CPU   the same ratio of CPU time per step (rank 0's process, all threads;
                    ``time.process_time``): the work each loop does, steadier than wall time
                    when other jobs share the machine (reported, not held to the target)
    ddl/accelerate  reported
    data wait       ddl's share of its timed epoch spent waiting for the loader (results.json
                    data_wait_s / time_s, median over the rounds): target < 5 % for the
                    image workloads (mnist, cifar), reported for the others

    .venv/bin/python benchmarks/overhead.py                      # mnist, cifar, xsum; tiny
    .venv/bin/python benchmarks/overhead.py --workloads mnist --rounds 3 --steps 20

The reference loops are in benchmarks/reference/. ddl's timed epoch also computes the
per-sample training metrics and steps the LR scheduler, which the plain loop does not:
that is part of what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from data_flags import add_data_dir_flag, given_data_dirs  # noqa: E402
from machine import describe  # noqa: E402

RESULTS = HERE / "results" / "overhead.json"
TARGET = 1.02
DATA_WAIT_TARGET = 0.05
DATA_WAIT_HELD = ("mnist", "cifar")  # the data path issue 23 holds to it
PY = sys.executable
DDL = str(Path(PY).with_name("ddl"))


def _torchrun(script: str, nproc: int) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(HERE / "reference" / script)]


def run_once(kind: str, plugin: str, preset: str, data_dir: Path, steps: int, epochs: int,
             nproc: int, work: Path) -> tuple[float, float, dict[str, float] | None]:
    """One training of ``kind``: the wall and CPU time per step of its median epoch after
    the first, and (ddl only) from its timed epochs' records, medians of: the share spent waiting
    for data, and the step breakdown's ddl's own host time per step (``ddl_s``: metrics,
    progress, the step guard; docs/measuring.md) and its share of the step."""
    out = work / f"{kind}-{plugin}-{len(list(work.iterdir()))}"
    common = ["--plugin", plugin, "--preset", preset, "--data-dir", str(data_dir)]
    if kind == "ddl":
        command = [DDL, "train", *common, f"--nproc={nproc}", f"--epochs={epochs}",
                   f"--steps-per-epoch={steps}", "--keep-checkpoints=0", "--workers=0",
                   f"--log-every={10 ** 6}", f"--run-dir={out}"]
    else:
        script = "plain_ddp.py" if kind == "plain" else "accelerate_loop.py"
        command = [*_torchrun(script, nproc), *common, f"--steps={steps}", f"--epochs={epochs}",
                   f"--out={out}.json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(HERE / "reference") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} ({plugin}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    if kind == "ddl":
        results = json.loads((out / "results.json").read_text())
        timed = results["epochs"][1:] or results["epochs"]
        per_step = [e["step_breakdown"]["per_step"] for e in timed]
        return (statistics.median(e["time_s"] for e in timed) / results["steps_per_epoch"],
                statistics.median(e["cpu_time_s"] for e in timed) / results["steps_per_epoch"],
                {"data_wait_share": statistics.median(e["data_wait_s"] / e["time_s"]
                                                      for e in timed),
                 "ddl_host_s": statistics.median(p["ddl_s"] for p in per_step),
                 "ddl_share": statistics.median(p["ddl_s"] / p["step_s"] for p in per_step)})
    reported = json.loads(Path(f"{out}.json").read_text())
    if kind == "accelerate" and (reported["num_processes"] != nproc
                                 or reported["wrapper"] != "DistributedDataParallel"):
        raise SystemExit(f"the Accelerate loop did not run data-parallel: {reported}")
    return reported["step_time_s"], reported["cpu_step_time_s"], None


def prepare(plugin: str, data_root: Path) -> Path:
    data_dir = data_root / plugin
    subprocess.run([DDL, "prepare", "--plugin", plugin, "--synthetic", "--data-dir",
                    str(data_dir)], check=True, capture_output=True)
    return data_dir


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mnist,cifar,xsum",
                        help="plugins, tiny preset each")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=6,
                        help="epochs per run; the median of those after the first is timed")
    parser.add_argument("--nproc", type=int, default=2)
    add_data_dir_flag(parser)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    given = given_data_dirs(parser, args.data_dir)
    kinds = ("ddl", "plain", "accelerate")
    report = {"benchmark": "overhead", "preset": args.preset, "rounds": args.rounds,
              "steps_per_epoch": args.steps, "epochs": args.epochs, "nproc": args.nproc,
              "target_ddl_over_plain": TARGET, "target_data_wait_share": DATA_WAIT_TARGET, "workloads": {},
              "machine": describe()}
    met = True
    with tempfile.TemporaryDirectory(prefix="ddl-overhead-") as tmp:
        work = Path(tmp)
        for plugin in args.workloads.split(","):
            data_dir = given.get(plugin) or prepare(plugin, work / "data")
            runs = work / plugin
            runs.mkdir()
            times: dict[str, list[float]] = {k: [] for k in kinds}
            cpu: dict[str, list[float]] = {k: [] for k in kinds}
            ddl_numbers: list[dict[str, float]] = []
            for r in range(args.rounds):
                order = kinds[r % 3:] + kinds[:r % 3]  # rotate who goes first
                for kind in order:
                    step, cpu_step, numbers = run_once(kind, plugin, args.preset, data_dir,
                                                       args.steps, args.epochs, args.nproc, runs)
                    times[kind].append(step)
                    cpu[kind].append(cpu_step)
                    if numbers is not None:
                        ddl_numbers.append(numbers)
                print(f"{plugin} round {r + 1}: " + ", ".join(
                    f"{k} {times[k][-1] * 1e3:.1f} ms/step" for k in kinds), flush=True)
            median = {k: statistics.median(v) for k, v in times.items()}
            median_cpu = {k: statistics.median(v) for k, v in cpu.items()}
            row = {"step_time_s": times, "median_step_time_s": median,
                   "ddl_over_plain": median["ddl"] / median["plain"],
                   "cpu_step_time_s": cpu, "median_cpu_step_time_s": median_cpu,
                   "ddl_over_plain_cpu": median_cpu["ddl"] / median_cpu["plain"],
                   "ddl_over_plain_cpu_per_round": [d / p for d, p in zip(cpu["ddl"],
                                                                          cpu["plain"])],
                   "ddl_over_accelerate": median["ddl"] / median["accelerate"],
                   # the same ratio round by round: how far this shared machine's noise
                   # reaches (a verdict within that spread is not a measurement)
                   "ddl_over_plain_per_round": [d / p for d, p in zip(times["ddl"],
                                                                      times["plain"])],
                   "data_wait_share": [n["data_wait_share"] for n in ddl_numbers],
                   "median_data_wait_share": statistics.median(
                       n["data_wait_share"] for n in ddl_numbers),
                   # ddl's own host time per step (its step breakdown), per round
                   "ddl_host_s": [n["ddl_host_s"] for n in ddl_numbers],
                   "median_ddl_host_s": statistics.median(n["ddl_host_s"] for n in ddl_numbers),
                   "median_ddl_share": statistics.median(n["ddl_share"] for n in ddl_numbers)}
            row["met"] = row["ddl_over_plain"] <= TARGET and (
                plugin not in DATA_WAIT_HELD or row["median_data_wait_share"] < DATA_WAIT_TARGET)
            met &= row["met"]
            report["workloads"][plugin] = row
            ratio_met = row["ddl_over_plain"] <= TARGET
            wait_met = row["median_data_wait_share"] < DATA_WAIT_TARGET
            print(f"{plugin}: ddl/plain {row['ddl_over_plain']:.3f} (target <= {TARGET}: "
                  f"{'met' if ratio_met else 'MISSED'}; per round "
                  f"{min(row['ddl_over_plain_per_round']):.2f}-"
                  f"{max(row['ddl_over_plain_per_round']):.2f}), in CPU time "
                  f"{row['ddl_over_plain_cpu']:.3f}, ddl/accelerate "
                  f"{row['ddl_over_accelerate']:.3f}, ddl's own host time "
                  f"{row['median_ddl_host_s'] * 1e6:.0f} us a step "
                  f"({row['median_ddl_share']:.1%}), data wait "
                  f"{row['median_data_wait_share']:.1%}"
                  + (f" (target < {DATA_WAIT_TARGET:.0%}: {'met' if wait_met else 'MISSED'})"
                     if plugin in DATA_WAIT_HELD else ""),
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
