"""`ddl plan`'s memory prediction beside what a kit run measured (issue 41: "on a GPU
machine the kit records predicted against measured device memory for its runs").

After a training check the kit asks `ddl plan` for the same plugin, preset, site, one
process and global batch, takes the row of the run's layout (one process, the run's
micro-batch, no activation checkpointing, the run's precision) and records its predicted
model state plus activations per rank (not the fixed runtime reserve) beside the measured
peak: torch's peak allocation on a GPU; on a CPU, where the process's resident set holds far
more than the model (Python, torch, the data), the model state plus the bytes held for
backward, the two parts the plan predicts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def compare(ddl: list[str], results_file: Path, *, site: str, data_dir: Path, env: dict,
            cwd: Path, timeout: float = 300) -> tuple[dict, str | None]:
    """(numbers, problem): ``plan_predicted_bytes``, ``plan_measured_bytes`` and their
    ratio ``plan_measured_over_predicted``; problem is a line when `ddl plan` failed or
    had no row for the run's layout (reported, not raised: the training check stands)."""
    r = json.loads(results_file.read_text())
    command = [*ddl, "plan", "--plugin", r["plugin"], "--preset", r["preset"], "--site", site,
               "--nproc", "1", "--global-batch-size", str(r["batch"]["global"]),
               "--data-dir", str(data_dir), "--format", "json", "--top", "1000",
               "--precision", r.get("precision") or "auto"]  # as the run computed
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, f"ddl plan took over {timeout:.0f} s"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {}, f"ddl plan failed: {tail[0]}"
    rows = json.loads(proc.stdout).get("fits", [])
    row = next((x for x in rows if x["micro_batch"] == r["batch"]["micro"]
                and x["activation_checkpointing"] == "none"), None)
    if row is None:
        return {}, f"ddl plan has no row for micro-batch {r['batch']['micro']}"
    mem = r["memory_per_rank"][0]
    measured = mem.get("device_peak_allocated_bytes")
    if measured is None:
        measured = mem["model_state_bytes"] + (mem.get("saved_for_backward_bytes") or 0)
    # the model state and activations: torch's allocator counts neither the CUDA context
    # nor the plan's fixed runtime reserve
    predicted = row["model_state_bytes"] + row["activation_bytes"]
    out = {"plan_predicted_bytes": predicted, "plan_measured_bytes": measured,
           "plan_measured_over_predicted": measured / predicted if predicted else None}
    out.update(peak_comparison(row.get("peak") or {}, mem))
    return out, None


def peak_comparison(parts: dict, mem: dict) -> dict:
    """Issue 51's predicted peak (ddl.planning.peak_model) against a GPU run: the plan's
    tensors (state, activations or the optimizer's temporaries, the backward's transient,
    communication buffers) against torch.cuda.max_memory_allocated; with the allocator's
    assumed slack against max_memory_reserved. The runtime outside the allocator (the CUDA
    context, NCCL; the plan's ``runtime_bytes``) is not in either counter: on the GPU the
    kit's driver-side number (nvidia-smi / torch.cuda.mem_get_info) is the check for it.
    Written without a GPU (none was lent while building it): reasoned, not yet run."""
    allocated, reserved = (mem.get("device_peak_allocated_bytes"),
                           mem.get("device_peak_reserved_bytes"))
    if not parts or allocated is None:
        return {}
    tensors = parts["tensors_bytes"]
    with_slack = tensors + parts["slack_bytes"]
    return {"peak_predicted_allocated_bytes": tensors,
            "peak_measured_allocated_bytes": allocated,
            "peak_allocated_measured_over_predicted": allocated / tensors if tensors else None,
            "peak_predicted_reserved_bytes": with_slack,
            "peak_measured_reserved_bytes": reserved,
            "peak_reserved_measured_over_predicted": (reserved / with_slack
                                                      if reserved and with_slack else None),
            "peak_predicted_runtime_bytes": parts["runtime_bytes"]}
