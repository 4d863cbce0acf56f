"""Finished run directories written by hand for the report tests (tests/unit/test_report_html.py,
tests/system/test_browser.py): results.json and metrics.jsonl in the shape a real ddl run
writes (docs/results.md; a real run is checked in test_report_html.py too), with as many
ranks as asked and, optionally, a pipeline's bubble report and a hostile command line."""

from __future__ import annotations

import json
from pathlib import Path

HOSTILE = "<script>alert('x')</script>"


def epoch(n: int, ranks: int) -> dict:
    samples = 64 * ranks
    time_s = 0.5 if n == 1 else 0.2
    return {"epoch": n, "warmup": n == 1, "time_s": time_s, "samples": samples,
            "samples_per_s": samples / time_s, "data_wait_s": 0.02 * n,
            "data_wait_per_step_s": 0.01 * n, "eval_time_s": 0.1, "lr": 0.002,
            "train": {"accuracy": 0.2 + 0.1 * n, "loss": 2.3 - 0.2 * n},
            "val": {"accuracy": 0.25 + 0.1 * n, "loss": 2.2 - 0.2 * n}}


def write_run(run_dir: Path, *, ranks: int = 2, epochs: int = 3, pipeline: bool = False,
              command: list[str] | None = None) -> Path:
    run_dir.mkdir(parents=True)
    records = [epoch(n, ranks) for n in range(1, epochs + 1)]
    measured = records[1:] or records
    strategy = "pp" if pipeline else "ddp"
    results = {
        "ddl_version": "0.1.0",
        "versions": {"python": "3.11.7", "ddl": "0.1.0", "torch": "2.14.1",
                     "plugins": {"workload": "ddl-mnist 0.1.0",
                                 "strategy": "ddl-strategies 0.1.0"}},
        "started_at": "2026-11-26T06:47:50+0000", "finished_at": "2026-11-26T06:48:19+0000",
        "wall_time_s": 28.6,
        "command": command or ["ddl", "train", "--plugin", "mnist", "--nproc", str(ranks)],
        "plugin": "mnist", "strategy": strategy, "site": "local", "preset": "tiny",
        "data": {"dir": "/data", "synthetic": True},
        "world": {"size": ranks, "dp_size": 1 if pipeline else ranks, "backend": "gloo",
                  "device": "cpu", "parallel": {"pp": ranks if pipeline else 1,
                                                "dp_replicate": 1,
                                                "dp_shard": 1 if pipeline else ranks,
                                                "tp": 1}},
        "precision": "fp32", "loader_workers": 0,
        "threads": {"per_rank": 1, "source": "OMP_NUM_THREADS=1 (set by the user)"},
        "batch": {"per_replica": 32, "global": 32 * ranks, "micro": 32,
                  "accumulation_steps": 1},
        "lr": {"base": 0.002, "scaled": 0.002, "scaling": "none", "warmup_epochs": 0.0,
               "warmup_steps": None, "schedule": "workload"},
        "steps_per_epoch": 2, "activation_checkpointing": "none", "compile": {"enabled": False},
        "epochs": records,
        "summary": {"epoch_time_s": sum(e["time_s"] for e in measured) / len(measured),
                    "samples_per_s": sum(e["samples"] for e in measured)
                    / sum(e["time_s"] for e in measured),
                    "epochs_measured": [e["epoch"] for e in measured],
                    "first_epoch_excluded": epochs > 1},
        "final": {"val": records[-1]["val"], "test": {"accuracy": 0.5, "loss": 1.6}},
        "parameters": 5994, "model_file": "model.pt",
        "memory_per_rank": [{"params_bytes": 23976, "grads_bytes": 23976,
                             "optimizer_bytes": 47976, "model_state_bytes": 95928,
                             "peak_rss_bytes": (800 + 10 * r) * 2**20} for r in range(ranks)],
        "checkpoints": {"latest": "", "keep": 2, "every_steps": None, "resumed_from": None},
        "restarts": {"slurm_restart_count": 0, "worker_restarts": 0},
        "strategy_report": ({"schedule": "1F1B", "stages": ranks, "stages_per_rank": 1,
                             "microbatches": 4,
                             "bubble_measured_per_rank": [0.3 + 0.05 * r
                                                          for r in range(ranks)],
                             "bubble_measured": 0.35, "bubble_theory": 0.2}
                            if pipeline else {}),
        "utilisation": [{"rank": r, "interval_s": 1.0, "samples": 20,
                         "cpu_source": "psutil (this rank's process)",
                         "cpu_percent_mean": 90.0 + r, "cpu_percent_max": 99.0,
                         "device_source": "no accelerator", "device_util_percent_mean": None,
                         "device_util_percent_max": None} for r in range(ranks)],
        "mfu": {"flops_per_sample": 1935360, "achieved_flops_per_device": 7.4e8,
                "peak_flops_per_device": None, "peak_source": "site profile local",
                "mfu": None},
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in records))
    return run_dir
