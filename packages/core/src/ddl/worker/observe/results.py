"""results.json: one run's configuration, measurements and outcome in one document.

``assemble`` is a function of what the trainer measured and gathered (it runs no collective
and touches no model), so every field's source is visible in its argument list. The fields
and their meanings are documented in docs/results.md; tools (``ddl report``, the scaling
plots) read them, so a change here is a change of a public format.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ddl.contract.plugins import Plugins
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.settings import rundir
from ddl.settings.config import RunConfig
from ddl.worker import mfu
from ddl.worker.observe import container_record
from ddl.worker.checkpointing.checkpoint import TrainerState
from ddl.worker.train.setup import TrainingNumbers

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
#: results.json's ``environment``: the variables that steer the collectives and the GPU
#: libraries (what a site profile's [env] sets, in the batch script or, for a hand-written
#: srun, in the job: ddl.launch.site_env.in_job), as rank 0 had them.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "RCCL_", "GLOO_", "UCX_", "FI_", "CXI_", "HSA_",
                "MIOPEN_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {name: value for name, value in sorted(env.items())
            if name.startswith(ENV_PREFIXES) or name in ENV_NAMES}


def assemble(*, config: RunConfig, world: World, plugins: Plugins, workload: Workload,
             numbers: TrainingNumbers, data_dir: Path, precision: str, loader_workers: int,
             parameters: int, epochs: list[dict[str, Any]], val: dict[str, float],
             test: dict[str, float], started: float, finished: float,
             memory: list[dict[str, Any]], latest_checkpoint: Path | None,
             resumed_from: Path | None, resumed: TrainerState | None,
             strategy_report: dict[str, Any], utilisation: list[dict[str, Any]],
             profile: list[dict[str, Any]] | None, peak_flops: float | None,
             parallel: dict[str, int] | None = None,
             compiled: dict[str, Any] | None = None,
             threads: dict[str, Any] | None = None,
             command: list[str] | None = None, tf32: bool = False,
             checkpoint_stall: dict[str, Any] | None = None,
             predicted: dict[str, Any] | None = None,
             peak_accelerator: str | None = None) -> dict[str, Any]:
    """The results.json document. ``started``/``finished`` are ``time.time()`` values;
    ``memory``, ``utilisation`` and ``profile`` hold one entry per rank."""
    summary = _summary(epochs)
    versions = rundir.versions()
    versions["plugins"] = _plugin_versions(config, plugins)
    results = {
        "ddl_version": __import__("ddl").__version__,
        "versions": versions,
        "started_at": time.strftime(TIME_FORMAT, time.localtime(started)),
        "finished_at": time.strftime(TIME_FORMAT, time.localtime(finished)),
        "wall_time_s": finished - started,
        "command": command or sys.argv,  # the user's, from the plan
        "container": container_record.record(),  # the image it ran in, or None
        "environment": environment(),
        "plugin": config.plugin, "strategy": config.strategy, "site": config.site,
        "preset": numbers.preset,
        "data": {"dir": str(data_dir.resolve()), "synthetic": workload.is_synthetic(data_dir)},
        "world": {"size": world.size, "dp_size": numbers.dp_size, "backend": world.backend,
                  "device": world.device.type, "parallel": parallel or {}},
        "precision": precision,
        "tf32": tf32,
        "loader_workers": loader_workers,
        "threads": threads or {},
        "batch": {"per_replica": numbers.batch_per_replica, "global": numbers.global_batch,
                  "micro": numbers.micro_batch, "accumulation_steps": numbers.accumulation},
        "lr": {"base": numbers.base_lr, "scaled": numbers.lr, "scaling": config.lr_scaling,
               "warmup_epochs": config.warmup_epochs, "warmup_steps": config.warmup_steps,
               "schedule": config.lr_schedule},
        "steps_per_epoch": numbers.steps_per_epoch,
        "activation_checkpointing": config.activation_checkpointing,
        "compile": compiled or {"enabled": False},
        "epochs": epochs,
        "summary": summary,
        # rank 0's split of a step (ddl.worker.observe.step_breakdown), from the last measured epoch
        "step_breakdown": next((e["step_breakdown"] for e in reversed(epochs)
                                if not e["warmup"] and "step_breakdown" in e),
                               epochs[-1].get("step_breakdown")),
        "final": {"val": val, "test": test},
        "parameters": parameters,  # of the whole model, whatever the strategy
        "model_file": rundir.MODEL,
        "memory_per_rank": memory,
        "checkpoints": {
            "latest": str(latest_checkpoint or ""), "keep": config.keep_checkpoints,
            "every_steps": config.checkpoint_every,
            # how long saves held the training loop up (rank 0;
            # ddl.worker.checkpointing.checkpoint_writer)
            "asynchronous": config.async_checkpoint, "stall": checkpoint_stall or {},
            "resumed_from": ({"checkpoint": str(resumed_from), "step": resumed.step,
                              "saved_by_world_size": resumed.world_size}
                             if resumed else None)},
        # set by Slurm (--requeue) and torch's elastic agent (--max-restarts) respectively
        "restarts": {"slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                     "worker_restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))},
        "strategy_report": strategy_report,
        "utilisation": utilisation,
    }
    if profile is not None:
        results["profile"] = profile
    if predicted is not None:  # --mesh auto: ddl plan's prediction, beside what was measured
        results["plan"] = {"predicted": predicted}
    peak, source = mfu.site_peak(peak_flops, config.site, peak_accelerator, world.device.type)
    results["mfu"] = mfu.summary(workload.flops_per_sample(), summary["samples_per_s"],
                                 world.size, peak, source)
    return results


def _summary(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Epoch time and throughput over the measured epochs: all but the run's first (warm-up)
    one, or that one alone when it is all there is."""
    measured = [e for e in epochs if not e["warmup"]] or epochs
    seconds = sum(e["time_s"] for e in measured)
    return {
        "epoch_time_s": seconds / len(measured),
        "samples_per_s": sum(e["samples"] for e in measured) / seconds,
        "epochs_measured": [e["epoch"] for e in measured],
        "first_epoch_excluded": len(epochs) > 1,
    }


def _plugin_versions(config: RunConfig, plugins: Plugins) -> dict[str, str]:
    """The distributions that supplied the workload and strategy, with their versions."""
    return {role: plugins.version_of(spec.plugin) or spec.plugin
            for role, spec in (("workload", plugins.workload(config.plugin)),
                               ("strategy", plugins.strategy(config.strategy)))}
