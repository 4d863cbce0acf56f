"""``ddl plan --plugin P --preset X --site S --nodes N``: the layouts that fit, best first.

Every candidate (ddl.planning.layout_search) gets a predicted memory per device and step
time (ddl.planning.planner); those over the site's device memory, or that the workload cannot
split that way, are listed apart with the reason. Torch is imported only here, when the
command runs (the model is built on the meta device: no memory, seconds even for T5-3B).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

from ddl.commands import plan_job, plan_verify
from ddl.planning import plan_target
from ddl.contract.errors import UsageError
from ddl.planning.memory_model import size_text


def cmd_plan(ns: argparse.Namespace) -> int:
    from ddl.contract.plugins import Plugins
    from ddl.settings import batch
    from ddl.settings.sites import get_site

    from ddl.commands.flags import check_whole
    from ddl.launch.submit import MAX_NODES
    from ddl.settings.config import MAX_COUNT, MAX_NPROC

    # the bounds `ddl train` and `ddl submit` put on the same values: the search loops over
    # the divisors of the world and the batch, so a huge number would never end
    for flag, value, upper in (("--nodes", ns.nodes, MAX_NODES), ("--top", ns.top, MAX_COUNT),
                               ("--nproc", ns.nproc, MAX_NPROC),
                               ("--global-batch-size", ns.global_batch_size, MAX_COUNT),
                               ("--verify", ns.verify, MAX_COUNT)):
        check_whole(flag, value, upper)
    plan_job.check_flags(ns)
    if ns.save is not None:
        _check_save(ns.save)
    plugins = Plugins()
    site = get_site(ns.site, plugins)
    partition = _partition(site, ns.partition)
    target = plan_target.resolve(site, partition, ns.nodes, ns.nproc)  # CPU sites too
    spec = plugins.workload(ns.plugin)
    preset_name = ns.preset or spec.default_preset
    if preset_name not in spec.presets:
        raise UsageError(f"--preset: {spec.name} has no preset {preset_name!r}; allowed: "
                         f"{', '.join(spec.presets)}")
    preset = spec.presets[preset_name]
    world = ns.nodes * target.per_node
    global_batch = batch.global_batch(ns.global_batch_size, preset.batch_size,
                                      batch.planning_dp(world))  # the one rule
    if ns.submit and ns.verify is None:
        raise UsageError("--submit: submits the --verify runs as one Slurm job; allowed: "
                         "with --verify [K]")
    if ns.verify is not None and not ns.submit:  # refused here if this machine cannot
        plan_verify.check_runnable(target, ns.nodes, world, site)
    if ns.submit:  # everything the job needs is checked before the planning's minute
        job = plan_job.prepare(ns, site, partition, target.per_node)
    data_dir = Path(ns.data_dir or site.defaults.data_dir or "data")
    report = plan_layouts(spec, preset, site, target.per_node, world, global_batch, data_dir,
                          device_kind=target.device_kind, memory_bytes=target.memory_bytes,
                          sync_bn=ns.sync_bn, precision=ns.precision,
                          this_machine=target.device_kind == "cpu" and site.launcher == "local")
    report.update(plugin=spec.name, preset=preset_name, site=site.name, nodes=ns.nodes,
                  devices=target.devices, memory_source=target.memory_source)
    if ns.submit:  # --verify K --submit: the K best trained in one Slurm job (plan_job)
        report["verify_job"] = plan_job.submit(job, ns.dry_run)
    elif ns.verify is not None:  # --verify K: the K best trained here (plan_verify)
        report["verify"] = plan_verify.verify(report, ns.verify, spec, preset, target,
                                              data_dir, site)
    if ns.save:
        _save(report, ns.save)
    if ns.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render(report, ns.top), end="")
        if "verify" in report:
            print(plan_verify.render(report["verify"]), end="")
        if "verify_job" in report:
            print(plan_job.render(report["verify_job"]), end="")
    return plan_verify.exit_code(report["verify"]) if "verify" in report else 0


def _partition(site, name: str | None):
    """The partition ``--partition`` names (None: the site's default; a site without
    partitions, such as local, takes none): a name that is not the site's is refused, not
    ignored."""
    if name is not None and not name:
        raise UsageError("--partition: an empty name; allowed: a partition of the site "
                         "(leave the flag out for its default)")
    if not site.partitions:
        if name is not None:
            raise UsageError(f"--partition: {name[:40]!r}; site {site.name} has no "
                             "partitions (not a Slurm site); allowed: leave --partition out")
        return None
    return site.partition(name)[1]


def _check_save(path: Path) -> None:
    """``--save FILE`` refused before the planning when it could not be written."""
    import os

    text = str(path)
    shown = text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
    try:
        parent = path.resolve().parent
        usable = parent.is_dir() and not path.is_dir() and os.access(parent, os.W_OK)
        why = "" if usable else "; allowed: a file in an existing directory you can write"
        if usable and len(path.name.encode()) > 250:  # room for the .tmp beside it
            why = f"; allowed: a file name of at most 250 bytes (this one has " \
                  f"{len(path.name.encode())})"
    except OSError as exc:  # a path longer than the system takes
        why = f": {exc.strerror or exc}; allowed: a file in an existing directory you can write"
    if why:
        raise UsageError(f"--save: cannot write {shown}{why}")


def _save(report: dict, path: Path) -> None:
    """``--save FILE``: the report as JSON, written whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        text = str(path)
        shown = text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
        raise UsageError(f"--save: cannot write {shown}: {exc.strerror or exc}; allowed: a "
                         "file in an existing directory you can write") from None


def plan_layouts(spec, preset, site, gpus_per_node: int, world: int, global_batch: int,
                 data_dir: Path, *, device_kind: str | None = None,
                 memory_bytes: int | None = None, sync_bn: bool = False,
                 precision: str = "auto", this_machine: bool = False) -> dict:
    """Every candidate layout with its prediction: ``fits`` ranked best first, ``dropped``
    with the reason. ``device_kind`` and ``memory_bytes`` default to the site's GPUs (a
    local CPU run passes ``cpu`` and a rank's share of the machine's memory); ``sync_bn``:
    the runs use ``--sync-bn`` (a CPU's float64 BatchNorm keeps more for backward);
    ``precision``: the runs' ``--precision`` (auto: 16-bit autocast on GPUs, fp32 on CPUs);
    ``this_machine``: a CPU plan of processes on this machine, timed from its measured
    links, matmul rate and the workload's measured costs (ddl.planning.cpu_calibration)
    instead of ranked by bytes communicated."""
    from ddl.contract.context import RunContext
    from ddl.contract.layout import ParallelLayout
    from ddl.contract.world import World
    from ddl.planning import layout_search as search
    from ddl.planning import planner
    from ddl.planning.autocast_probe import planned_precision

    workload = spec.create(preset)
    import torch

    workload.context = RunContext(
        data_dir=data_dir, world=World(rank=0, local_rank=0, size=world,
                                       device=torch.device("cpu"), backend="gloo"),
        layout=ParallelLayout(dp_shard=world), epochs=preset.epochs,
        global_batch=global_batch, batch_per_replica=global_batch // world)
    device = planner.Device(device_kind or site.accelerator, gpus_per_node,
                            memory_bytes or site.device_memory_bytes,
                            site.device_peak_flops, site.intra_node_bytes_per_s,
                            site.inter_node_bytes_per_s, site.intra_node_latency_s,
                            site.inter_node_latency_s)
    if this_machine and device.kind == "cpu":
        device = _this_cpu(device, world)
    caps = spec.capabilities
    with tempfile.TemporaryDirectory(prefix="ddl-plan-") as tmp:
        from ddl.planning.plan_probe import batch_source

        source = batch_source(workload, data_dir, Path(tmp))
        computes_in = planned_precision(precision, device.kind)
        plan = planner.Planner(workload, source, device, sync_bn=sync_bn,
                               precision=computes_in)
        candidates = list(search.candidates(
            world, gpus_per_node, global_batch, tp_ok="tp_plan" in caps,
            pp_ok="pipeline_splits" in caps,
            # FSDP2 gathers in the compute dtype on GPUs; a CPU run keeps ddl's fp32
            computes_in=computes_in if device.kind != "cpu" else "fp32"))
        plan.calibrate_cpu(candidates)  # a CPU of this machine: the workload timed here
        predictions = [plan.predict(c, global_batch) for c in candidates]
    if not predictions:
        raise UsageError(f"--global-batch-size: {global_batch} does not split over any "
                         f"data-parallel degree of {world} GPUs; allowed: a multiple of "
                         f"{world}")
    timed = all(p.step_s is not None for p in predictions if not p.dropped)
    # without a peak FLOP rate and link speeds (a CPU, a site without them) the compute is
    # the same for every layout of the world: the bytes communicated rank them
    fits = sorted((p for p in predictions if not p.dropped),
                  key=lambda p: (p.step_s if timed else sum(p.comm_bytes.values()),
                                 # ties: fewer micro-steps, less recomputation, less memory
                                 p.candidate.accumulation,
                                 search.CHECKPOINTING.index(p.candidate.checkpointing),
                                 p.memory_bytes))
    return {"world": world, "gpus_per_node": gpus_per_node, "global_batch": global_batch,
            "sync_bn": sync_bn, "precision": precision, "computes_in": computes_in,
            "device_memory_bytes": memory_bytes or site.device_memory_bytes,
            "model": "ddl.planning.memory_model + ddl.planning.step_time_model "
                     "(docs/plan.md)",
            "ranked_by": "predicted step time" if timed else "bytes communicated per step",
            "fits": [p.as_dict() for p in fits],
            "dropped": [p.as_dict() for p in predictions if p.dropped]}


def _this_cpu(device, world: int):
    """``device`` with this machine's measured gloo links between ``world`` processes
    and one thread's matmul rate (cached per machine; measured once when missing:
    ddl.planning.cpu_calibration)."""
    import dataclasses
    import sys

    from ddl.planning import cpu_calibration

    def measure(n: int) -> dict:
        from ddl.commands import collective_probe

        print(f"ddl: note: measuring this machine's gloo links between {n} processes "
              f"(once; cached in {cpu_calibration.cache_dir() / cpu_calibration.CACHE_FILE}"
              "; `ddl doctor --collectives` refreshes it)", file=sys.stderr, flush=True)
        return collective_probe.measure(n, "gloo")

    if world > 1:
        fits, _ = cpu_calibration.links(world, measure)
    else:
        fits = {"all_reduce": {"latency_s": 0.0, "bytes_per_s": float("inf")}}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return dataclasses.replace(device, cpu_links=fits,
                               cpu_matmul_flops=cpu_calibration.matmul_flops(), cores=cores)


def render(report: dict, top: int) -> str:
    fits, dropped = report["fits"], report["dropped"]
    lines = [f"{report['plugin']} {report['preset']} on {report['site']}: {report['nodes']} "
             f"node(s) x {report['gpus_per_node']} {report.get('devices', 'GPUs')}, global "
             f"batch {report['global_batch']}, {size_text(report['device_memory_bytes'])} per "
             f"device ({report.get('memory_source', 'the site profile')})",
             ""]
    heads = ["#", "mesh", "micro", "accum", "ckpt", "memory/rank", "step (s)", "comm"]
    rows = [[str(i + 1), _mesh(p["mesh"]), str(p["micro_batch"]), str(p["accumulation"]),
             p["activation_checkpointing"], size_text(p["memory_per_rank_bytes"]),
             "-" if p["step_s"] is None else f"{p['step_s']:.3g}", _comm_share(p)]
            for i, p in enumerate(fits[:top])]
    if rows:
        widths = [max(len(r[k]) for r in [heads, *rows]) for k in range(len(heads))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                  for r in [heads, *rows]]
        lines.append(f"{len(fits)} layout(s) fit; best: ddl train "
                     + " ".join(fits[0]["flags"]))
    else:
        lines.append("no layout fits")
    if dropped:
        why = Counter(_reason(p["dropped"]) for p in dropped)
        lines += ["", f"dropped {len(dropped)}:"]
        lines += [f"  {n} x {reason}" for reason, n in why.most_common()]
        smallest = min((p for p in dropped if p["memory_per_rank_bytes"]),
                       key=lambda p: p["memory_per_rank_bytes"], default=None)
        if smallest and not fits:
            lines.append(f"  the smallest: {_mesh(smallest['mesh'])} needs "
                         f"{size_text(smallest['memory_per_rank_bytes'])}")
    return "\n".join(lines) + "\n"


def _comm_share(p: dict) -> str:
    """The share of the predicted step that waits for communication (step_time_model:
    what compute does not hide)."""
    timed = p.get("step_time")
    if not timed or not timed["step_s"]:
        return "-"
    exposed = timed.get("exposed_s", timed["comm_s"])
    waiting = sum(exposed.values()) + timed.get("sync_wait_s", 0.0)
    return f"{waiting / timed['step_s']:.0%}"


def _reason(text: str) -> str:
    return "over the device memory" if text.startswith("needs ") else text


def _mesh(degrees: dict[str, int]) -> str:
    return " x ".join(f"{d}={n}" for d, n in degrees.items() if n > 1) or "1 process"
