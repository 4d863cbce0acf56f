"""How close are `ddl plan`'s memory predictions to what real runs measure? (issue 41)

Runs a fixed set of CPU layouts of MNIST tiny and xsum tiny on 1, 2 and 4 local processes
(DDP, FSDP, tensor and pipeline parallel where the workload has a plan / split points, one
with full activation checkpointing), each a real ``ddl train`` of 2 epochs x 3 steps
through ``ddl plan --verify``'s own code (ddl.commands.plan_verify.measure): the plan's
prediction for that layout (ddl.commands.plan.plan_layouts, the same rows `ddl plan` prints)
beside what the run's results.json records. Writes

- ``benchmarks/results/plan_accuracy-<date>.json``: per layout, predicted and measured
  model-state, activation and peak bytes of the fullest rank (and step times), with the
  machine and its load before and after;
- ``docs/img/plan-accuracy.svg``: predicted against measured, one panel per quantity, the
  y = x line and a +-15 % band (docs/plan.md embeds it).

    .venv/bin/python benchmarks/plan_accuracy.py            # ~5-8 min on 2 quiet cores
    .venv/bin/python benchmarks/plan_accuracy.py --figure-only \
        benchmarks/results/plan_accuracy-X.json   # redraw only

What is compared, and why some points sit off the line by design (docs/plan.md, "How
close"): activations are ddl's saved-tensor meter (the high-water mark of what a rank holds
for backward); xsum trims each batch to its longest sequence, and the plan predicts the
untrimmed batch, a bound (ddl.planning.plan_probe), so xsum's points without a pipeline
(hollow markers) sit below the line (a pipeline's batches are untrimmed); peak is each
process's peak resident set on a CPU, which holds Python, torch and the data besides the
training tensors the plan counts. One thread per rank (OMP_NUM_THREADS=1, as ``ddl
scale``), so step times compare processes, not threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/machine.py

# (workload, processes, mesh, activation checkpointing, label); global batch per workload
GLOBAL_BATCH = {"mnist": 64, "xsum": 16}
CASES = [
    ("mnist", 1, {}, "none", "1 process"),
    ("mnist", 2, {"dp_replicate": 2}, "none", "ddp"),
    ("mnist", 2, {"dp_shard": 2}, "none", "fsdp"),
    ("mnist", 2, {"dp_shard": 2}, "full", "fsdp+ckpt"),
    ("mnist", 2, {"pp": 2}, "none", "pp"),
    ("mnist", 4, {"dp_replicate": 4}, "none", "ddp"),
    ("mnist", 4, {"dp_shard": 4}, "none", "fsdp"),
    ("mnist", 4, {"pp": 2, "dp_shard": 2}, "none", "pp+fsdp"),
    ("xsum", 1, {}, "none", "1 process"),
    ("xsum", 2, {"dp_shard": 2}, "none", "fsdp"),
    ("xsum", 2, {"dp_shard": 2}, "full", "fsdp+ckpt"),
    ("xsum", 2, {"tp": 2}, "none", "tp"),
    ("xsum", 2, {"pp": 2}, "none", "pp"),
    ("xsum", 4, {"dp_shard": 4}, "none", "fsdp"),
    ("xsum", 4, {"tp": 2, "dp_shard": 2}, "none", "tp+fsdp"),
    ("xsum", 4, {"pp": 2, "tp": 2}, "none", "pp+tp"),
]
QUANTITIES = [("model state", "model_state_bytes", "model_state_bytes"),
              ("activations", "activation_bytes", "activation_bytes"),
              ("peak", "memory_per_rank_bytes", "peak_bytes")]


def _full(mesh: dict[str, int], world: int) -> dict[str, int]:
    degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **mesh}
    named = degrees["pp"] * degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"]
    assert named == world, (mesh, world)
    return degrees


def _plan_rows(plugin: str, world: int, data_dir: Path) -> dict:
    """`ddl plan --site local --nproc WORLD`'s report (every candidate, fitting or not)."""
    from ddl.commands.plan import plan_layouts
    from ddl.contract.host_memory import available_bytes
    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import get_site

    plugins = Plugins()
    spec, site = plugins.workload(plugin), get_site("local", plugins)
    report = plan_layouts(spec, spec.presets["tiny"], site, world, world,
                          GLOBAL_BATCH[plugin], data_dir, device_kind="cpu",
                          memory_bytes=available_bytes() // world)
    report.update(plugin=plugin, preset="tiny", site="local", nodes=1)
    return report


def _row(report: dict, mesh: dict[str, int], checkpointing: str) -> dict:
    """The plan's row for ``mesh`` with one micro-step per optimizer step."""
    for row in report["fits"] + report["dropped"]:
        if (row["mesh"] == mesh and row["accumulation"] == 1
                and row["activation_checkpointing"] == checkpointing):
            if row["dropped"]:
                raise SystemExit(f"the plan drops {mesh}: {row['dropped']}")
            return row
    raise SystemExit(f"no plan row for {mesh} ({checkpointing})")


def run(out: Path) -> dict:
    from ddl.commands import plan_verify
    from ddl.contract.plugins import Plugins
    from machine import describe

    os.environ["OMP_NUM_THREADS"] = "1"
    doc = {"benchmark": "plan_accuracy", "machine": describe(),
           "how": plan_verify._how("cpu") + [
               "one thread per rank (OMP_NUM_THREADS=1); predicted: the fullest rank's "
               "(the plan's row); measured: the largest over the ranks"],
           "epochs": plan_verify.EPOCHS, "steps_per_epoch": plan_verify.STEPS, "runs": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddl-plan-accuracy-") as tmp:
        data = {}
        for plugin in GLOBAL_BATCH:
            spec = Plugins().workload(plugin)
            data[plugin] = Path(tmp) / f"data-{plugin}"
            spec.create(spec.presets["tiny"]).prepare(data[plugin], synthetic=True)
        reports: dict[tuple[str, int], dict] = {}
        for i, (plugin, world, mesh, ckpt, label) in enumerate(CASES):
            key = (plugin, world)
            if key not in reports:
                reports[key] = _plan_rows(plugin, world, data[plugin])
            row = _row(reports[key], _full(mesh, world), ckpt)
            print(f"[{i + 1}/{len(CASES)}] {plugin} {world} process(es) {label}: ddl train "
                  + " ".join(row["flags"]), flush=True)
            t0 = time.perf_counter()
            got = plan_verify.measure(row, reports[key], "cpu", data[plugin],
                                      Path(tmp) / f"run-{i}")
            got.update(plugin=plugin, preset="tiny", processes=world, label=label,
                       global_batch=GLOBAL_BATCH[plugin], wall_s=time.perf_counter() - t0)
            if got["status"] != "measured":
                raise SystemExit(f"{plugin} {label} on {world}: {got['why']}")
            doc["runs"].append(got)
            print("    " + ", ".join(
                f"{name} {got['predicted'][p]} -> {got['measured'][m]}"
                for name, p, m in QUANTITIES), flush=True)
    doc["total_s"] = time.perf_counter() - started
    doc["machine_after"] = describe()
    doc["summary"] = summary(doc["runs"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _trimmed(run: dict) -> bool:
    """A run whose batches are trimmed below the plan's bound (xsum without a pipeline)."""
    return run["plugin"] == "xsum" and run["mesh"]["pp"] == 1


def summary(runs: list[dict]) -> dict:
    """Per quantity: measured / predicted, its range, and how many within 5 % and 15 %
    (activations also apart for the trimmed xsum runs, whose plan is a bound)."""
    out = {}
    for name, p, m in QUANTITIES:
        for part, keep in (("", lambda r: True),
                           (" (untrimmed batches)", lambda r: not _trimmed(r)),
                           (" (xsum trimmed, the plan a bound)", _trimmed)):
            if name != "activations" and part:
                continue
            ratios = [r["measured"][m] / r["predicted"][p] for r in runs
                      if keep(r) and r["predicted"][p] and r["measured"][m]]
            if ratios:
                out[name + part] = {
                    "runs": len(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                    "within_5_percent": sum(abs(x - 1) <= 0.05 for x in ratios),
                    "within_15_percent": sum(abs(x - 1) <= 0.15 for x in ratios)}
    # on a CPU: what a process holds besides the training tensors (Python, torch, gloo,
    # the data), the part of the peak the plan does not model (no CPU runtime reserve)
    extra = [r["measured"]["peak_bytes"] - r["predicted"]["memory_per_rank_bytes"]
             for r in runs if r["measured"].get("peak_bytes")]
    if extra:
        out["peak above the plan's memory (bytes)"] = {"min": min(extra), "max": max(extra)}
    return out


def figure(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "ddl-plan-accuracy"  # the same file for the same data
    colours = {"mnist": "tab:blue", "xsum": "tab:orange"}
    markers = {1: "o", 2: "s", 4: "^"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
    for ax, (name, p, m) in zip(axes, QUANTITIES):
        xs, ys = [], []
        for r in doc["runs"]:
            x, y = r["predicted"][p], r["measured"][m]
            if not x or not y:
                continue
            xs.append(x)
            ys.append(y)
            hollow = name == "activations" and _trimmed(r)
            ax.scatter([x / 2 ** 20], [y / 2 ** 20], marker=markers[r["processes"]], s=42,
                       facecolors="none" if hollow else colours[r["plugin"]],
                       edgecolors=colours[r["plugin"]], linewidths=1.2, zorder=3)
        lo, hi = min(xs + ys) / 2 ** 20 / 1.6, max(xs + ys) / 2 ** 20 * 1.6
        line = [lo, hi]
        ax.plot(line, line, color="black", linewidth=0.8, zorder=2)
        ax.fill_between(line, [v * 0.85 for v in line], [v * 1.15 for v in line],
                        color="grey", alpha=0.25, linewidth=0, zorder=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"predicted {name} per rank (MiB)")
        ax.set_ylabel("measured peak RSS (MiB)" if name == "peak" else "measured (MiB)")
        ax.set_title(name)
        ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], linestyle="", marker="o", color=c, label=w)
               for w, c in colours.items()]
    handles += [plt.Line2D([], [], linestyle="", marker=mk, color="grey", label=f"{n} rank(s)")
                for n, mk in markers.items()]
    handles += [plt.Line2D([], [], linestyle="", marker="s", markerfacecolor="none",
                           color="grey", label="xsum trimmed (plan: a bound)"),
                plt.Rectangle((0, 0), 1, 1, color="grey", alpha=0.25, label="y = x \u00b1 15 %")]
    fig.legend(handles=handles, loc="lower center", ncol=7, frameon=False, fontsize=9)
    machine = doc["machine"]
    loads = [m["load_average"][0] for m in (machine, doc.get("machine_after") or {})
             if m.get("load_average")]
    load = f"load {loads[0]:.1f} at the start" + (f", {loads[1]:.1f} at the end"
                                                   if len(loads) > 1 else "")
    fig.suptitle(f"ddl plan: predicted vs measured, {len(doc['runs'])} CPU runs "
                 f"({machine['cpus']} cores, {machine['cpu']}; {load}; "
                 f"{machine['date'][:10]})" if loads else
                 "ddl plan: predicted vs measured", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="results JSON (default: "
                        "benchmarks/results/plan_accuracy-<date>.json)")
    parser.add_argument("--figure", type=Path, default=HERE.parent / "docs" / "img"
                        / "plan-accuracy.svg")
    parser.add_argument("--figure-only", type=Path, metavar="JSON",
                        help="redraw the figure from a results file; no runs")
    args = parser.parse_args()
    if args.figure_only:
        doc = json.loads(args.figure_only.read_text())
        doc["summary"] = summary(doc["runs"])  # as this version of the script counts
        args.figure_only.write_text(json.dumps(doc, indent=2) + "\n")
    else:
        out = args.out or HERE / "results" / f"plan_accuracy-{time.strftime('%Y%m%d')}.json"
        doc = run(out)
        print(f"results: {out} ({doc['total_s']:.0f} s)")
    figure(doc, args.figure)
    print(json.dumps(doc["summary"], indent=2))
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
