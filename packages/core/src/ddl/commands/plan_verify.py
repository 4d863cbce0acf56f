"""``ddl plan --verify [K]``: train the plan's K best layouts here, a few steps each, and set
what each run measured beside what the plan predicted (issue 41, item 5).

Each layout runs as a real ``ddl train`` in a subprocess of this installation (the plan's
own flags: ``--mesh``, micro-batch, checkpointing, pipeline micro-batches and schedule, with
the plan's global batch) for 4 epochs of 10 steps, in a temporary run directory that is
deleted afterwards. The numbers come from its results.json, as every run records them:

- model state: ``memory_per_rank[].model_state_bytes`` (the tensors each rank holds);
- activations: ``memory_per_rank[].saved_for_backward_bytes``, ddl's saved-tensor meter
  (ddl.worker.observe.activation_memory: the high-water mark of what the rank holds for backward,
  a pipeline's micro-batches in flight included); xsum trims each batch to its longest
  sequence where the plan predicts the untrimmed batch, a bound (ddl.planning.plan_probe);
- peak: on a GPU torch's peak allocation (``device_peak_allocated_bytes``) against the
  plan's tensors (its memory/rank adds the allocator's slack and the runtime, which the
  allocator does not see); on a CPU the process's peak resident set (``peak_rss_bytes``)
  less its baseline (``baseline_rss_bytes``: the resident set when the build began -
  Python, torch, gloo, the data), against the plan's peak less the interpreter baseline
  it measured while planning (ddl.planning.peak_model);
- step time: the median of the timed epochs (all but the warm-up first) per step,
  against the plan's ``step_s`` ("n/a" where the plan has none).

Predicted values are the fullest rank's (the plan's row: most model state + activations);
measured ones are the rank the run measured fullest by the same sum (``measured.rank``).

Which layouts: K distinct ones - the best row of each mesh in the plan's order first, and
only when there are fewer meshes than K the next rows (another micro-batch or checkpointing
mode of a mesh already chosen) - so the runs check the plan's ranking, not one mesh K
times. After the runs, ``order`` says whether the measured step times put the layouts in
the plan's order (``matches``), and how much slower than the measured fastest the plan's
first one ran (``first_over_fastest``).

All of a plan's layouts share one world size (nodes x processes per node), so either this
machine can run them all or none: a GPU plan needs that many GPUs here, on one node, or a
Slurm job of the plan's nodes on its site (``ddl plan --verify K --submit`` writes and
submits that job: commands/plan_job). Inside such a job each layout runs as an srun step
over the job's nodes (``ddl train --launcher srun``). A layout squeezed onto fewer ranks than it was planned for would be another layout (other
shards, other batches per rank), proving nothing about the plan, so that is refused in one
line before any planning, not run as a stand-in. On a CPU, any number of processes runs
here; a CPU plan of several nodes runs on this one machine (its memory is the same per
rank; its step times are not the site's, and a note says so).

No torch at module level (``ddl plan --help`` must stay fast).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError
from ddl.planning.memory_model import size_text

# The first epoch is warm-up. 10 steps: the saved-tensor meter (an epoch's first 2 steps)
# and the epoch's metric reduction weighed in a 3-step epoch's time (MNIST tiny DDP: 14 ms
# a step against ~6). The median of 3 timed epochs: one epoch varied ~30 % between runs on
# a 2-core host (CIFAR tiny DDP 25.7 and 33.9 ms), as much as the plan's 25 % bar.
EPOCHS, STEPS = 4, 10


def eval_samples(world: int) -> int:
    """What a verify run evaluates after each epoch: a few samples per rank. Nothing it
    reports comes from the evaluation (step time, memory), and the whole split cost more
    than the training (MNIST tiny on 2 CPU processes: 1.5 s against 0.2 s of 10 steps)."""
    return max(32, 2 * world)


def in_slurm_job(site, nodes: int) -> bool:
    """True in a Slurm job on ``site`` (``ddl plan --verify --submit``'s): the layouts then
    run as srun steps over the job's nodes. A job of another node count is refused: its
    layouts would be other layouts."""
    if not os.environ.get("SLURM_JOB_ID") or not site.uses_slurm:
        return False
    have = int(os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    if have != nodes:
        raise UsageError(f"--verify: this Slurm job has {have} node(s) and the plan is for "
                         f"{nodes}; allowed: --nodes {have} in this job, or --submit to get "
                         f"a job of {nodes}")
    return True


def check_runnable(target, nodes: int, world: int, site=None) -> None:
    """Refuse ``--verify`` when this machine cannot run the plan's layouts as planned."""
    if (site is not None and in_slurm_job(site, nodes)) or target.device_kind == "cpu":
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if nodes > 1 or world > have:
        where = f"{nodes} nodes x {world // nodes}" if nodes > 1 else f"{world}"
        raise UsageError(
            f"--verify: the plan's layouts run on {where} GPUs and this machine has {have}; "
            "a layout on fewer ranks is another layout, so none is run as a stand-in; "
            f"allowed: --verify on a machine with {world} GPUs (one node: --nodes 1, "
            "--nproc up to its GPUs), --submit to verify in one Slurm job of the site, or "
            "--site local to plan and verify this machine's CPU processes")


def verify(report: dict[str, Any], k: int, spec, preset, target, data_dir: Path,
           site=None) -> dict[str, Any]:
    """Train the ``k`` best of ``report["fits"]`` here (in a Slurm job of ``site``: over
    its nodes); per layout predicted and measured."""
    from ddl.planning.plan_probe import batch_source

    fits = report["fits"]
    picked = choose(fits, k)
    chosen = [fits[i] for i in picked]
    notes = []
    srun = srun_prefix(site, report) if site is not None and in_slurm_job(
        site, report["nodes"]) else None
    if len(fits) < k:
        notes.append(f"only {len(fits)} layout(s) fit: {len(chosen)} verified, not {k}")
    if srun:
        notes.append(f"ran as srun steps of Slurm job {os.environ['SLURM_JOB_ID']} "
                     f"({report['nodes']} node(s))")
    elif report["nodes"] > 1:
        notes.append(f"the {report['nodes']} nodes' {report['world']} processes ran on this "
                     "one machine: its memory per rank is the plan's, its step times are "
                     "not the site's")
    layouts = []
    with tempfile.TemporaryDirectory(prefix="ddl-plan-verify-") as tmp:
        data = batch_source(spec.create(preset), data_dir, Path(tmp) / "data")
        if data != data_dir:
            notes.append(f"no {report['plugin']} data in {data_dir}: the runs trained on a "
                         "synthetic stand-in in the same format (memory and time depend on "
                         "shapes, not values)")
        for i, row in enumerate(chosen):
            _note(f"--verify: layout {i + 1}/{len(chosen)}: ddl train "
                  + " ".join(row["flags"]))
            layouts.append({"plan_rank": picked[i] + 1, **measure(
                row, report, target.device_kind, data, Path(tmp) / f"layout-{i + 1}",
                srun=srun)})
    return {"requested": k, "device": target.device_kind, "processes": report["world"],
            "slurm_job": os.environ.get("SLURM_JOB_ID") if srun else None,
            "epochs": EPOCHS, "steps_per_epoch": STEPS, "layouts": layouts,
            "order": order(layouts, report.get("ranked_by", "the plan's order")),
            "notes": notes, "how": _how(target.device_kind)}


def choose(fits: list[dict[str, Any]], k: int) -> list[int]:
    """Indices of the ``k`` rows of ``fits`` (best first) to verify: the best row of each
    distinct mesh in the plan's order, then - only if there are fewer meshes than ``k`` -
    the remaining rows in the plan's order (other micro-batches, checkpointing modes)."""
    seen: set[tuple] = set()
    first, rest = [], []
    for i, row in enumerate(fits):
        mesh = tuple(sorted(row["mesh"].items()))
        (rest if mesh in seen else first).append(i)
        seen.add(mesh)
    return (first + rest)[:k]


def order(layouts: list[dict[str, Any]], ranked_by: str) -> dict[str, Any]:
    """Whether the measured step times order the verified layouts as the plan ranked them:
    ``predicted`` and ``measured`` list the layouts' numbers (1-based, as the table)
    fastest first; ``matches``; ``fastest`` the measured fastest; ``first_over_fastest``
    the plan's first layout's measured step over the fastest's (1.0: the plan's choice
    was the fastest). Layouts that did not finish are left out (``left_out``)."""
    timed = [(i + 1, row) for i, row in enumerate(layouts) if row.get("status") == "measured"
             and (row.get("measured") or {}).get("step_s")]
    predicted = [n for n, row in sorted(timed, key=lambda t: t[1].get("plan_rank", t[0]))]
    measured = [n for n, row in sorted(timed, key=lambda t: t[1]["measured"]["step_s"])]
    step = {n: row["measured"]["step_s"] for n, row in timed}
    out: dict[str, Any] = {"ranked_by": ranked_by, "predicted": predicted,
                           "measured": measured, "matches": None, "fastest": None,
                           "first_over_fastest": None,
                           "left_out": [i + 1 for i, row in enumerate(layouts)
                                        if i + 1 not in step]}
    if len(timed) >= 2:
        out.update(matches=predicted == measured, fastest=measured[0],
                   first_over_fastest=step[predicted[0]] / step[measured[0]])
    return out


def order_line(verified: dict[str, Any]) -> str:
    """The ``order`` verdict in one line."""
    o = verified.get("order")
    if not o or o["matches"] is None:
        return "order: fewer than 2 layouts with a measured step time; nothing to compare"

    def seq(ns):
        return " < ".join(f"#{n}" for n in ns)

    if o["matches"]:
        return (f"order: the measured step times match the plan's order ({seq(o['measured'])}"
                f", the plan ranked by {o['ranked_by']})")
    first = o["predicted"][0]
    slower = ("it was the fastest" if first == o["fastest"] else
              f"its first (#{first}) ran {o['first_over_fastest'] - 1:.0%} slower than the "
              f"fastest (#{o['fastest']})")
    return (f"order: measured {seq(o['measured'])}, not the plan's {seq(o['predicted'])} "
            f"(ranked by {o['ranked_by']}); {slower}")


def srun_prefix(site, report: dict[str, Any]) -> list[str]:
    """The srun that starts one layout's ranks over the job's nodes, one task per process,
    bound as ``ddl submit``'s jobs bind them."""
    from ddl.settings.cores import srun_cpu_bind

    per_node = report["world"] // report["nodes"]
    return ["srun", f"--nodes={report['nodes']}", f"--ntasks-per-node={per_node}",
            f"--cpu-bind={srun_cpu_bind(site, per_node)}", "--kill-on-bad-exit=1"]


def train_command(row: dict[str, Any], report: dict[str, Any], device_kind: str,
                  data_dir: Path, run_dir: Path, srun: list[str] | None = None) -> list[str]:
    """The ``ddl train`` that runs ``row``'s layout here, as the plan describes it: all
    ranks started locally, or under ``srun`` one per task (``--launcher srun``)."""
    launch = (["--launcher", "srun", "--nproc", str(report["world"] // report["nodes"])]
              if srun else ["--launcher", "local", "--nproc", str(report["world"])])
    return [*(srun or []), sys.executable, "-m", "ddl.commands.cli", "train",
            "--plugin", report["plugin"], "--preset", report["preset"],
            "--site", report["site"], *launch,
            "--device", "cpu" if device_kind == "cpu" else "cuda",
            "--global-batch-size", str(report["global_batch"]), *row["flags"],
            *(["--sync-bn"] if report.get("sync_bn") else []),
            "--precision", report.get("precision", "auto"),
            "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS),
            "--eval-samples", str(eval_samples(report["world"])),
            "--keep-checkpoints", "0", "--data-dir", str(data_dir),
            "--run-dir", str(run_dir)]


def measure(row: dict[str, Any], report: dict[str, Any], device_kind: str, data_dir: Path,
            run_dir: Path, srun: list[str] | None = None) -> dict[str, Any]:
    """One real run of ``row``'s layout: the plan's prediction and what the run measured
    (``status`` "measured"), or why it did not finish (``status`` "failed")."""
    out: dict[str, Any] = {key: row[key] for key in (
        "mesh", "micro_batch", "accumulation", "activation_checkpointing", "flags")}
    out["predicted"] = {key: row.get(key) for key in (  # step_time: the step's parts
        "model_state_bytes", "activation_bytes", "memory_per_rank_bytes", "peak", "step_s",
        "step_time")}
    proc = subprocess.run(train_command(row, report, device_kind, data_dir, run_dir, srun),
                          capture_output=True, text=True, errors="replace",
                          env=dict(os.environ))
    results_file = run_dir / "results.json"
    if proc.returncode != 0 or not results_file.exists():
        out.update(status="failed", measured=None,
                   why=f"exit code {proc.returncode}: {_last_line(proc)}")
        return out
    out.update(status="measured", why=None, measured=measured(json.loads(
        results_file.read_text()), row.get("pp_rank")))
    if out["measured"]["mesh"] != row["mesh"]:  # ddl train must run what the plan said
        out.update(status="failed", why=f"ran {out['measured']['mesh']}, not the plan's mesh")
    out["ratio"] = {key: _ratio(out["measured"][m], out["predicted"][p]) for key, m, p in (
        ("model_state", "model_state_bytes", "model_state_bytes"),
        ("activations", "activation_bytes", "activation_bytes"),
        ("step", "step_s", "step_s"))}
    out["ratio"]["peak"] = _ratio(*peak_pair(out["predicted"], out["measured"])[::-1])
    return out


def peak_pair(predicted: dict[str, Any], measured: dict[str, Any]) -> tuple[Any, Any]:
    """The peak as predicted and as measured, comparably (ddl.planning.peak_model): on a
    CPU both above the process's own baseline (the run's resident set when its build
    began, measured in the run and subtracted; the plan's peak less the interpreter
    baseline it measured while planning); on a GPU torch's allocated peak against the
    plan's tensors. A plan row without the parts: its memory per rank, the whole peak."""
    parts = predicted.get("peak") or {}
    if measured.get("peak_source") == "peak_rss_bytes":
        if parts and measured.get("peak_above_baseline_bytes") is not None:
            return parts["above_interpreter_bytes"], measured["peak_above_baseline_bytes"]
    elif parts:
        return parts["tensors_bytes"], measured.get("peak_bytes")
    return predicted["memory_per_rank_bytes"], measured.get("peak_bytes")


def measured(results: dict[str, Any], pp_rank: int | None = None) -> dict[str, Any]:
    """What a finished run measured on its fullest rank (results.json fields): of the
    ranks in the plan row's pipeline stage ``pp_rank`` (the stage of the rank the plan
    predicts fullest; None: all ranks), the one with the most model state + activations.
    (Not each field's largest over the ranks, nor the fullest of all stages: under a
    pipeline the first stage holds the most activations and the last may hold the most
    parameters, and a plan's row is one rank: CIFAR tiny at pp=2 compared the plan's
    first stage with the run's second, 52x its model state, 0.22x its activations.)"""
    from ddl.contract.layout import ParallelLayout

    ranks = results.get("memory_per_rank") or [{}]
    mesh = ParallelLayout(**results["world"]["parallel"])
    stage = [i for i in range(len(ranks)) if pp_rank is None or mesh.world_size !=
             len(ranks) or mesh.coordinates(i)["pp"] == pp_rank] or list(range(len(ranks)))
    rank = max(stage, key=lambda i: (ranks[i].get("model_state_bytes") or 0)
               + (ranks[i].get("saved_for_backward_bytes") or 0))
    fullest = ranks[rank]
    peak_key = ("device_peak_allocated_bytes" if "device_peak_allocated_bytes" in fullest
                else "peak_rss_bytes")
    steps = results.get("steps_per_epoch")
    epoch_s = timed_epoch_s(results)
    base = fullest.get("baseline_rss_bytes") if peak_key == "peak_rss_bytes" else None
    return {"mesh": results["world"]["parallel"], "rank": rank,
            "model_state_bytes": fullest.get("model_state_bytes"),
            "activation_bytes": fullest.get("saved_for_backward_bytes"),
            "peak_bytes": fullest.get(peak_key), "peak_source": peak_key,
            "baseline_bytes": base,
            "peak_above_baseline_bytes": (fullest[peak_key] - base
                                          if base is not None and fullest.get(peak_key)
                                          else None),
            "peak_reserved_bytes": fullest.get("device_peak_reserved_bytes"),
            "step_s": epoch_s / steps if epoch_s and steps else None}


def timed_epoch_s(results: dict[str, Any]) -> float | None:
    """The median time of the run's timed epochs (not the warm-up), else the summary's."""
    import statistics

    timed = [e["time_s"] for e in results.get("epochs") or []
             if not e.get("warmup") and e.get("time_s")]
    if timed:
        return statistics.median(timed)
    return (results.get("summary") or {}).get("epoch_time_s")


def exit_code(verified: dict[str, Any]) -> int:
    """1 when a layout the plan says fits did not train (the output says which), else 0."""
    return 1 if any(row["status"] != "measured" for row in verified["layouts"]) else 0


def render(verified: dict[str, Any]) -> str:
    rows, lines = verified["layouts"], [""]
    lines.append(f"verify: {len(rows)} layout(s) trained here ({verified['processes']} "
                 f"{verified['device']} processes, {verified['epochs']} epochs x "
                 f"{verified['steps_per_epoch']} steps); predicted / measured on the "
                 "fullest rank")
    heads = ["#", "plan #", "mesh", "micro", "accum", "ckpt", "model state", "activations",
             "peak", "step (s)"]
    table = [heads]
    for i, row in enumerate(rows):
        p, m = row["predicted"], row["measured"] or {}
        table.append([str(i + 1), str(row.get("plan_rank", "-")), _mesh(row["mesh"]),
                      str(row["micro_batch"]),
                      str(row["accumulation"]), row["activation_checkpointing"],
                      _pair(p["model_state_bytes"], m.get("model_state_bytes"), _bytes),
                      _pair(p["activation_bytes"], m.get("activation_bytes"), _bytes),
                      _pair(*peak_pair(p, m), _bytes),
                      _pair(p["step_s"], m.get("step_s"), _seconds)])
    widths = [max(len(r[k]) for r in table) for k in range(len(heads))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines += [f"  #{i + 1} {row['status']}: {row['why']}" for i, row in enumerate(rows)
              if row["status"] != "measured"]
    if "order" in verified:
        lines.append(order_line(verified))
    lines += [f"  {text}" for text in verified["how"] + verified["notes"]]
    return "\n".join(lines) + "\n"


def _how(device_kind: str) -> list[str]:
    peak = ("peak: torch's peak allocation against the plan's tensors (model state, "
            "activations, the backward's transient or the optimizer's temporaries, "
            "communication buffers); the plan's memory/rank adds the allocator's slack and "
            "the runtime (context, NCCL), which the allocator does not see"
            if device_kind != "cpu" else
            "peak: above each process's own baseline: measured, the peak resident set less "
            "the resident set when the model's build began (Python, torch, gloo and the "
            "data: subtracted); predicted, the plan's peak less the interpreter baseline it "
            "measured while planning (ddl.planning.peak_model)")
    return ["activations: measured by ddl's saved-tensor meter (the most a rank held for "
            "backward); a workload that trims its batches (xsum) measures below the plan's "
            "bound", peak,
            "step: the median over the timed epochs (all but the first) of the time per step; "
            "n/a where the plan has no step time"]


def _pair(predicted, measured, fmt) -> str:
    return f"{fmt(predicted)} / {fmt(measured)}"


def _bytes(n: int | None) -> str:
    return "n/a" if n is None else size_text(n)


def _seconds(s: float | None) -> str:
    return "n/a" if s is None else f"{s:.3g}"


def _ratio(measured_value, predicted_value) -> float | None:
    if measured_value is None or not predicted_value:
        return None
    return measured_value / predicted_value


def _mesh(degrees: dict[str, int]) -> str:
    return ",".join(f"{d}={n}" for d, n in degrees.items() if n > 1) or "1 process"


def _last_line(proc: subprocess.CompletedProcess) -> str:
    """The run's own account of why it stopped: its ``ddl: error:`` line, else its last."""
    text = [line.strip() for line in (proc.stderr + "\n" + proc.stdout).splitlines()
            if line.strip()]
    errors = [line for line in text if line.startswith("ddl: error:")]
    return (errors or text or ["no output"])[-1][:300]


def _note(text: str) -> None:
    print(f"ddl: note: {text}", file=sys.stderr, flush=True)
