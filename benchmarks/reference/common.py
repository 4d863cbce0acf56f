"""What the reference loops share with ddl: the plugin's model, data, loss and optimizer
(same workload and preset), and how a loop reports its timing to benchmarks/overhead.py."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--plugin", default="mnist")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=2, help="epochs; all but the first are timed")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def workload(plugin: str, preset: str):
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload(plugin)
    return spec.create(spec.presets[preset]), spec.presets[preset]


def report(out: Path, epoch_times: list[float], steps: int, epoch_cpu: list[float],
           **extra) -> None:
    """The per-step time is that of the median epoch after the first (one-off costs); the
    per-step CPU time (rank 0's process, all threads: ``time.process_time``) likewise."""
    timed = statistics.median(epoch_times[1:] or epoch_times)
    cpu = statistics.median(epoch_cpu[1:] or epoch_cpu)
    out.write_text(json.dumps({"epoch_time_s": epoch_times, "epoch_cpu_s": epoch_cpu,
                               "steps_per_epoch": steps, "step_time_s": timed / steps,
                               "cpu_step_time_s": cpu / steps, **extra}) + "\n")
