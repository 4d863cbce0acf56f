"""What the report and the scaling study both read: a run's results.json, the words for a
study's kind of scaling, and ``--peak-flops``. A module of its own so that ``ddl report``
(report, report_html) and ``ddl scale`` (scaling) need not import each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError


def read_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: no results.json (an unfinished or failed run?); give "
                         "directories of finished runs") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not readable JSON: {exc}") from None


SCALING_WORDS = {"strong": "strong scaling (global batch kept)",
                 "weak": "weak scaling (per-replica batch kept)",
                 "mixed": "batch sizes vary (neither weak nor strong scaling)",
                 "single point": "a single run"}


def parse_peak(text: str | None) -> float | None:
    """--peak-flops: a number of FLOP/s per device, or 'measure' (a one-thread fp32 matmul
    on this CPU, the peak of one local rank)."""
    if text is None:
        return None
    if text == "measure":
        from ddl.worker.mfu import measure_matmul_peak

        return measure_matmul_peak()
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"--peak-flops: {text!r} is not a positive number of FLOP/s per "
                         "device or 'measure'")
    return value
