"""How long a checkpoint holds the training loop up, with and without --async-checkpoint.

The same run (workload, preset, processes, steps, a checkpoint every ``--every`` steps) is
trained alternately synchronously and asynchronously, ``--rounds`` times; each run's
results.json says per save how long the loop was blocked (``checkpoints.stall``: the wait
for the previous write, the staging copy, the RNG files; for a synchronous save the whole
write, hashing and commit) and how long the end of training waited for the last write.
Printed as a Markdown table (the medians over the rounds), the form docs/checkpoints.md
quotes.

    .venv/bin/python benchmarks/checkpoint_stall.py                        # cifar, 1 process
    .venv/bin/python benchmarks/checkpoint_stall.py --plugin mnist --preset tiny --nproc 2
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
DDL = str(Path(sys.executable).with_name("ddl"))


def _train(args, data: Path, run_dir: Path, asynchronous: bool) -> dict:
    cmd = [DDL, "train", "--plugin", args.plugin, "--preset", args.preset, "--nproc",
           str(args.nproc), "--global-batch-size", str(args.batch), "--epochs", "1",
           "--steps-per-epoch", str(args.steps), "--checkpoint-every", str(args.every),
           "--data-dir", str(data), "--run-dir", str(run_dir),
           "--async-checkpoint" if asynchronous else "--no-async-checkpoint"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    results = json.loads((run_dir / "results.json").read_text())
    size = sum(f.stat().st_size for f in (run_dir / "checkpoints").glob("step-*/*"))
    return {**results["checkpoints"]["stall"], "step_s": results["epochs"][0]["time_s"]
            / args.steps, "bytes": size / len(list((run_dir / "checkpoints").glob("step-*")))}


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", default="cifar")
    parser.add_argument("--preset", default="course")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([DDL, "prepare", "--plugin", args.plugin, "--synthetic",
                        "--data-dir", str(data)], check=True, stdout=subprocess.DEVNULL)
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for r in range(args.rounds):
            for asynchronous in (False, True):
                run_dir = Path(tmp) / f"run-{r}-{int(asynchronous)}"
                runs[asynchronous].append(_train(args, data, run_dir, asynchronous))
    print(f"{args.plugin} ({args.preset}), {args.nproc} process(es), {args.steps} steps, a "
          f"checkpoint every {args.every}; medians of {args.rounds} round(s)\n")
    print("| saves | checkpoint | step | stall per save (mean / max) | end wait |")
    print("| --- | --- | --- | --- | --- |")
    for asynchronous, found in runs.items():
        med = {k: statistics.median(run[k] for run in found)
               for k in ("mean_s", "max_s", "end_wait_s", "step_s", "bytes")}
        print(f"| {'async' if asynchronous else 'sync'} | {med['bytes'] / 1e6:.0f} MB | "
              f"{med['step_s']:.2f} s | {med['mean_s']:.3f} / {med['max_s']:.3f} s | "
              f"{med['end_wait_s']:.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
