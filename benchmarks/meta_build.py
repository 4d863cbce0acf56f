"""Models bigger than one rank's share: the meta-device build on this machine (issue 40).

Each case trains one optimizer step twice, split over several processes and in one process,
with the same seed and global batch, and checks from the runs' results.json:

- every rank's ``memory_per_rank[].build_peak_bytes`` (the RSS high-water mark of building
  and loading the model, ddl.worker.build.build_memory) is at most 40 % of the model's fp32
  parameter bytes (``parameters`` x 4): no rank built the whole model;
- the validation loss after that step equals the one process's within 1e-4 relative:
  every rank started from one process's weights. The step runs at ``--lr 1e-30`` (the
  weights stay as built) and the comparison is in eval mode, because T5 trains with
  dropout, whose draws differ between one process and 4 ranks by design (each rank its
  own stream): a training loss cannot be compared, the initial weights can.

Cases:

    xsum     t5-large (738M parameters; random weights unless `ddl prepare --preset
             t5-large` fetched them), --strategy fsdp on 4 processes, batch 1 per rank
    chargpt  the GPT example plugin (docs/examples/ddl-gpt-plugin, installed into a fresh
             venv beside ddl as a third party would), preset wide (~100M parameters),
             --mesh pp=2,tp=2,dp_shard=2 on 8 processes

    .venv/bin/python benchmarks/meta_build.py                 # both; exit 1 if a check fails
    .venv/bin/python benchmarks/meta_build.py --cases chargpt

Memory: xsum t5-large needs ~20 GB of RAM for the one-process run and ~20 GB for the four
ranks (AdamW's state and foreach temporaries; run nothing else beside it). Evaluation is cut
to 4 samples per split (--eval-samples). Results: benchmarks/results/meta_build.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from machine import describe  # noqa: E402

RESULTS = HERE / "results" / "meta_build.json"
PEAK_SHARE = 0.40
LOSS_RTOL = 1e-4
COMMON = ["--device", "cpu", "--epochs", "1", "--steps-per-epoch", "1", "--eval-samples",
          "4", "--lr", "1e-30", "--seed", "3"]  # the seed last: the predictor reads it
CASES = {
    "xsum": {"args": ["--plugin", "xsum", "--preset", "t5-large", "--global-batch-size", "4"],
             "split": ["--strategy", "fsdp", "--nproc", "4"]},
    "chargpt": {"args": ["--plugin", "chargpt", "--preset", "wide", "--global-batch-size",
                         "8"],
                "split": ["--mesh", "pp=2,tp=2,dp_shard=2", "--nproc", "8"],
                "third_party": REPO / "docs" / "examples" / "ddl-gpt-plugin"},
}


def _ddl(python: str) -> list[str]:
    return [python, "-c", "import sys; from ddl.commands.cli import main; sys.exit(main())"]


def _gpt_venv(root: Path) -> str:
    """A fresh venv with the GPT example installed (the system tests' recipe)."""
    sys.path.insert(0, str(REPO / "tests"))
    from system.plugin_venv import install_in_fresh_venv

    venv = install_in_fresh_venv(CASES["chargpt"]["third_party"], root / "gpt", "ddl_gpt")
    return str(venv / "bin" / "python")


def _train(python: str, args: list[str], run_dir: Path) -> dict:
    started = time.time()
    proc = subprocess.run([*_ddl(python), "train", *args, "--run-dir", str(run_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"meta_build: `ddl train {' '.join(args)}` failed "
                         f"({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    doc = json.loads((run_dir / "results.json").read_text())
    doc["_wall_s"] = time.time() - started
    return doc


def _case(name: str, root: Path) -> dict:
    case = CASES[name]
    python = sys.executable
    data = root / f"data-{name}"
    if "third_party" in case:
        python = _gpt_venv(root)
    subprocess.run([*_ddl(python), "prepare", "--plugin", case["args"][1], "--synthetic",
                    "--data-dir", str(data)], check=True, capture_output=True)
    args = [*case["args"], *COMMON, "--data-dir", str(data)]
    split = _train(python, [*args, *case["split"]], root / f"{name}-split")
    single = _train(python, [*args, "--nproc", "1"], root / f"{name}-one")
    fp32 = split["parameters"] * 4
    peaks = [m["build_peak_bytes"] for m in split["memory_per_rank"]]
    one_peak = single["memory_per_rank"][0]["build_peak_bytes"]
    loss = split["epochs"][0]["val"]["loss"]
    ref = single["epochs"][0]["val"]["loss"]
    out = {
        "command": f"ddl train {' '.join([*case['args'], *COMMON, *case['split']])}",
        "parameters": split["parameters"], "fp32_parameter_bytes": fp32,
        "build_peak_bytes_per_rank": peaks,
        "build_peak_share_max": max(peaks) / fp32,
        "one_process_build_peak_bytes": one_peak,
        "one_process_build_peak_share": one_peak / fp32,
        "val_loss": loss, "one_process_val_loss": ref,
        "loss_relative_difference": abs(loss - ref) / abs(ref),
        "wall_s": {"split": round(split["_wall_s"], 1), "one": round(single["_wall_s"], 1)},
    }
    out["peak_ok"] = out["build_peak_share_max"] <= PEAK_SHARE
    out["loss_ok"] = out["loss_relative_difference"] <= LOSS_RTOL
    if "third_party" not in case:  # `ddl plan`'s memory model against this run (issue 41)
        out["plan"] = _predicted_vs_measured(case, data, split)
    return out


def _predicted_vs_measured(case: dict, data: Path, results: dict) -> dict:
    """Per rank, measured / predicted for the model state (target within 5 %) and the
    bytes held for backward (within 15 %), by the predictor the equivalence matrix uses."""
    sys.path.insert(0, str(REPO / "tests"))
    from plan_prediction import predict

    plugin, preset = case["args"][1], case["args"][3]
    predicted = predict(plugin, preset, data, results, seed=int(COMMON[-1]))
    state, saved = [], []
    for got, want in zip(results["memory_per_rank"], predicted):
        state.append(got["model_state_bytes"] / want["model_state_bytes"])
        saved.append(got["saved_for_backward_bytes"] / want["saved_for_backward_bytes"])
    return {"model_state_measured_over_predicted": state,
            "activations_measured_over_predicted": saved,
            "model_state_ok": all(abs(r - 1) <= 0.05 for r in state),
            "activations_ok": all(abs(r - 1) <= 0.15 for r in saved)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    ns = parser.parse_args()
    results = {"benchmark": "meta_build", "targets": {"build_peak_share": PEAK_SHARE,
                                                      "loss_rtol": LOSS_RTOL}, "cases": {}}
    if ns.out.exists():  # a run of some cases keeps the others' last results
        results["cases"] = json.loads(ns.out.read_text()).get("cases", {})
    with tempfile.TemporaryDirectory(prefix="ddl-meta-build-") as tmp:
        for name in ns.cases:
            results["cases"][name] = {"machine": describe(), **_case(name, Path(tmp))}
            r = results["cases"][name]
            print(f"{name}: build peak per rank max {r['build_peak_share_max']:.1%} of fp32 "
                  f"parameters (one process: {r['one_process_build_peak_share']:.1%}; "
                  f"target <= {PEAK_SHARE:.0%}); val loss {r['val_loss']:.6f} vs "
                  f"{r['one_process_val_loss']:.6f} (rel {r['loss_relative_difference']:.1e})",
                  flush=True)
            if "plan" in r:
                plan = r["plan"]
                print(f"{name}: measured / predicted per rank: model state "
                      f"{', '.join(f'{x:.3f}' for x in plan['model_state_measured_over_predicted'])}"
                      f"; activations "
                      f"{', '.join(f'{x:.3f}' for x in plan['activations_measured_over_predicted'])}",
                      flush=True)
            results["cases"][name]["machine"]["load_average_after"] = os.getloadavg()
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(results, indent=2) + "\n")
    ok = all(r["peak_ok"] and r["loss_ok"] and r.get("plan", {}).get("model_state_ok", True)
             and r.get("plan", {}).get("activations_ok", True)
             for r in results["cases"].values())
    print(f"results: {ns.out} ({'all met' if ok else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
