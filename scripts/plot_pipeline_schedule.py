#!/usr/bin/env python3
"""Draw the GPipe pipeline schedule and its bubble, next to measured bubbles (docs figure).

The timeline is the theory: p stages, m microbatches, every stage taking f for a forward
and b = 2f for a backward (the ratio changes the picture, not the fraction: the idle share
of each stage is (p-1)/(m+p-1) for any f and b). The bars beside it are read from real
runs: a `ddl train --strategy pp` results.json (its `strategy_report`), or the committed
record of such runs, `benchmarks/results/pp_bubble-mnist-tiny.json` (its first run: the docs
quote that file, so the figure and the pages agree), and, optionally,
`benchmarks/results/pp_bubble-accelerator.json` (the run with the same schedule, p and m).

    python scripts/plot_pipeline_schedule.py --run benchmarks/results/pp_bubble-mnist-tiny.json \
        [--benchmark benchmarks/results/pp_bubble-accelerator.json] [--output docs/img/pipeline-gpipe.png]

matplotlib only; no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FORWARD, BACKWARD = 1.0, 2.0  # time units; only the picture depends on the ratio


def gpipe_blocks(stages: int, microbatches: int):
    """(stage, start, duration, kind, microbatch) for GPipe: all forwards, then all backwards."""
    blocks = []
    forwards_done = (microbatches + stages - 1) * FORWARD
    for s in range(stages):
        for i in range(microbatches):
            blocks.append((s, (i + s) * FORWARD, FORWARD, "F", i))
            # the last stage starts backward first; stage s waits (p-1-s) backwards for it
            start = forwards_done + (i + stages - 1 - s) * BACKWARD
            blocks.append((s, start, BACKWARD, "B", i))
    return blocks


def theory(stages: int, microbatches: int) -> float:
    return (stages - 1) / (microbatches + stages - 1)


def run_bubble(path: Path) -> dict:
    data = json.loads(path.read_text())
    if data.get("runs"):  # the committed record of several runs: the figure draws the first
        data = data["runs"][0]
    report = data.get("strategy_report") or {}
    if "bubble_measured_per_rank" not in report:
        sys.exit(f"{path}: no pipeline strategy_report (was it a --strategy pp run?)")
    return report


def benchmark_bubble(path: Path, schedule: str, stages: int, microbatches: int) -> dict:
    for run in json.loads(path.read_text())["runs"]:
        if (run["schedule"], run["stages"], run["microbatches"]) == (schedule, stages, microbatches):
            return run
    sys.exit(f"{path}: no {schedule} run with {stages} stages and {microbatches} microbatches")


def plot(report: dict, bench: dict | None, run_label: str, output: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, m = report["stages"], report["microbatches"]
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(11, 3.2), width_ratios=[2.3, 1])
    colours = {"F": "#4c8bd6", "B": "#e39a3b"}
    for s, start, width, kind, i in gpipe_blocks(p, m):
        ax.barh(s, width, left=start, color=colours[kind], edgecolor="black", height=0.8)
        ax.text(start + width / 2, s, f"{kind}{i}", ha="center", va="center", fontsize=9)
    end = (m + p - 1) * (FORWARD + BACKWARD)
    for s in range(p):  # hatch the idle time: the bubble
        busy = sorted((b[1], b[1] + b[2]) for b in gpipe_blocks(p, m) if b[0] == s)
        t = 0.0
        for start, stop in busy + [(end, end)]:
            if start > t:
                ax.barh(s, start - t, left=t, color="white", hatch="//", edgecolor="grey",
                        height=0.8)
            t = max(t, stop)
    ax.set_yticks(range(p), [f"stage {s} (rank {s})" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("time (forward = 1, backward = 2 units)")
    ax.set_title(f"GPipe, p={p} stages, m={m} microbatches: idle (hatched) = "
                 f"(p-1)/(m+p-1) = {theory(p, m):.2f}", fontsize=10)

    labels, values = ["theory"], [theory(p, m)]
    for r, value in enumerate(report["bubble_measured_per_rank"]):
        labels.append(f"{run_label}\nrank {r}")
        values.append(value)
    if bench:
        for r, value in enumerate(bench["bubble_measured_per_rank"]):
            labels.append(f"benchmark\nrank {r}")
            values.append(value)
    bars.bar(range(len(values)), values,
             color=["#888888"] + ["#c0504d"] * len(report["bubble_measured_per_rank"])
             + ["#4f9a57"] * (len(values) - 1 - len(report["bubble_measured_per_rank"])))
    for x, v in enumerate(values):
        bars.text(x, v + 0.02, f"{v:.2f}", ha="center", fontsize=8)
    bars.set_xticks(range(len(values)), labels, fontsize=7, rotation=35, ha="right")
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("idle fraction of a step")
    bars.set_title("measured here (2-core CPU, gloo)", fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    print(output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="results.json of a pp run, or benchmarks/results/pp_bubble-mnist-tiny.json")
    parser.add_argument("--run-label", default="MNIST tiny", help="name of the run in the bars")
    parser.add_argument("--benchmark", type=Path, help="benchmarks/results/pp_bubble-accelerator.json")
    parser.add_argument("--output", type=Path, default=Path("docs/img/pipeline-gpipe.png"))
    args = parser.parse_args(argv)
    report = run_bubble(args.run)
    if report.get("schedule") != "gpipe" or report.get("stages_per_rank", 1) != 1:
        sys.exit(f"{args.run}: the figure draws GPipe with one stage per rank; "
                 f"this run used {report.get('schedule')} with {report.get('stages_per_rank')}")
    bench = None
    if args.benchmark:
        bench = benchmark_bubble(args.benchmark, "gpipe", report["stages"], report["microbatches"])
    plot(report, bench, args.run_label, args.output)


if __name__ == "__main__":
    main()
