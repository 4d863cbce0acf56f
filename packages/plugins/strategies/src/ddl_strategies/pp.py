"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut into consecutive stages (the workload says where: ``pipeline_stages``);
each rank holds only its stage(s). A global batch is split into M microbatches that flow
through the stages like an assembly line: while stage 2 works on microbatch 1, stage 1
already computes microbatch 2. Activations go forward and gradients backward between
neighbouring ranks with point-to-point sends.

The price is the *bubble*: at the start and the end of each step some stages wait. With p
stages and m microbatches, GPipe and 1F1B leave a fraction (p-1)/(m+p-1) of each stage's
time idle (Huang et al., "GPipe", NeurIPS 2019; Narayanan et al., "PipeDream-Flush"/1F1B,
ICML 2021). 1F1B has the same bubble as GPipe but holds at most p microbatches' activations
instead of m. Interleaved 1F1B gives each rank v non-adjacent stages, shrinking the bubble to
(p-1)/(v*m+p-1) for more communication (Narayanan et al., "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", SC 2021).

ddl measures the bubble: each rank times the compute of its stages (the schedule's
``forward_one_chunk`` / ``backward_one_chunk`` calls) against the wall time of the step,
and reports the idle fraction next to the theory.

Options: ``schedule`` (gpipe, 1f1b, interleaved1f1b, looped_bfs, interleaved_zb),
``stages_per_rank`` (v; default 2 for the interleaved/looped schedules, 1 otherwise).
``--microbatches`` sets m (default: 2 x stages); it must divide the per-replica batch.
Gradients are averaged over microbatches, so one pipeline step equals one single-process
step on the same batch. ddl divides them itself, once per parameter, rather than letting the
schedule scale each stage (``scale_grads``): a rank holding two stages that share a weight
would divide that weight's gradient twice.

Data parallel x pipeline (``--mesh dp=D,pp=P``, D x P = the world): D replicas of a
P-rank pipeline, each fed its own share of the global batch. Ranks are laid out as
torchtitan does, pipeline outermost: rank r holds stage r // D of replica r % D, so the D
ranks of one stage (in a real job, one node's GPUs) all-reduce its gradients among
themselves, and only the point-to-point hand-offs cross nodes. After each pipeline step
the gradients are averaged over the replicas (one all-reduce per parameter, after the
schedule: simple, not overlapped with the backward as DDP's buckets are).

Stages may pass several tensors: a stage returning a tuple hands its elements to the next
stage as positional arguments, and a batch whose inputs are a dict (token ids, masks)
enters the first stage as its values in order. A weight that several stages use (T5's
embedding, tied to its output projection) lives as one copy per rank; the workload gives it
the same name in each stage, and ddl sums its gradient over the ranks holding a copy before
the optimizer step, as a single process would accumulate it over its uses.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
)

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload
from ddl.contract.world import World

SINGLE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI = {"interleaved1f1b": ScheduleInterleaved1F1B, "looped_bfs": ScheduleLoopedBFS,
         "interleaved_zb": ScheduleInterleavedZeroBubble}


class PipelineStrategy(Strategy):
    name = "pp"
    mesh_dims = frozenset({"dp", "dp_replicate", "pp"})
    layout_fill = ("pp", "dp_replicate")  # without --mesh: one pipeline over every rank
    uses_microbatches = True
    options_help = {
        "schedule": "gpipe (default), 1f1b, interleaved1f1b, looped_bfs, interleaved_zb",
        "stages_per_rank": "stages each rank holds (default 2 for interleaved/looped, else 1)",
    }

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.schedule_name = self.options.get("schedule", "gpipe")
        if self.schedule_name not in SINGLE | MULTI:
            raise UsageError(f"--strategy-option: schedule={self.schedule_name!r}; allowed: "
                             f"{', '.join([*SINGLE, *MULTI])}")
        default_v = 2 if self.schedule_name in MULTI else 1
        self.v = int(self.option_number("stages_per_rank", default_v))
        if self.schedule_name in SINGLE and self.v != 1:
            raise UsageError(f"--strategy-option: {self.schedule_name} runs one stage per "
                             "rank; allowed: stages_per_rank=1 (or an interleaved schedule)")
        self.busy = 0.0  # seconds of stage compute in measured steps
        self.wall = 0.0  # seconds of those steps
        self.steps = 0

    # --- checks ------------------------------------------------------------------------
    def check(self, workload: Workload, world: World) -> None:
        if world.size < 2:
            raise UsageError("--strategy pp: needs at least 2 processes (one per stage); "
                             "allowed: --nproc 2 or more")
        self._check_precision(world)
        self.dp, self.pp = self.parallel.dp_replicate, self.parallel.pp
        if self.pp < 2:
            raise UsageError(f"--mesh: {self.parallel.describe()} leaves pp={self.pp}; a "
                             "pipeline needs pp >= 2 (dp x pp = the number of processes)")
        at = self.parallel.coordinates(world.rank)  # pipeline outermost
        self.pp_rank, self.dp_rank = at["pp"], at["dp_replicate"]
        self.workload, self.world = workload, world
        self.n_stages = self.pp * self.v

    def _check_precision(self, world: World) -> None:
        """fp16 needs its loss scaled before the backward, which the schedule runs itself;
        refuse it rather than train unscaled (gradients would underflow)."""
        from ddl.worker.precision import resolve

        requested = getattr(self.config, "precision", "fp32")
        if resolve(requested, world.device) == "fp16":
            raise UsageError(f"--precision {requested}: pp does not scale fp16 losses (its "
                             "schedule runs the backward); allowed with pp: fp32, bf16 (on "
                             "GPUs without bf16, e.g. V100, pass --precision fp32)")

    def check_layout(self, layout: Any) -> None:
        self.microbatches = self.config.microbatches or 2 * self.n_stages
        if layout.batch_per_replica % self.microbatches:
            raise UsageError(f"--microbatches: {self.microbatches} does not divide the batch of "
                             f"{layout.batch_per_replica}; use a divisor of the batch")

    # --- building the pipeline ------------------------------------------------------------
    def _my_stage_ids(self) -> list[int]:
        # Interleaved/looped schedules give pipeline rank r the stages r, r + p, r + 2p, ...
        return list(range(self.pp_rank, self.n_stages, self.pp))

    def _groups(self, world: World) -> None:
        """This rank's pipeline and data-parallel process groups (None: the whole world)."""
        self.pp_group = self.dp_group = None
        if self.dp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(world.device.type, (self.pp, self.dp),
                                    mesh_dim_names=("pp", "dp"))
            self.pp_group, self.dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()

    def _global_rank(self, pp_rank: int) -> int:
        """The world rank of this replica's pipeline rank ``pp_rank``."""
        return pp_rank * self.dp + self.dp_rank

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        self._groups(world)
        stages = self.workload.pipeline_stages(model, self.n_stages)
        self.stage_ids = self._my_stage_ids()
        mine = nn.ModuleList(stages[i].to(world.device) for i in self.stage_ids)
        self.stages = [PipelineStage(module, i, self.n_stages, world.device,
                                     group=self.pp_group)
                       for module, i in zip(mine, self.stage_ids)]
        for stage in self.stages:
            self._time_compute(stage)
        loss_fn = self.workload.loss
        if self.schedule_name in SINGLE:
            self.schedule = SINGLE[self.schedule_name](self.stages[0], self.microbatches,
                                                       loss_fn=loss_fn, scale_grads=False)
        else:
            self.schedule = MULTI[self.schedule_name](self.stages, self.microbatches,
                                                      loss_fn=loss_fn, scale_grads=False)
        self.params = list(mine.parameters())  # each shared parameter once
        self.shared = self._shared_across_ranks(mine, world, self.dp_rank)
        self.has_first = 0 in self.stage_ids
        self.has_last = self.n_stages - 1 in self.stage_ids
        self.last_rank = self._global_rank((self.n_stages - 1) % self.pp)
        return mine

    @staticmethod
    def _shared_across_ranks(mine: nn.ModuleList, world: World, replica: int
                             ) -> list[tuple[nn.Parameter, Any]]:
        """Parameters this rank holds that other ranks of its pipeline replica hold a copy
        of (under a common name), each with the process group of the ranks holding it, in
        an order all ranks agree on (the all-reduces must match up). A collective."""
        aliases: dict[int, tuple[nn.Parameter, set[str]]] = {}
        for stage in mine:
            for name, param in stage.named_parameters(remove_duplicate=False):
                # the replica in the name: copies are summed within a pipeline, not across
                # replicas (those are averaged afterwards, like any other gradient)
                aliases.setdefault(id(param), (param, set()))[1].add(f"{replica}:{name}")
        everyone: list[Any] = [None] * world.size
        dist.all_gather_object(everyone, [sorted(n) for _, n in aliases.values()])
        by_name: dict[str, dict[int, frozenset[str]]] = {}  # name -> rank -> its copy's names
        for rank, params in enumerate(everyone):
            for names in params:
                for name in names:
                    by_name.setdefault(name, {})[rank] = frozenset(names)

        def key(names: set[str] | list[str]) -> tuple[tuple[int, ...], str]:
            """(ranks holding a copy, a name all copies have): the same on every holder."""
            copies: dict[int, frozenset[str]] = {}
            for name in names:
                copies.update(by_name[name])
            common = frozenset.intersection(*copies.values()) or frozenset.union(*copies.values())
            return tuple(sorted(copies)), min(common)

        keys = {key(names) for params in everyone for names in params}
        # every rank creates every group, in the same order (torch requires it)
        groups = {ranks: dist.new_group(list(ranks))
                  for ranks in sorted({ranks for ranks, _ in keys if len(ranks) > 1})}
        shared = [(key(names), param) for param, names in aliases.values()]
        return [(param, groups[ranks]) for (ranks, _), param in sorted(shared, key=lambda t: t[0])
                if len(ranks) > 1]

    def _time_compute(self, stage: PipelineStage) -> None:
        """Count the time this rank spends computing (not waiting) inside the schedule."""
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            original = getattr(stage, name, None)
            if original is None:
                continue

            def timed(*args, _original=original, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self._compute += time.perf_counter() - start

            setattr(stage, name, timed)

    # --- running it ------------------------------------------------------------------------
    def _run(self, run, inputs, targets, precision):
        if isinstance(inputs, dict):
            inputs = tuple(inputs.values())
        args = (inputs if isinstance(inputs, tuple) else (inputs,)) if self.has_first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        with precision.autocast():
            output = run(*args, **kwargs)
        return output, losses

    def train_step(self, model, batch, workload, optimizer, precision):
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        self._compute = 0.0
        # Every rank times the same window: the last stage finishes its part while the first
        # still runs p-1 backwards, idle time that (p-1)/(m+p-1) counts on every rank.
        dist.barrier(group=self.pp_group)
        start = time.perf_counter()
        output, losses = self._run(self.schedule.step, inputs, targets, precision)
        dist.barrier(group=self.pp_group)
        wall = time.perf_counter() - start
        for param in self.params:  # the mean over microbatches, not their sum
            if param.grad is not None:
                param.grad.div_(self.microbatches)
        for param, group in self.shared:
            if param.grad is None:  # held but unused on this rank: contributes nothing
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, group=group)
        if self.dp > 1:  # average over the replicas, as DDP does
            for param in self.params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad, group=self.dp_group)
                param.grad.div_(self.dp)
        self._clip_gradients()
        optimizer.step()
        self.steps += 1
        if self.steps > 1:  # the first step builds buffers and shapes: not a steady state
            self.busy += self._compute
            self.wall += wall
        # The loss lives on the last stage; every rank reports it.
        loss = torch.stack(losses).mean().detach() if self.has_last else \
            torch.zeros((), device=self.world.device)
        dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return loss, output if self.has_last else None

    def _clip_gradients(self) -> None:
        """--clip-grad-norm over the whole model: each stage's squares summed over the
        pipeline, a tied weight's copies counted once (ddl.contract.grad_norm)."""
        max_norm = getattr(self.config, "clip_grad_norm", None)
        if not max_norm:
            return
        from ddl.contract.grad_norm import clip_grad_norm

        copies = {id(param): 1.0 / dist.get_world_size(group) for param, group in self.shared}
        self.record_grad_norm(clip_grad_norm(self.params, max_norm, sum_over=[self.pp_group],
                                             weights=copies))

    def eval_step(self, model, inputs, targets, workload, precision):
        output, _ = self._run(self.schedule.eval, inputs, targets, precision)
        return output if self.has_last else None

    # --- results ---------------------------------------------------------------------------
    def checkpoint_name(self, fqn: str) -> str:
        # The wrapped model is a ModuleList of this rank's stages ("0.", "1." prefixes);
        # each stage keeps the full model's names below that.
        return fqn.split(".", 1)[1]

    def generation_model(self, model: nn.Module, world: World) -> nn.Module:
        """The whole model rebuilt on every rank from all ranks' stages (a collective):
        loops such as generate() need every layer, token by token."""
        from ddl_strategies.gathered import plain_copy

        return plain_copy(self.workload, self.full_state_dict(model), world.device)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # Stage modules keep the original child names, so the pieces merge into the full
        # model's state_dict.
        mine = {k: v.detach().cpu() for stage in model for k, v in stage.state_dict().items()}
        pieces: list[Any] = [None] * self.world.size
        dist.all_gather_object(pieces, mine)
        return {k: v for piece in pieces for k, v in piece.items()}

    def report(self, world: World) -> dict[str, Any]:
        idle = 1.0 - self.busy / self.wall if self.wall else float("nan")
        per_rank: list[Any] = [None] * world.size
        dist.all_gather_object(per_rank, idle)
        p, m, v = self.pp, self.microbatches, self.v
        return {"schedule": self.schedule_name, "stages": self.n_stages, "stages_per_rank": v,
                "dp": self.dp,
                "microbatches": m, "bubble_measured_per_rank": per_rank,
                "bubble_measured": sum(per_rank) / len(per_rank),
                "bubble_theory": (p - 1) / (v * m + p - 1)}
