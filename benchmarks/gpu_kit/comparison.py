"""ddl against its peer, per course workload: the medians over the rounds the kit ran
(checks ``course-<w>-bf16-r<k>`` and ``peer-<w>-bf16-r<k>``, alternating), for the JSON's
``comparison`` and the summary's second table.

The ratio is the median over rounds of ddl's samples/s over the peer's in the same round
(rounds where both succeeded), so that a slow moment of the machine hits both sides of a
round alike. GPU busy is NVML's utilisation mean through ddl's sampler (1 s interval) over
the same window for both, the first step to the last epoch's end (warm-up epoch included;
ddl's window also holds its per-epoch validation); the peer's steady-state figure (timed
epochs, 0.1 s) is given beside it. Data wait is the share of the timed epochs' training
time spent fetching batches, measured the same way in both loops.
"""

from __future__ import annotations

import re
from statistics import median

ROUND = re.compile(r"^(course|peer)-(?P<workload>[a-z0-9]+)-bf16-r(?P<round>\d+)$")


def _median(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return median(values) if values else None


def compare(records: list[dict]) -> list[dict]:
    """One entry per workload with at least one round that ran (ok or failed)."""
    rounds: dict[str, dict[int, dict[str, dict]]] = {}
    for r in records:
        m = ROUND.match(r["name"])
        if m and r["status"] != "skipped":
            side = "ddl" if r["name"].startswith("course-") else "peer"
            rounds.setdefault(m["workload"], {}).setdefault(int(m["round"]), {})[side] = r
    out = []
    for workload, by_round in rounds.items():
        ok = {side: [pair[side]["numbers"] for pair in by_round.values()
                     if side in pair and pair[side]["status"] == "ok"]
              for side in ("ddl", "peer")}
        ratios = [pair["ddl"]["numbers"]["samples_per_s"] / pair["peer"]["numbers"]["samples_per_s"]
                  for pair in by_round.values()
                  if all(side in pair and pair[side]["status"] == "ok" for side in ("ddl", "peer"))]
        entry = {"workload": workload, "rounds": len(by_round),
                 "ddl_rounds_ok": len(ok["ddl"]), "peer_rounds_ok": len(ok["peer"]),
                 "ratio_ddl_over_peer": _median(ratios),
                 "ratio_min": min(ratios) if ratios else None,
                 "ratio_max": max(ratios) if ratios else None}
        for side in ("ddl", "peer"):
            for key, name in (("samples_per_s", "samples_per_s"),
                              ("device_util_percent_mean", "gpu_busy_percent"),
                              ("data_wait_share", "data_wait_share"),
                              ("mfu_vs_measured_peak", "mfu_vs_measured_peak")):
                entry[f"{side}_{name}"] = _median([n.get(key) for n in ok[side]])
        entry["peer_gpu_busy_steady_percent"] = _median(
            [n.get("device_util_steady_percent_mean") for n in ok["peer"]])
        out.append(entry)
    return out
