"""Repeated runs of one scaling point (``ddl scale --rounds``) made into one point: the
median and the spread.

Why repeat: on a shared machine one run's throughput says as much about the other work on
the machine at that moment as about the training. ``ddl scale`` runs its points in
alternating rounds (1, 2, 1, 2, ...), so a burst of other load hits every point about
equally instead of one point entirely, and the median of each point's runs is what the
speedup is computed from.

A point's ``samples_per_s`` and ``epoch_time_s`` are the medians over its runs; its other
numbers (memory, data wait, utilisation, threads) are those of its median run by samples/s
(the slower of the middle two for an even count), and MFU follows the median samples/s.
``spread`` = (max - min) / median of samples/s: a few percent is a quiet machine, tens of
percent means other work took cores during some rounds. Runs are repeats of one point when
they have the same devices and batch (per replica and global).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from ddl.worker import mfu


def merge(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per (devices, batch) from one point per run, runs kept in the given order."""
    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for p in points:
        key = (p["devices"], p["batch_per_replica"], p["batch_global"])
        groups.setdefault(key, []).append(p)
    return [_one_point(runs) for runs in groups.values()]


def _one_point(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [p["samples_per_s"] for p in runs]
    times = [p["epoch_time_s"] for p in runs]
    middle = sorted(runs, key=lambda p: p["samples_per_s"])[(len(runs) - 1) // 2]
    rate = median(rates)
    point = dict(middle)
    point.update(
        samples_per_s=rate, epoch_time_s=median(times), rounds=len(runs),
        run_dirs=[p["run_dir"] for p in runs], samples_per_s_runs=rates,
        samples_per_s_min=min(rates), samples_per_s_max=max(rates),
        epoch_time_s_min=min(times), epoch_time_s_max=max(times),
        spread=(max(rates) - min(rates)) / rate,
        mfu=mfu.mfu(middle["flops_per_sample"], rate, middle["devices"],
                    middle["peak_flops_per_device"]))
    return point
