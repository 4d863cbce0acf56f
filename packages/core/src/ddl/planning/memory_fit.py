"""Will the model's state fit a GPU of the site under the job's layout? Checked by
``ddl submit`` before the queue, without torch (``--dry-run`` stays fast): from the
parameter count a preset declares (``Preset.parameters``) and the bytes each parameter
costs in training (fp32 weights and gradients, and an Adam-like optimizer's two fp32
moments: 16 bytes), divided by the degrees that split the model, plus the runtime
reserve of the device kind (ddl.planning.memory_model). Activations come on top; a layout
refused here would not fit with any batch. ``ddl plan`` predicts all of it (docs/plan.md).
"""

from __future__ import annotations

from typing import Any

from ddl.contract.errors import UsageError
from ddl.contract.layout import MESH_ALLOWED, MESH_DP_MEANS, MESH_FILL, resolve
from ddl.settings.config import RunConfig
from ddl.planning.memory_model import GIB, RUNTIME_RESERVE_BYTES
from ddl.settings.sites import SiteProfile

TRAINING_BYTES_PER_PARAMETER = 4 + 4 + 8  # weights, gradients, Adam's two moments (fp32)


def split_degree(config: RunConfig, world: int) -> int | None:
    """How many ways the job's layout splits each parameter (FSDP shards, tensor and
    pipeline parallel), or None where that needs the strategy's own rules (torch)."""
    if config.strategy == "ddp":
        return 1
    if config.strategy == "fsdp" and not config.mesh:
        return world
    if config.strategy == "mesh":
        layout = resolve(config.mesh, world, strategy="mesh", allowed=MESH_ALLOWED,
                         dp_means=MESH_DP_MEANS, fill=MESH_FILL)
        return layout.dp_shard * layout.tp * layout.pp
    return None


def per_gpu(parameters: int, split: int, site: SiteProfile) -> int:
    return (parameters * TRAINING_BYTES_PER_PARAMETER // split
            + RUNTIME_RESERVE_BYTES.get(site.accelerator, 0))


def check(config: RunConfig, preset: Any, preset_name: str, site: SiteProfile,
          world: int) -> None:
    """UsageError (one line) when the model state alone exceeds the site's GPU memory."""
    parameters = getattr(preset, "parameters", None)
    device = site.device_memory_bytes
    if not parameters or not device or site.accelerator == "cpu" or config.device == "cpu":
        return
    split = split_degree(config, world)
    if split is None:
        return
    need = per_gpu(parameters, split, site)
    if need <= device:
        return
    sharded = per_gpu(parameters, world, site)
    fix = (f"a layout that shards it, e.g. --strategy fsdp ({_gib(sharded)} per GPU on these "
           f"{world} GPUs)" if sharded <= device and split < world else
           f"more GPUs: sharded over all {world} it still needs {_gib(sharded)} per GPU")
    raise UsageError(
        f"--strategy {config.strategy}: {config.plugin} {preset_name} ({parameters / 1e9:.2f}B "
        f"parameters) needs about {_gib(need)} per GPU for its training state alone "
        f"({TRAINING_BYTES_PER_PARAMETER} bytes a parameter, split {split} ways, plus the "
        f"runtime reserve); a {site.name} GPU has {_gib(device)}; allowed: {fix}; "
        f"`ddl plan --plugin {config.plugin} --preset {preset_name} --site {site.name}` "
        "ranks the layouts; --force submits anyway")


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"
