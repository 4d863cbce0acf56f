"""`ddl plan`'s memory model applied to a finished run's layout, for comparison with what
the run measured (results.json ``memory_per_rank``): the test modules that already hold
results documents call :func:`predict` - no run of its own, only meta-device work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddl.contract.layout import ParallelLayout
from ddl.contract.plugins import Plugins
from ddl.worker import plan_probe


def _workload(plugin: str, preset: str, data_dir: Path):
    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets[preset])
    workload.datasets(data_dir)  # xsum reads its model config from the data directory
    return workload  # a fresh one per call: cutting pipeline stages changes its batches


def predict(plugin: str, preset: str, data_dir: Path, results: dict[str, Any]
            ) -> list[dict[str, int]]:
    """Per rank: the predicted model-state fields and ``saved_for_backward_bytes`` as ddl's
    meter counts it (under a pipeline: summed over the step's micro-batches)."""
    workload = _workload(plugin, preset, Path(data_dir))
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
    inputs, targets = plan_probe.sample_batch(workload, Path(data_dir),
                                              results["batch"]["micro"] // microbatches)
    stages = plan_probe.activation_bytes(workload, plan_probe.meta_model(workload.build_model),
                                         inputs, targets, tp=layout.tp,
                                         n_stages=n_stages).per_stage
    for rank, state in enumerate(states):
        pp_rank = layout.coordinates(rank)["pp"]
        mine = range(pp_rank, n_stages, layout.pp)
        state["saved_for_backward_bytes"] = microbatches * sum(stages[i] for i in mine)
    return states
