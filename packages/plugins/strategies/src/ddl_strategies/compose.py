"""One recipe for every parallel layout: pipeline, tensor parallel, FSDP/HSDP, DDP.

A run's layout (ddl.contract.layout.ParallelLayout: pp x dp_replicate x dp_shard x tp) is
built into the model in one fixed order, after torchtitan's ``parallelize`` functions:

1. **pipeline** (pp > 1): the workload cuts the model into stages (``pipeline_stages``);
   this rank keeps only its own (ddl_strategies.pipeline).
2. **tensor parallel** (tp > 1): every kept module's big matrices are split over the
   layout's ``tp`` ranks by the workload's plan (ddl_strategies.tp).
3. **data parallel** (dp_replicate x dp_shard > 1):
   - FSDP2 over ``dp_shard`` (ddl_strategies.fsdp), HSDP over ``(dp_replicate, dp_shard)``
     when both are > 1 - and also when the layout replicates only but splits the model
     another way too (tp or pp): FSDP2 then keeps whole replicas (a shard group of one)
     and all-reduces their gradients, which DDP cannot do on DTensor or stage modules;
   - DDP when the layout only replicates (ddl_strategies.ddp).
4. **schedule** (pp > 1): the stages go into torch's pipeline schedule.

Every module applies to the output of the one before: tensor parallel turns a stage's
weights into DTensors on the ``tp`` slice, FSDP shards those once more along the data-
parallel slice. All slices come from one DeviceMesh over the four dimensions
(``ParallelLayout.device_mesh``), so a rank's tp, dp and pp groups always agree with the
layout's rank order. ``--mesh pp=2,tp=2,dp_shard=2`` thus needs no class of its own: this
one is ``--strategy mesh``, which ``ddl train`` picks when ``--mesh`` is given without
``--strategy``; ddp, fsdp, tp, fsdp+tp and pp are the same class with a default layout
(ddl_strategies.shorthands).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddl.contract.errors import UsageError
from ddl.contract.layout import MESH_ALLOWED, MESH_DP_MEANS, MESH_FILL
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl_strategies import ddp, fsdp, pipeline


class MeshStrategy(Strategy):
    name = "mesh"
    mesh_dims = MESH_ALLOWED
    dp_means = MESH_DP_MEANS
    layout_fill = MESH_FILL  # what --mesh leaves open is FSDP-sharded
    uses_microbatches = True
    options_help = {**ddp.OPTIONS_HELP, **fsdp.OPTIONS_HELP, **pipeline.OPTIONS_HELP}

    def __init__(self, options: dict[str, str] | None = None) -> None:
        super().__init__(options)
        fsdp.check_options(self.options)
        if set(self.options) & set(pipeline.OPTIONS_HELP):
            pipeline.schedule_choice(self.options)
        self.pipeline: pipeline.Pipeline | None = None

    # --- what the layout asks of the workload ------------------------------------------
    @property
    def replicate_only(self) -> bool:
        """Plain DDP: whole replicas, nothing else split."""
        p = self.parallel
        return p.dp_replicate > 1 and p.dp_shard == p.tp == p.pp == 1

    @property
    def shards_data(self) -> bool:
        """FSDP2 (or HSDP) over the data-parallel slice of the mesh."""
        return self.parallel.dp > 1 and not self.replicate_only

    def check(self, workload: Workload, world: World) -> None:
        p, config = self.parallel, self.config
        if p.pp > 1:  # first: no model needed to tell
            pipeline.check_precision(getattr(config, "precision", "fp32"), world)
        if p.tp > 1 and not _declares(workload, "tp_plan"):
            raise UsageError(f"--mesh: tp={p.tp} needs a workload with a tensor-parallel plan "
                             "(tp_plan); this one has none; allowed: tp=1")
        if p.pp > 1 and not (_declares(workload, "pipeline_stages") or
                             _declares(workload, "pipeline_splits")):
            raise UsageError(f"--mesh: pp={p.pp} needs a workload with pipeline split points "
                             "(pipeline_splits); this one has none; allowed: pp=1")
        if p.pp == 1 and getattr(config, "microbatches", None):
            raise UsageError(f"--microbatches: {self.name} with {p.describe()} has no pipeline; "
                             "microbatches are for layouts with pp >= 2")
        self.workload = workload  # wrap() asks it for units, plans and stages

    def check_model(self, model: nn.Module, workload: Workload) -> None:
        """Before workers start (the model on the meta device): heads tensor parallel
        must divide, split points the pipeline needs (the workload raises, naming them)."""
        p = self.parallel
        if p.tp > 1:
            workload.prepare_tensor_parallel(model, p.tp)
        if p.pp > 1:
            try:
                workload.pipeline_stages(model, p.pp * pipeline.schedule_choice(self.options)[1])
            except UsageError as exc:
                raise UsageError(f"--mesh: pp={p.pp}: {exc}") from None

    def check_layout(self, layout: Any) -> None:
        if self.parallel.pp == 1:
            return
        _, v = pipeline.schedule_choice(self.options)
        self.microbatches = self.config.microbatches or 2 * self.parallel.pp * v
        if layout.batch_per_replica % self.microbatches:
            raise UsageError(f"--microbatches: {self.microbatches} does not divide the batch of "
                             f"{layout.batch_per_replica}; use a divisor of the batch")

    # --- building ----------------------------------------------------------------------
    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        p, workload = self.parallel, self.workload
        if world.size == 1:  # nothing to split: the model as a single process trains it
            return model.to(world.device)
        if self.replicate_only:
            return ddp.replicate(model, world, self.option_number("bucket_cap_mb", 25.0))
        mesh = p.device_mesh(world.device.type)
        units = workload.fsdp_units(model)  # of the whole model, before any cut
        plan = workload.tp_plan(model) if p.tp > 1 else {}
        if p.pp > 1:
            schedule, v = pipeline.schedule_choice(self.options)
            n_stages = p.pp * v
            stage_ids = pipeline.my_stage_ids(p.coordinates(world.rank)["pp"], p.pp, n_stages)
            stages = workload.pipeline_stages(model, n_stages)
            parts = [stages[i] for i in stage_ids]
        else:
            parts = [model]
        for part in parts:
            part.to(world.device)
            if p.tp > 1:
                from ddl_strategies.tp import apply_tensor_parallel

                apply_tensor_parallel(part, workload, mesh["tp"], plan)
            if self.shards_data:
                held = {id(m) for m in part.modules()}
                dp_mesh = mesh["dp_shard"] if p.dp_replicate == 1 else \
                    mesh["dp_replicate", "dp_shard"]
                fsdp.shard(part, [u for u in units if id(u) in held], dp_mesh,
                           reshard=self.reshard, options=self.options)
        if p.pp == 1:
            return model
        self.pipeline = pipeline.Pipeline(
            parts, stage_ids, n_stages, schedule=schedule, microbatches=self.microbatches,
            loss_fn=workload.loss, world=world, pp=p.pp, pp_group=mesh["pp"].get_group())
        return nn.ModuleList(parts)

    @property
    def reshard(self) -> bool:
        return self.option_flag("reshard_after_forward", True)

    # --- running -----------------------------------------------------------------------
    def train_step(self, model, batch, workload, optimizer, precision):
        if self.pipeline is None:
            return super().train_step(model, batch, workload, optimizer, precision)
        loss, output, norm = self.pipeline.train_step(
            batch, optimizer, precision, getattr(self.config, "clip_grad_norm", None))
        if norm is not None:
            self.record_grad_norm(norm)
        return loss, output

    def eval_step(self, model, inputs, targets, workload, precision):
        if self.pipeline is None:
            return super().eval_step(model, inputs, targets, workload, precision)
        return self.pipeline.eval_step(inputs, targets, precision)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # DDP's forward would sync buffers every call: wasted when no gradients follow
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    def generation_model(self, model: nn.Module, world: World) -> nn.Module | None:
        """Replicas: the model itself. Tensor parallel alone: None (generate on the sharded
        model, all ranks on the same inputs; a gathered copy would cost a whole model per
        rank). Otherwise a plain copy gathered from the shards or stages
        (ddl_strategies.gathered)."""
        from ddl_strategies.gathered import gathered_copy, plain_copy

        p = self.parallel
        if p.world_size == 1 or self.replicate_only:
            return model
        if p.pp > 1:
            return plain_copy(self.workload, self.full_state_dict(model), world.device)
        if p.tp > 1 and p.dp == 1:
            return None
        return gathered_copy(self.workload, model, world.device)

    # --- results -----------------------------------------------------------------------
    def checkpoint_name(self, fqn: str) -> str:
        # A pipeline rank's model is a ModuleList of its stages ("0.", "1." prefixes); each
        # stage keeps the full model's names below that.
        return fqn.split(".", 1)[1] if self.parallel.pp > 1 else fqn

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        if self.pipeline is not None:
            return self.pipeline.full_state_dict(model)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # A collective: every rank takes part; with cpu_offload only rank 0 keeps the result.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)

    def report(self, world: World) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.shards_data:
            out.update(fsdp.report(self.options, self.reshard))
        if self.pipeline is not None:
            out.update(self.pipeline.report(), dp=self.parallel.dp)
        return out


def _declares(workload: Workload, hint: str) -> bool:
    """Whether the workload overrides the hint ``hint`` of the Workload interface."""
    return getattr(type(workload), hint, None) not in (None, getattr(Workload, hint))
