"""CLI start-up: median wall time of `ddl --help` and `ddl submit --dry-run`, and the time
from `ddl train` to its first training step.

Both must answer without importing torch (tests/unit/test_no_torch.py); this measures what
a user waits for. Each command runs ``--repeats`` times as a fresh process, alternating
between the commands so a busy moment of the machine hits both alike. The target is a
median of at most 0.5 s each; the exit code says whether it was met. Time to first step
(MNIST tiny, 1 process, the first progress line of step 1) is reported, with no target.

    .venv/bin/python benchmarks/cli_startup.py               # 11 runs each
    .venv/bin/python benchmarks/cli_startup.py --repeats 21 --out /tmp/startup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cli_startup.json"
TARGET_S = 0.5
DDL = str(Path(sys.executable).with_name("ddl"))
COMMANDS = {
    "ddl --help": [DDL, "--help"],
    "ddl submit --dry-run": [DDL, "submit", "--site", "juwels-booster", "--nodes", "2",
                             "--account", "proj", "--plugin", "mnist", "--dry-run"],
}


def wall_time(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def first_step_time(run_dir: Path, data_dir: Path | None = None) -> float:
    """Seconds from starting `ddl train` to its progress line for step 1 (on ``data_dir``'s
    MNIST, else the default data directory's). The evaluation after the timed step is cut
    to 16 samples: it is not timed, only waited for."""
    command = [DDL, "train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1",
               "--epochs", "1", "--steps-per-epoch", "2", "--log-every", "1",
               "--keep-checkpoints", "0", "--eval-samples", "16", "--run-dir", str(run_dir)]
    if data_dir is not None:
        command += ["--data-dir", str(data_dir)]
    t0 = time.perf_counter()
    seen = None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            if seen is None and "epoch 1 step 1/" in line:
                seen = time.perf_counter() - t0
    if proc.returncode != 0 or seen is None:
        raise SystemExit(f"{' '.join(command)} failed or printed no step line")
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--first-step-repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, help="MNIST for the first-step runs "
                        "(default: ddl's default data directory)")
    args = parser.parse_args()
    for command in COMMANDS.values():  # once each first: the page cache, .pyc files
        wall_time(command)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command))
    rows = {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                   "runs_s": t, "target_s": TARGET_S, "met": statistics.median(t) <= TARGET_S}
            for name, t in times.items()}
    with tempfile.TemporaryDirectory(prefix="ddl-first-step-") as tmp:
        first = [first_step_time(Path(tmp) / f"run{i}", args.data_dir) for i in range(args.first_step_repeats)]
    result = {"benchmark": "cli_startup", "repeats": args.repeats, "commands": rows,
              "time_to_first_step": {"command": "ddl train --plugin mnist --preset tiny "
                                                 "--nproc 1", "runs_s": first,
                                     "median_s": statistics.median(first)},
              "machine": describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:<24} median {row['median_s']:.3f} s (min {row['min_s']:.3f}, max "
              f"{row['max_s']:.3f}) target <= {TARGET_S} s: {'met' if row['met'] else 'MISSED'}")
    print(f"time to first training step (mnist tiny, 1 process): median "
          f"{statistics.median(first):.2f} s")
    print(f"results: {args.out}")
    return 0 if all(r["met"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
