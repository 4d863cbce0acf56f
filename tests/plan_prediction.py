"""`ddl plan`'s memory model applied to a finished run's layout, for comparison with what
the run measured (results.json ``memory_per_rank``): the test modules that already hold
results documents call :func:`predict` - no run of its own, only meta-device work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddl.contract.layout import ParallelLayout
from ddl.contract.plugins import Plugins
from ddl.planning import plan_probe


def _workload(plugin: str, preset: str, data_dir: Path):
    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets[preset])
    workload.datasets(data_dir)  # xsum reads its model config from the data directory
    return workload  # a fresh one per call: cutting pipeline stages changes its batches


def measured_batches(workload, data_dir: Path, results: dict[str, Any], dp_rank: int,
                     seed: int) -> list[tuple[Any, Any]]:
    """The micro-batches data-parallel share ``dp_rank`` trained on while the meter counted
    (the first two steps, or one), from the run's own loader
    (ddl.worker.train.loaders.train_loader, the
    same sampler, seed and epoch 1), through ``to_device`` as the run did it."""
    from ddl.worker.train.loaders import train_loader

    batch, world = results["batch"], results["world"]
    loader = train_loader(workload.datasets(data_dir)["train"], batch_size=batch["micro"],
                          replicas=world["dp_size"], rank=dp_rank, seed=seed, workers=0,
                          pin_memory=False)
    loader.sampler.set_epoch(1)
    # the meter counts the first two steps, or the one a one-step run has
    wanted = min(2, results.get("steps_per_epoch") or 2) * batch["accumulation_steps"]
    out = []
    for i, raw in enumerate(loader):
        if i == wanted:
            break
        out.append(plan_probe.device_batch(workload, raw))
    return out


def predict(plugin: str, preset: str, data_dir: Path, results: dict[str, Any], *,
            sync_bn: bool = False, seed: int | None = None) -> list[dict[str, int]]:
    """Per rank: the predicted model-state fields and ``saved_for_backward_bytes``, the most
    the rank holds for backward at once (ddl's meter: its high-water mark; under a
    pipeline, the micro-batches its schedule keeps in flight). ``sync_bn``: the run's
    ``--sync-bn``. A workload that trims its batches to their content (xsum) is predicted
    for the batches each rank measured (``seed``: the run's), not for the untrimmed bound
    `ddl plan` gives."""
    data_dir = Path(data_dir)
    workload = _workload(plugin, preset, data_dir)
    layout = ParallelLayout(**results["world"]["parallel"])
    report = results.get("strategy_report") or {}
    per_rank_stages = report.get("stages_per_rank", 1)
    microbatches = report.get("microbatches", 1) if layout.pp > 1 else 1
    model = plan_probe.meta_model(workload.build_model)
    states = plan_probe.model_state_per_rank(workload, model, layout,
                                             plan_probe.optimizer_cost(workload),
                                             per_rank_stages)
    n_stages = layout.pp * per_rank_stages
    if n_stages > 1:  # cutting sets what a pipeline's batches look like (xsum: untrimmed)
        workload.pipeline_stages(plan_probe.meta_model(workload.build_model), n_stages)

    def per_stage(inputs, targets) -> list[int]:
        return plan_probe.activation_bytes(
            workload, plan_probe.meta_model(workload.build_model), inputs, targets,
            tp=layout.tp, n_stages=n_stages, sync_bn=sync_bn,
            device_type=results["world"]["device"]).per_stage

    schedule = report.get("schedule", "gpipe")
    trimmed = getattr(workload, "trim_batches", False)
    if trimmed and seed is None:
        raise ValueError(f"{plugin} trims its batches: predict() needs the run's seed")
    if trimmed and n_stages > 1:
        raise ValueError(f"{plugin}: a pipeline was cut but its batches are still trimmed")
    fixed = None if trimmed else per_stage(*plan_probe.sample_batch(
        workload, data_dir, results["batch"]["micro"] // microbatches))
    by_share: dict[int, list[int]] = {}
    for rank, state in enumerate(states):
        if fixed is None:  # the largest of the batches this rank's share measured
            share = layout.dp_rank(rank)
            if share not in by_share:
                by_share[share] = max((per_stage(*b) for b in measured_batches(
                    workload, data_dir, results, share, seed)), key=lambda s: s[0])
            stages = by_share[share]
        else:
            stages = fixed
        state["saved_for_backward_bytes"] = round(plan_probe.rank_activation_bytes(
            schedule, layout, rank, microbatches, stages, per_rank_stages))
    return states
