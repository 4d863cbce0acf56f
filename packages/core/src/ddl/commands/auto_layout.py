"""``ddl train --mesh auto``: train with the layout ``ddl plan`` ranks first.

The planner (ddl.commands.plan, docs/plan.md) ranks every layout of the run's processes
with its memory and step-time models; the best one that fits becomes the run's ``--mesh``,
micro-batch (``--batch-size``, with the global batch kept) and activation checkpointing,
and its prediction goes into the plan and results.json (``plan.predicted``) beside what
the run then measures. On a CPU (a local run) a "device" is a rank's share of the memory
the machine has available, and the step times come from this machine's measured gloo links
and the workload timed here (ddl.planning.cpu_calibration); a CPU run elsewhere (srun) is
ranked by the bytes its layouts communicate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError
from ddl.contract.host_memory import available_bytes


def choose(plan, plugins) -> Any:
    """``plan`` with the best layout applied (config) and its prediction (``predicted``)."""
    from ddl.commands.plan import plan_layouts
    from ddl.settings import batch
    from ddl.settings.config import preset_name

    config, site = plan.config, plan.site
    if config.strategy != "mesh":
        raise UsageError(f"--mesh auto: --strategy {config.strategy} has a layout of its own; "
                         "allowed: --mesh auto without --strategy (or --strategy mesh)")
    spec = plugins.workload(config.plugin)
    name = preset_name(config, spec)
    preset = spec.presets[name]
    world, per_node = plan.world_size, plan.nproc_per_node
    # the one rule (ddl.settings.batch), at the layout the search starts from; every
    # candidate then trains this global batch, its fewer replicas each a larger share
    global_batch = batch.global_batch(config.global_batch_size,
                                      config.batch_size or preset.batch_size,
                                      batch.planning_dp(world))
    gpu = site.accelerator != "cpu" and config.device != "cpu"
    memory = site.device_memory_bytes if gpu else available_bytes() // per_node
    if not memory:
        raise UsageError(f"--mesh auto: site {site.name} gives no device memory "
                         "(device_memory_bytes); allowed: an explicit --mesh")
    report = plan_layouts(spec, preset, site, per_node, world, global_batch,
                          Path(config.data_dir), device_kind=site.accelerator if gpu else "cpu",
                          memory_bytes=memory, sync_bn=config.sync_bn,
                          precision=config.precision,
                          this_machine=not gpu and plan.launcher == "local")
    if not report["fits"]:
        why = report["dropped"][0]["dropped"] if report["dropped"] else "no layout"
        raise UsageError(f"--mesh auto: no layout of {world} processes fits ({why}); "
                         "allowed: more processes, a smaller --global-batch-size")
    best = report["fits"][0]
    update = {"mesh": best["mesh"], "batch_size": best["micro_batch"],
              "global_batch_size": global_batch,
              "activation_checkpointing": best["activation_checkpointing"]}
    if best["pipeline_microbatches"]:  # the schedule the prediction assumed
        update["microbatches"] = best["pipeline_microbatches"]
    if best.get("strategy_options"):  # its schedule, FSDP2's mixed precision
        update["strategy_options"] = {**config.strategy_options, **best["strategy_options"]}
    predicted = {key: best[key] for key in (
        "mesh", "micro_batch", "accumulation", "activation_checkpointing",
        "memory_per_rank_bytes", "model_state_bytes", "activation_bytes", "step_s")}
    # whose numbers those are: the fullest rank's, a rank of this pipeline stage (under
    # pp the stages hold different shares of the model)
    predicted["pp_rank"] = best.get("pp_rank", 0)
    predicted.update(device_memory_bytes=memory, candidates=len(report["fits"]),
                     dropped=len(report["dropped"]), ranked_by=report["ranked_by"])
    return plan.model_copy(update={"config": config.model_copy(update=update),
                                   "predicted": predicted})
