"""Does `ddl plan` rank layouts on a CPU site as they run there? (issue 51's acceptance)

For MNIST tiny, CIFAR tiny and the example GPT plugin (docs/examples/ddl-gpt-plugin, a
plugin the planner was not tuned on, installed into a temporary site directory as a third
party's would be: a dist-info with its ``ddl`` entry point), each on synthetic data that
``ddl prepare --synthetic`` writes, this runs the command a user runs:

    ddl plan --plugin P --preset tiny --site local --nproc 2 --verify 3 --format json

and writes ``benchmarks/results/plan_ranking-<date>.json``: per workload the three
verified layouts (distinct meshes), each with its predicted and measured step time,
activations and peak, and whether the measured order is the predicted one. Then it judges
the bars of issue 51 (``bars``):

- step time: every verified layout's prediction within 25 % of what it measured;
- ranking: the plan's first (what ``--mesh auto`` trains) is the measured fastest or
  within 10 % of it, and never more than 25 % slower;
- activations within 15 %, peak within 25 % of measured (the same runs).

The whole of it runs ``--repeats`` times (default 3) and the bars are judged on each
row's median ratio over the rounds (rows matched by mesh; the ranking bar on the median
of its ratio): on the 2-core VM one layout's measured step moved up to 1.6x between runs
minutes apart, a machine's state that lasts a whole run (its epochs moved together), so
one run alone missed a bar that its neighbours met. Every round's rows and its own
misses are kept in the JSON (``rounds``, ``round_misses``).

    .venv/bin/python benchmarks/plan_ranking.py              # ~5 min on 2 quiet cores
    .venv/bin/python benchmarks/plan_ranking.py --repeats 1  # one run, judged alone
    .venv/bin/python benchmarks/plan_ranking.py --check benchmarks/results/plan_ranking-X.json

Both a run and ``--check`` (which judges a results file again) exit 1 when a bar is
missed (each miss one line). Step times on a CPU are the machine's: run it on quiet cores (the JSON records the
load average before and after); one verify epoch of 10 steps varied ~30 % between runs on
the 2-core host, so verify takes the median of 3 timed epochs. The gloo links and the
matmul rate are measured afresh in each run (a cache directory of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GPT_SRC = REPO / "docs" / "examples" / "ddl-gpt-plugin" / "src"
WORKLOADS = ("mnist", "cifar", "chargpt")
PROCESSES = 2
VERIFY = 3
# issue 51's bars, as |predicted - measured| <= share x measured
STEP_WITHIN, ACTIVATIONS_WITHIN, PEAK_WITHIN = 0.25, 0.15, 0.25
FIRST_OVER_FASTEST, AUTO_OVER_FASTEST = 1.10, 1.25


def install_gpt_example(site: Path) -> None:
    """The example GPT plugin as a third party's install leaves it: its package on the
    path, a dist-info whose entry point registers ``chargpt``."""
    info = site / "ddl_gpt_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddl-gpt-plugin\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ddl]\nchargpt = ddl_gpt.plugin\n")


def ddl(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddl.commands.cli", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, check=False)


def run(workloads: tuple[str, ...]) -> dict:
    sys.path.insert(0, str(HERE))
    from machine import describe

    doc = {"benchmark": "plan_ranking", "machine": describe(), "processes": PROCESSES,
           "verify": VERIFY, "workloads": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddl-plan-ranking-") as tmp:
        site = Path(tmp) / "site"
        install_gpt_example(site)
        # a cache of its own: the gloo links and the matmul rate are measured in this run,
        # on the machine as it is now (a week-old entry from a busy hour decided the
        # pipeline's hand-offs once: 3 ms a message against 1.3 ms measured quiet)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DDL_CACHE_DIR": str(Path(tmp) / "cache"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(GPT_SRC),
                                                           os.environ.get("PYTHONPATH")]))}
        for plugin in workloads:
            data = Path(tmp) / f"data-{plugin}"
            prep = ddl(["prepare", "--plugin", plugin, "--synthetic", "--data-dir", str(data)],
                       env, Path(tmp))
            if prep.returncode != 0:
                raise SystemExit(f"ddl prepare --plugin {plugin}: {prep.stderr.strip()}")
            print(f"{plugin}: ddl plan --verify {VERIFY} ...", flush=True)
            t0 = time.perf_counter()
            proc = ddl(["plan", "--plugin", plugin, "--preset", "tiny", "--site", "local",
                        "--nproc", str(PROCESSES), "--data-dir", str(data), "--verify",
                        str(VERIFY), "--format", "json"], env, Path(tmp))
            if proc.returncode != 0:
                raise SystemExit(f"ddl plan --plugin {plugin}: exit {proc.returncode}: "
                                 f"{proc.stderr.strip()[-500:]}")
            report = json.loads(proc.stdout)
            doc["workloads"][plugin] = {"seconds": time.perf_counter() - t0,
                                        "verify": report["verify"]}
        # what the plans were timed with: the links (and the ranks' wait for the slowest)
        cache = Path(tmp) / "cache" / "cpu-links.json"
        if cache.exists():
            doc["calibration"] = json.loads(cache.read_text())
    doc["machine_after"] = describe()
    doc["total_s"] = time.perf_counter() - started
    doc["misses"] = bars(doc)
    doc["met"] = not doc["misses"]
    return doc


def run_rounds(workloads: tuple[str, ...], repeats: int) -> dict:
    """``run`` ``repeats`` times; one round's document as it is, several judged on their
    medians (:func:`medians`)."""
    rounds = []
    for i in range(repeats):
        if repeats > 1:
            print(f"round {i + 1} of {repeats}", flush=True)
        rounds.append(run(workloads))
    if repeats == 1:
        return rounds[0]
    doc = {"benchmark": "plan_ranking", "repeats": repeats, "rounds": rounds,
           "round_misses": [r["misses"] for r in rounds],
           "total_s": sum(r["total_s"] for r in rounds)}
    doc["misses"] = bars(doc)
    doc["met"] = not doc["misses"]
    return doc


def medians(rounds: list[dict]) -> dict:
    """One document in a round's shape whose rows hold each mesh's median ratios over the
    rounds that measured it (``rounds``: how many), and whose order holds the median of
    the plan's first over the measured fastest."""
    out: dict = {"workloads": {}}
    for plugin in rounds[0]["workloads"]:
        by_mesh: dict[str, list[dict]] = {}
        firsts = []
        for doc in rounds:
            verify = doc["workloads"][plugin]["verify"]
            for row in verify["layouts"]:
                by_mesh.setdefault(json.dumps(row["mesh"], sort_keys=True), []).append(row)
            first = (verify.get("order") or {}).get("first_over_fastest")
            if first is not None:
                firsts.append(first)
        layouts = []
        for rows in by_mesh.values():
            measured = [r for r in rows if r["status"] == "measured"]
            if not measured:
                layouts.append(rows[0])
                continue
            ratio = {}
            for key in ("step", "activations", "peak"):  # a round without one: no median
                values = [r["ratio"].get(key) for r in measured]
                ratio[key] = None if None in values else statistics.median(values)
            layouts.append({"mesh": measured[0]["mesh"], "status": "measured", "why": None,
                            "rounds": len(measured), "ratio": ratio})
        out["workloads"][plugin] = {"verify": {"layouts": layouts, "order": {
            "first_over_fastest": statistics.median(firsts) if firsts else None}}}
    return out


def _off(ratio: float | None, within: float) -> bool:
    """``ratio`` = measured / predicted; off when |predicted - measured| > within x measured."""
    return ratio is None or abs(1 / ratio - 1) > within


def bars(doc: dict) -> list[str]:
    """Each missed bar of issue 51, one line each (none: all met); a document of several
    rounds is judged on its medians."""
    if "rounds" in doc:
        doc = medians(doc["rounds"])
    misses = []
    for plugin, entry in doc["workloads"].items():
        verify = entry["verify"]
        rows = verify["layouts"]
        if len(rows) < VERIFY:
            misses.append(f"{plugin}: {len(rows)} layouts verified, not {VERIFY}")
        meshes = {json.dumps(row["mesh"], sort_keys=True) for row in rows}
        if len(meshes) < len(rows):
            misses.append(f"{plugin}: a mesh verified twice")
        for i, row in enumerate(rows, 1):
            if row["status"] != "measured":
                misses.append(f"{plugin} #{i}: {row['status']}: {row['why']}")
                continue
            ratio = row["ratio"]
            for key, within in (("step", STEP_WITHIN), ("activations", ACTIVATIONS_WITHIN),
                                ("peak", PEAK_WITHIN)):
                if _off(ratio.get(key), within):
                    got = ratio.get(key)
                    misses.append(f"{plugin} #{i} {key}: measured / predicted "
                                  f"{'n/a' if got is None else f'{got:.2f}'}, allowed "
                                  f"{1 / (1 + within):.2f}-{1 / (1 - within):.2f}")
        order = verify.get("order") or {}
        first = order.get("first_over_fastest")
        if first is None:
            misses.append(f"{plugin}: no measured order")
        elif first > FIRST_OVER_FASTEST:
            misses.append(f"{plugin}: the plan's first ran {first:.2f}x the measured fastest "
                          f"(allowed {FIRST_OVER_FASTEST:.2f}x; --mesh auto's bar "
                          f"{AUTO_OVER_FASTEST:.2f}x{' also missed' if first > AUTO_OVER_FASTEST else ' met'})")
    return misses


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="results JSON (default: "
                        "benchmarks/results/plan_ranking-<date>.json)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="rounds, judged on their "
                        "medians (default 3)")
    parser.add_argument("--check", type=Path, metavar="JSON",
                        help="judge a results file again; exit 1 when a bar is missed")
    args = parser.parse_args()
    if args.check:
        doc = json.loads(args.check.read_text())
        misses = bars(doc)
    else:
        out = args.out or HERE / "results" / f"plan_ranking-{time.strftime('%Y%m%d')}.json"
        if args.repeats < 1:
            parser.error(f"--repeats {args.repeats}: at least 1")
        doc = run_rounds(tuple(args.workloads), args.repeats)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"results: {out} ({doc['total_s']:.0f} s)")
        misses = doc["misses"]
    for line in misses:
        print(f"missed: {line}")
    for i, missed in enumerate(doc.get("round_misses", []), 1):
        print(f"round {i}: {len(missed)} bar(s) missed alone" if missed
              else f"round {i}: every bar met alone")
    print("all of issue 51's bars met" if not misses else f"{len(misses)} bar(s) missed")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
