"""Scaling tables and plots from finished runs' ``results.json``.

One point per run: epoch time (first epoch excluded, the trainer's summary), samples/s,
speedup and parallel efficiency against the smallest run, MFU, per-rank memory and time
spent waiting for data. Written as ``scale.json``, ``scale.csv``, three PNGs (time,
throughput, speedup; the last two with the ideal line) and ``report.html`` (a single run:
``report.html`` alone)
(ddl.commands.report_html: one run's page, or the study's). Used by ``ddl scale`` after its
runs and by ``ddl report`` on any finished runs (e.g. after Slurm jobs ended).

Speedup is the ratio of throughputs, not of epoch times: under weak scaling (per-replica
batch kept) and with ``--steps-per-epoch`` the points' epochs hold different sample counts,
and samples/s compares them fairly; with equal epochs the two ratios are the same. Several
runs of one point (``ddl scale --rounds``) become one point with their median and spread
(ddl.commands.report_rounds). A speedup more than 10 % above ideal is no result: its point
keeps the measured ratio as ``speedup_measured``, ``speedup`` and ``efficiency`` are empty,
and a warning says why.
No torch here; matplotlib is imported only to draw.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from ddl.commands import report_charts, report_html, report_rounds
from ddl.commands.run_results import SCALING_WORDS, parse_peak, read_results  # noqa: F401
from ddl.contract.errors import UsageError
from ddl.worker import mfu

CSV_FIELDS = ("devices", "run_dir", "epoch_time_s", "samples_per_s", "samples_per_s_min",
              "samples_per_s_max", "spread", "rounds", "speedup", "efficiency",
              "speedup_measured", "above_ideal", "mfu", "batch_per_replica", "batch_global",
              "data_wait_s", "data_wait_fraction",
              "max_peak_rss_bytes", "max_model_state_bytes", "max_device_peak_allocated_bytes",
              "cpu_percent_mean", "device_util_percent_mean", "warning")


def expand(dirs: list[Path]) -> list[Path]:
    """Run directories, with a directory of runs (e.g. a ``ddl scale`` output) replaced by
    the runs inside it."""
    runs: list[Path] = []
    for d in dirs:
        if (d / "results.json").exists() or not d.is_dir():
            runs.append(d)
            continue
        inner = sorted(p.parent for p in d.glob("*/results.json"))
        if not inner:
            raise UsageError(f"{d}: neither a finished run (results.json) nor a directory "
                             "of finished runs")
        runs += inner
    return runs


def point(run_dir: Path, results: dict[str, Any],
          peak_override: float | None = None) -> dict[str, Any]:
    """One scaling point from a run's results.json (numbers copied, not recomputed, except
    MFU when another peak is given)."""
    devices = results["world"]["size"]
    summary = results["summary"]
    measured = [e for e in results["epochs"] if e["epoch"] in summary["epochs_measured"]]
    data_wait = sum(e["data_wait_s"] for e in measured) / len(measured)
    block = results.get("mfu") or {}
    peak = peak_override or block.get("peak_flops_per_device")
    device = (results.get("world") or {}).get("device")
    mfu_note = block.get("peak_source") if str(block.get("peak_source")).startswith(
        "none:") and not peak_override else None
    if not peak_override and peak and device == "cpu":
        # results written before mfu.site_peak: a CPU run against a GPU site's peak
        accelerator = _site_accelerator(results.get("site"))
        if accelerator not in (None, "cpu"):
            mfu_note = mfu.site_peak(peak, results["site"], accelerator, device)[1]
            peak = None
    memory = results.get("memory_per_rank") or []
    usage = results.get("utilisation") or []

    def most(key: str) -> int | None:
        values = [m[key] for m in memory if m.get(key) is not None]
        return max(values) if values else None

    def mean_over_ranks(key: str) -> float | None:
        values = [u[key] for u in usage if u.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {
        "devices": devices, "run_dir": str(run_dir),
        "plugin": results["plugin"], "strategy": results["strategy"],
        "preset": results["preset"], "site": results["site"],
        "epoch_time_s": summary["epoch_time_s"], "samples_per_s": summary["samples_per_s"],
        "epochs_measured": summary["epochs_measured"],
        "batch_per_replica": results["batch"]["per_replica"],
        "batch_global": results["batch"]["global"],
        "data_wait_s": data_wait, "data_wait_fraction": data_wait / summary["epoch_time_s"],
        "mfu": mfu.mfu(block.get("flops_per_sample"), summary["samples_per_s"], devices, peak),
        "flops_per_sample": block.get("flops_per_sample"), "peak_flops_per_device": peak,
        "memory_per_rank": memory,
        "max_peak_rss_bytes": most("peak_rss_bytes"),
        "max_model_state_bytes": most("model_state_bytes"),
        "max_device_peak_allocated_bytes": most("device_peak_allocated_bytes"),
        "mfu_note": mfu_note,
        "threads_per_rank": (results.get("threads") or {}).get("per_rank"),
        "device": device,
        "cpu_percent_mean": mean_over_ranks("cpu_percent_mean"),
        "device_util_percent_mean": mean_over_ranks("device_util_percent_mean"),
    }


def _site_accelerator(site: Any) -> str | None:
    """The accelerator kind of a site profile by name, or None when it is not known here."""
    if not isinstance(site, str):
        return None
    from ddl.settings.sites import get_site

    try:
        return get_site(site).accelerator
    except Exception:  # an unknown or broken profile: keep the recorded peak
        return None


def _checked_point(run_dir: Path, peak_override: float | None) -> dict[str, Any]:
    """point(), with a results.json of another shape (``{}``, a list, a hand edit, another
    tool's) refused in one line instead of a KeyError."""
    results = read_results(run_dir)
    try:
        if not isinstance(results, dict):
            raise TypeError(f"a JSON {type(results).__name__}, not an object")
        return point(run_dir, results, peak_override)
    except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError) as exc:
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc) or "empty"
        raise UsageError(f"{Path(run_dir) / 'results.json'}: not a ddl results file ({what}); "
                         "give directories of runs ddl finished") from None


def scaling_kind(points: list[dict[str, Any]]) -> str:
    """'strong' (same global batch), 'weak' (same per-replica batch), 'mixed', or
    'single point'."""
    if len(points) == 1:
        return "single point"
    if len({p["batch_global"] for p in points}) == 1:
        return "strong"
    if len({p["batch_per_replica"] for p in points}) == 1:
        return "weak"
    return "mixed"


ABOVE_IDEAL = 1.10  # a speedup more than 10 % above ideal is flagged, not believed


def table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sorted by devices, with speedup and efficiency against the smallest point. A speedup
    more than 10 % above ideal cannot come from adding devices (only from uneven threads or
    a baseline slowed by other load), so it is no result: ``speedup`` and ``efficiency``
    stay empty, ``speedup_measured`` keeps the ratio and ``warning`` says why."""
    points = sorted(points, key=lambda p: p["devices"])
    base = points[0]
    for p in points:
        ideal = p["devices"] / base["devices"]
        measured = p["samples_per_s"] / base["samples_per_s"]
        p["speedup_measured"] = measured
        p["above_ideal"] = measured > ideal * ABOVE_IDEAL
        p["speedup"] = None if p["above_ideal"] else measured
        p["efficiency"] = None if p["above_ideal"] else measured / ideal
        p["warning"] = _why_above_ideal(p, base) if p["above_ideal"] else None
    return points


def _why_above_ideal(p: dict[str, Any], base: dict[str, Any]) -> str:
    """The likely cause of a speedup above ideal, as far as the results tell."""
    ideal = p["devices"] / base["devices"]
    head = (f"{p['devices']} devices: measured speedup {p['speedup_measured']:.2f} is "
            f"{p['speedup_measured'] / ideal - 1:.0%} above the ideal {ideal:g}, so it is "
            "no result; ")
    threads = (base.get("threads_per_rank"), p.get("threads_per_rank"))
    if None not in threads and base["device"] == p["device"] == "cpu":
        cores = (threads[0] * base["devices"], threads[1] * p["devices"])
        if threads[1] > threads[0]:  # more cores per rank, not only more ranks
            return (head + f"it computed with {cores[1]} CPU threads in all against "
                    f"{cores[0]} for the {base['devices']}-device run: more cores, not "
                    "better scaling (OMP_NUM_THREADS, docs/measuring.md)")
    if None in threads:
        return (head + "the runs do not record their threads per rank (results before "
                "ddl's thread policy); an uneven thread count, or a baseline slowed by other "
                "load on the machine, is the usual cause")
    spread = ""
    if base.get("rounds", 1) > 1:
        spread = (f" (its samples/s ranged {base['samples_per_s_min']:.1f}-"
                  f"{base['samples_per_s_max']:.1f} over {base['rounds']} rounds)")
    return (head + f"the {base['devices']}-device baseline was probably slowed{spread} by "
            "other load on the machine, a first epoch too short to warm up, or data not yet "
            "cached: rerun on a quiet machine or with more --rounds")


def build(run_dirs: list[Path], peak_override: float | None = None) -> dict[str, Any]:
    runs = expand(run_dirs)
    each_run = [_checked_point(d, peak_override) for d in runs]
    workloads = {(p["plugin"], p["preset"], p["strategy"]) for p in each_run}
    if len(workloads) > 1:
        raise UsageError("the runs train different things ("
                         + "; ".join(" ".join(w) for w in sorted(workloads))
                         + "); a scaling report compares one workload, preset and strategy")
    points = table(report_rounds.merge(each_run))
    return {"plugin": points[0]["plugin"], "preset": points[0]["preset"],
            "strategy": points[0]["strategy"], "scaling": scaling_kind(points),
            "baseline_devices": points[0]["devices"], "points": points}


def write(report: dict[str, Any], out: Path, study: bool | None = None) -> list[Path]:
    """The files of a report in ``out``. A study (``ddl scale``, or several points) gets
    scale.json, scale.csv, the three scaling plots and report.html; a single run only its
    report.html: a table and a speedup plot of one point say nothing, and ``ddl report
    RUN`` writes into the run directory by default."""
    if not (len(report["points"]) > 1 if study is None else study):
        out.mkdir(parents=True, exist_ok=True)
        return [report_html.write(report, out, [])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    with open(out / "scale.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(report["points"])
    pngs = plots(report, out)
    return [out / "scale.json", out / "scale.csv", *pngs, report_html.write(report, out, pngs)]


def plots(report: dict[str, Any], out: Path) -> list[Path]:
    plt = report_charts.pyplot()  # files only (Agg); no display on compute nodes

    points = report["points"]
    n = [p["devices"] for p in points]
    base = points[0]
    title = (f"{report['plugin']} ({report['preset']}), {report['strategy']}, "
             f"{report['scaling']}" + (" scaling" if report["scaling"] in ("weak", "strong")
                                       else ""))
    ideal_throughput = [base["samples_per_s"] * d / base["devices"] for d in n]
    ideal_speedup = [d / base["devices"] for d in n]
    spread = [(p["samples_per_s"] - p.get("samples_per_s_min", p["samples_per_s"]),
               p.get("samples_per_s_max", p["samples_per_s"]) - p["samples_per_s"])
              for p in points]
    figures = [
        ("time.png", "epoch time (s, first epoch excluded)", [p["epoch_time_s"] for p in points],
         None),
        ("throughput.png", "samples/s", [p["samples_per_s"] for p in points], ideal_throughput),
        ("speedup.png", f"speedup over {base['devices']} device(s)",
         [p.get("speedup_measured", p["speedup"]) for p in points], ideal_speedup),
    ]
    written = []
    for name, ylabel, values, ideal in figures:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(n, values, "o-", label="measured (median)")
        if name == "throughput.png" and any(low or high for low, high in spread):
            ax.errorbar(n, values, yerr=list(zip(*spread)), fmt="none", capsize=4,
                        label="min-max over the rounds")
        if ideal:
            ax.plot(n, ideal, "--", color="grey", label="ideal")
            flagged = [(d, v) for d, v, p in zip(n, values, points) if p.get("above_ideal")]
            if flagged:  # not believed: see the table's warnings
                ax.plot(*zip(*flagged), "x", color="red", markersize=10,
                        label="above ideal by > 10 %: no result")
            ax.legend()
        ax.set_xlabel("devices (processes)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(n)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    return written


def format_table(report: dict[str, Any]) -> str:
    how = SCALING_WORDS[report["scaling"]]
    lines = [f"{report['plugin']} ({report['preset']}) with {report['strategy']}: {how}",
             _how_measured(report["points"]),
             (f"{'devices':>7} {'epoch s':>9} {'samples/s':>10} {'spread':>6} {'speedup':>8} "
              f"{'effic.':>7} {'MFU':>8} {'data wait':>9} {'max RSS MB':>10} {'CPU %':>6} "
              f"{'GPU %':>6}")]
    for p in report["points"]:
        mfu_text = f"{p['mfu']:.2%}" if p["mfu"] is not None else "-"
        rss = f"{p['max_peak_rss_bytes'] / 2**20:.0f}" if p["max_peak_rss_bytes"] else "-"
        spread = f"{p['spread']:.0%}" if p.get("rounds", 1) > 1 else "-"
        if p["speedup"] is None:  # above ideal: no result, the warning below says why
            speedup = f"{'invalid':>8}!{'-':>6}"
        else:
            speedup = f"{p['speedup']:>8.2f} {p['efficiency']:>6.1%}"
        lines.append(f"{p['devices']:>7} {p['epoch_time_s']:>9.2f} {p['samples_per_s']:>10.1f} "
                     f"{spread:>6} {speedup} {mfu_text:>8} "
                     f"{p['data_wait_fraction']:>9.1%} {rss:>10} {_pct(p['cpu_percent_mean'])} "
                     f"{_pct(p['device_util_percent_mean'])}")
    lines += [f"warning: {p['warning']}" for p in report["points"] if p.get("warning")]
    lines += [f"note: MFU '-' for {p['devices']} device(s): {p['mfu_note']}"
              for p in report["points"] if p.get("mfu_note")]
    return "\n".join(lines)


def _how_measured(points: list[dict[str, Any]]) -> str:
    """One line: the rounds behind each number, and whether every point ran the same
    threads per rank (if not, a speedup compares cores as well as processes)."""
    rounds = sorted({p.get("rounds", 1) for p in points})
    if rounds == [1]:
        line = "one run per point"
    elif len(rounds) == 1:
        line = (f"median of {rounds[0]} alternating rounds per point, spread = (max - min) / "
                "median samples/s")
    else:
        line = "rounds differ between points (medians and spreads of unequal counts)"
    threads = {p.get("threads_per_rank") for p in points}
    if len(threads) == 1 and None not in threads:
        return f"{line}; threads per rank: {threads.pop()} at every point"
    per_point = ", ".join(f"{p['devices']}: {p.get('threads_per_rank') or '?'}" for p in points)
    return f"{line}; threads per rank differ (devices: threads {per_point})"


def _pct(value: float | None) -> str:
    return f"{value:>6.0f}" if value is not None else f"{'-':>6}"


def cmd_report(ns: argparse.Namespace) -> int:
    import os

    runs = expand(ns.run_dirs)
    built = build(runs, parse_peak(ns.peak_flops))
    out = ns.output or Path(os.path.commonpath([str(Path(d).resolve().parent) for d in runs]))
    print(format_table(built))
    for path in write(built, out):
        print(f"  {path}")
    return 0
