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
parallel slice. All slices come from the run's one DeviceMesh over the four dimensions,
built once by the worker (ddl.worker.process.mesh.build) and handed in as
``StrategyContext.mesh``, so a rank's tp, dp and pp groups always agree with the layout's
rank order and with the data loaders'. ``--mesh pp=2,tp=2,dp_shard=2`` thus needs no class of its own: this
one is ``--strategy mesh``, which ``ddl train`` picks when ``--mesh`` is given without
``--strategy``; ddp, fsdp, tp, fsdp+tp and pp are the same class with a default layout
(ddl_strategies.shorthands).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddl.contract.errors import DdlError, UsageError
from ddl.contract.layout import MESH_ALLOWED, MESH_DP_MEANS, MESH_FILL
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.contract.workload import Workload
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
            pipeline.bubble_steps(self.options)

    # --- what the layout asks of the workload ------------------------------------------
    def check(self, run: StrategyContext) -> None:
        super().check(run)
        self.option_number("bucket_cap_mb", 25.0, above=0)  # DDP's buckets (before workers)
        p, workload = run.layout, run.workload
        if p.pp > 1:  # first: no model needed to tell
            pipeline.check_precision(run.precision)
        if p.tp > 1 and not _declares(workload, "tp_plan"):
            raise UsageError(f"--mesh: tp={p.tp} needs a workload with a tensor-parallel plan "
                             "(tp_plan); this one has none; allowed: tp=1")
        if p.pp > 1 and not (_declares(workload, "pipeline_stages") or
                             _declares(workload, "pipeline_splits")):
            raise UsageError(f"--mesh: pp={p.pp} needs a workload with pipeline split points "
                             "(pipeline_splits); this one has none; allowed: pp=1")
        if p.pp == 1 and run.microbatches:
            raise UsageError(f"--microbatches: {self.name} with {p.describe()} has no pipeline; "
                             "microbatches are for layouts with pp >= 2")

    def check_model(self, model: nn.Module, run: StrategyContext) -> None:
        """Before workers start (the model on the meta device): heads tensor parallel
        must divide, split points the pipeline needs (the workload raises, naming them)."""
        p = run.layout
        if p.tp > 1:
            run.workload.prepare_tensor_parallel(model, p.tp)
        if p.pp > 1:
            try:
                run.workload.pipeline_stages(model, self._stages(run))
            except UsageError as exc:
                raise UsageError(f"--mesh: pp={p.pp}: {exc}") from None

    def check_layout(self, run: StrategyContext, batch: Any) -> None:
        # the schedule splits what one forward gets: the micro-batch when accumulating
        if run.layout.pp > 1 and batch.micro_batch % self._microbatches(run):
            raise UsageError(f"--microbatches: {self._microbatches(run)} does not divide the "
                             f"batch of {batch.micro_batch} per forward pass; use a divisor "
                             "of it")

    def _stages(self, run: StrategyContext) -> int:
        return run.layout.pp * pipeline.schedule_choice(self.options)[1]

    def _microbatches(self, run: StrategyContext) -> int:
        return run.microbatches or 2 * self._stages(run)

    @staticmethod
    def _replicate_only(run: StrategyContext) -> bool:
        """Plain DDP: whole replicas, nothing else split."""
        p = run.layout
        return p.dp_replicate > 1 and p.dp_shard == p.tp == p.pp == 1

    # --- building ----------------------------------------------------------------------
    def builds_on_meta(self, run: StrategyContext) -> bool:
        """Whenever the layout splits the model (FSDP, tensor parallel, pipeline): each
        rank then allocates only what it keeps. Whole replicas (one process, DDP) are
        built on the CPU as before: every rank holds all of it anyway."""
        return run.world.size > 1 and not self._replicate_only(run)

    def wrap(self, model: nn.Module, run: StrategyContext) -> nn.Module:
        p, workload, world = run.layout, run.workload, run.world
        if world.size == 1:  # nothing to split: the model as a single process trains it
            return model.to(world.device)
        if self._replicate_only(run):
            bucket_mb = self.option_number("bucket_cap_mb", 25.0, above=0)
            return ddp.replicate(model, world, bucket_mb)
        # the run's one mesh, built by its one builder (ddl.worker.process.mesh.build): a
        # second mesh here could order the ranks differently from the loaders' and sync-BN's
        mesh = run.mesh
        if mesh is None:
            raise DdlError(f"--strategy {self.name}: wrap() needs the run's DeviceMesh "
                           "(StrategyContext.mesh, from ddl.worker.process.mesh.build)")
        units = workload.fsdp_units(model)  # of the whole model, before any cut
        plan = workload.tp_plan(model) if p.tp > 1 else {}
        if p.pp > 1:
            n_stages = self._stages(run)
            stage_ids = pipeline.my_stage_ids(mesh["pp"].get_local_rank(), p.pp, n_stages)
            stages = workload.pipeline_stages(model, n_stages)
            parts = [stages[i] for i in stage_ids]
        else:
            parts = [model]
        for part in parts:
            if run.materialize is None:  # built on the CPU: move, then split
                part.to(world.device)
            if p.tp > 1:
                from ddl_strategies.tp import apply_tensor_parallel

                apply_tensor_parallel(part, workload, mesh["tp"], plan)
            if p.dp > 1:  # not replicate-only (above): FSDP2 over the data-parallel slice
                held = {id(m) for m in part.modules()}
                dp_mesh = mesh["dp_shard"] if p.dp_replicate == 1 else \
                    mesh["dp_replicate", "dp_shard"]
                fsdp.shard(part, [u for u in units if id(u) in held], dp_mesh,
                           reshard=self._reshard, options=self.options)
            if run.materialize is not None:  # built on meta: allocate and fill my part
                run.materialize(part)
        if p.pp == 1:
            return model
        schedule, _ = pipeline.schedule_choice(self.options)
        runner = pipeline.PipelineRunner(
            parts, stage_ids, n_stages, schedule=schedule, microbatches=self._microbatches(run),
            loss_fn=workload.loss, world=world, pp=p.pp, pp_group=mesh["pp"].get_group(),
            measured_steps=pipeline.bubble_steps(self.options))
        return pipeline.Stages(parts, runner)

    @property
    def _reshard(self) -> bool:
        return self.option_flag("reshard_after_forward", True)

    # --- running -----------------------------------------------------------------------
    def forward_backward(self, model, batches, run, precision):
        if not isinstance(model, pipeline.Stages):
            return super().forward_backward(model, batches, run, precision)
        return model.pipeline.forward_backward(batches, precision)

    def clip_gradients(self, model, run, optimizer, precision):
        if not isinstance(model, pipeline.Stages) or not run.clip_grad_norm:
            return super().clip_gradients(model, run, optimizer, precision)
        return model.pipeline.clip_gradients(run.clip_grad_norm)

    def eval_step(self, model, inputs, targets, run, precision):
        if not isinstance(model, pipeline.Stages):
            return super().eval_step(model, inputs, targets, run, precision)
        return model.pipeline.eval_step(inputs, targets, precision)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # DDP's forward would sync buffers every call: wasted when no gradients follow
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    def generation_model(self, model: nn.Module, run: StrategyContext) -> nn.Module | None:
        """Replicas: the model itself. Tensor parallel alone: None (generate on the sharded
        model, all ranks on the same inputs; a gathered copy would cost a whole model per
        rank). FSDP layouts: the same on the shards when a whole copy would not fit
        (option ``generation``, ddl_strategies.fsdp.gather_for_generation). Otherwise a
        plain copy gathered from the shards or stages (ddl_strategies.gathered)."""
        from ddl_strategies.gathered import gathered_copy, plain_copy

        p = run.layout
        if p.world_size == 1 or self._replicate_only(run):
            return model
        if p.pp > 1:
            return plain_copy(run.workload, self.full_state_dict(model, run), run.world.device)
        if p.tp > 1 and p.dp == 1:
            return None
        if not fsdp.gather_for_generation(model, self.options, run.world.device):
            return None  # on the shards: every rank the same inputs
        return gathered_copy(run.workload, model, run.world.device)

    # --- results -----------------------------------------------------------------------
    def checkpoint_name(self, fqn: str, run: StrategyContext) -> str:
        # A pipeline rank's model is its stages in a ModuleList ("0.", "1." prefixes); each
        # stage keeps the full model's names below that.
        return fqn.split(".", 1)[1] if run.layout.pp > 1 else fqn

    def full_state_dict(self, model: nn.Module, run: StrategyContext
                        ) -> dict[str, torch.Tensor]:
        if isinstance(model, pipeline.Stages):
            return model.pipeline.full_state_dict(model)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # A collective: every rank takes part; with cpu_offload only rank 0 keeps the result.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)

    def report(self, model: nn.Module, run: StrategyContext) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if run.layout.dp > 1 and not self._replicate_only(run):
            out.update(fsdp.report(self.options, self._reshard))
        if isinstance(model, pipeline.Stages):
            out.update(model.pipeline.report(), dp=run.layout.dp)
        return out


def _declares(workload: Workload, hint: str) -> bool:
    """Whether the workload overrides the hint ``hint`` of the Workload interface."""
    return getattr(type(workload), hint, None) not in (None, getattr(Workload, hint))
