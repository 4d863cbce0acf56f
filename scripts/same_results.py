"""Print how far runs of one workload ended from the first one (docs/same-results.md).

    python3 scripts/same_results.py RUN_DIR [RUN_DIR ...]

Reads each run's results.json (no torch needed) and prints a Markdown table: processes,
threads per process, strategy, the last epoch's mean train loss, the test loss, and each
one's relative distance from the first run's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(run_dir: Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    threads = (results.get("threads") or {}).get("per_rank", "?")
    return {"run": run_dir.name, "processes": results["world"]["size"], "threads": threads,
            "strategy": results["strategy"], "train": results["epochs"][-1]["train"]["loss"],
            "test": results["final"]["test"]["loss"]}


def main(dirs: list[str]) -> int:
    if not dirs:
        sys.exit(__doc__)
    rows = [row(Path(d)) for d in dirs]
    ref = rows[0]
    print("| run | processes x threads | strategy | train loss (last epoch) | vs first | "
          "test loss | vs first |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        d_train = abs(r["train"] - ref["train"]) / abs(ref["train"])
        d_test = abs(r["test"] - ref["test"]) / abs(ref["test"])
        print(f"| {r['run']} | {r['processes']} x {r['threads']} | {r['strategy']} | "
              f"{r['train']:.6f} | {d_train:.2e} | {r['test']:.6f} | {d_test:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
