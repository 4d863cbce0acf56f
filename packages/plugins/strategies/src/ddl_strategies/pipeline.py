"""Pipeline parallelism with ``torch.distributed.pipelining``: this rank's stages and the
schedule that runs them.

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
and reports the idle fraction next to the theory. The window is the same on every rank
only between two barriers of the pipeline's ranks, so a measured step costs two
synchronisations: ddl measures steps 2 to 9 (``bubble_steps``), and the steps after run
without them.

This module runs forward and backward only: the trainer zeroes the gradients before, and
clips, steps the optimizer and the lr schedule after (ddl.worker.train.step).

Options: ``schedule`` (gpipe, 1f1b, interleaved1f1b, looped_bfs, interleaved_zb),
``stages_per_rank`` (v; default 2 for the interleaved/looped schedules, 1 otherwise),
``bubble_steps`` (how many steps measure the bubble; default 8, 0: none).
``--microbatches`` sets m (default: 2 x stages); it must divide the per-replica batch.
Gradients are averaged over microbatches, so one pipeline step equals one single-process
step on the same batch. ddl divides them itself, once per parameter, rather than letting the
schedule scale each stage (``scale_grads``): a rank holding two stages that share a weight
would divide that weight's gradient twice.

Pipeline x data parallel x tensor parallel (``--mesh pp=P,dp_shard=S,tp=T``; see
ddl_strategies.compose for the order): the world is P pipelines' worth of ranks, pipeline
outermost as in torchtitan, so the ranks of one stage (in a real job, one node's GPUs) hold
that stage's tensor-parallel and FSDP shards among themselves and only the point-to-point
hand-offs cross nodes. FSDP2 reduces each stage's gradients over its data-parallel ranks
during the schedule's last backward; this module adds what is particular to pipelines:
dividing by the microbatches, summing a tied weight over the stages that hold a copy.

Stages may pass several tensors: a stage returning a tuple hands its elements to the next
stage as positional arguments, and a batch whose inputs are a dict (token ids, masks)
enters the first stage as its values in order. A weight that several stages use (T5's
embedding, tied to its output projection) lives as one copy per rank; the workload gives it
the same name in each stage, and ddl sums its gradient over the ranks holding a copy before
the optimizer step, as a single process would accumulate it over its uses.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ddl.contract.errors import UsageError
from ddl.contract.world import World

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage

# torch.distributed.pipelining's class names; imported when a pipeline is built (importing
# it pulls in torch._dynamo: ~0.6 s of every process's start-up, pipelines or not)
SINGLE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
MULTI = {"interleaved1f1b": "ScheduleInterleaved1F1B", "looped_bfs": "ScheduleLoopedBFS",
         "interleaved_zb": "ScheduleInterleavedZeroBubble"}


OPTIONS_HELP = {
    "schedule": "gpipe (default), 1f1b, interleaved1f1b, looped_bfs, interleaved_zb",
    "stages_per_rank": "stages each rank holds (default 2 for interleaved/looped, else 1)",
    "bubble_steps": "steps after the first whose bubble is measured, each between two "
                    "barriers of the pipeline's ranks (default 8; 0: none)",
}


def bubble_steps(options: dict[str, str]) -> int:
    """How many steps (after the first) time the bubble: ``bubble_steps``, checked."""
    value = options.get("bubble_steps", "8")
    if not value.isdigit():
        raise UsageError(f"--strategy-option: bubble_steps={value[:40]!r}; allowed: a whole "
                         "number >= 0")
    return int(value)


def schedule_choice(options: dict[str, str]) -> tuple[str, int]:
    """(schedule name, stages per rank) from ``--strategy-option``, checked."""
    name = options.get("schedule", "gpipe")
    if name not in SINGLE | MULTI:
        raise UsageError(f"--strategy-option: schedule={name!r}; allowed: "
                         f"{', '.join([*SINGLE, *MULTI])}")
    value = options.get("stages_per_rank", "2" if name in MULTI else "1")
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--strategy-option: stages_per_rank={value!r}; allowed: a whole "
                         "number >= 1")
    if name in SINGLE and int(value) != 1:
        raise UsageError(f"--strategy-option: {name} runs one stage per rank; allowed: "
                         "stages_per_rank=1 (or an interleaved schedule)")
    return name, int(value)


def check_precision(precision: str) -> None:
    """fp16 needs its loss scaled before the backward, which the schedule runs itself;
    refuse it rather than train unscaled (gradients would underflow). ``precision``: the
    run's, decided by the run plan (StrategyContext.precision; auto is fp16 on GPUs
    without bf16)."""
    if precision == "fp16":
        raise UsageError("--precision: this run computes in fp16, and pp does not scale "
                         "fp16 losses (its schedule runs the backward); allowed with pp: "
                         "fp32, bf16 (on GPUs without bf16, e.g. V100, pass --precision "
                         "fp32)")


def my_stage_ids(pp_rank: int, pp: int, n_stages: int) -> list[int]:
    """Interleaved/looped schedules give pipeline rank r the stages r, r + p, r + 2p, ..."""
    return list(range(pp_rank, n_stages, pp))


class Stages(nn.ModuleList):
    """What ``wrap`` returns on a pipeline rank: its stage modules, and the PipelineRunner that
    runs them (``.pipeline``: a plain attribute, not a sub-module)."""

    def __init__(self, parts: list[nn.Module], runner: PipelineRunner) -> None:
        super().__init__(parts)
        self.pipeline = runner


class PipelineRunner:
    """This rank's stages of one pipeline replica and the schedule that runs them.

    ``parts`` are this rank's stage modules (``my_stage_ids``), already tensor-parallel and
    FSDP-sharded where the layout says so; ``pp_group`` joins the ranks of this pipeline
    (same coordinates on every other dimension)."""

    def __init__(self, parts: list[nn.Module], stage_ids: list[int], n_stages: int, *,
                 schedule: str, microbatches: int, loss_fn, world: World, pp: int,
                 pp_group, measured_steps: int = 8) -> None:
        self.world, self.microbatches, self.pp_group = world, microbatches, pp_group
        self.schedule_name, self.v, self.pp, self.n_stages = \
            schedule, len(stage_ids), pp, n_stages
        self.stage_ids = tuple(stage_ids)
        # this pipeline's ranks, in pp order: its first names the replica (its copies of a
        # tied weight are summed within the pipeline, not across replicas)
        members = dist.get_process_group_ranks(pp_group)
        replica = members[0]
        from torch.distributed import pipelining

        self.stages = [pipelining.PipelineStage(part, i, n_stages, world.device, group=pp_group)
                       for part, i in zip(parts, stage_ids)]
        for stage in self.stages:
            self._time_compute(stage)
        if schedule in SINGLE:
            self.schedule = getattr(pipelining, SINGLE[schedule])(
                self.stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)
        else:
            self.schedule = getattr(pipelining, MULTI[schedule])(
                self.stages, microbatches, loss_fn=loss_fn, scale_grads=False)
        mine = nn.ModuleList(parts)
        self.params = list(mine.parameters())  # each shared parameter once
        self.shared = _shared_across_ranks(mine, world, replica)
        self.has_first, self.has_last = 0 in stage_ids, n_stages - 1 in stage_ids
        self.last_rank = members[(n_stages - 1) % pp]  # holds the last stage
        self.measured_steps = measured_steps  # steps 2 .. 1 + this time the bubble
        self.busy = 0.0  # seconds of stage compute in measured steps
        self.wall = 0.0  # seconds of those steps
        self.measured = 0  # how many steps were measured
        self.steps = 0
        self._compute = 0.0

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

    def _run(self, run, inputs, targets, precision):
        if isinstance(inputs, dict):
            inputs = tuple(inputs.values())
        args = (inputs if isinstance(inputs, tuple) else (inputs,)) if self.has_first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        with precision.autocast():
            output = run(*args, **kwargs)
        return output, losses

    def forward_backward(self, batches, precision):
        """Forward and backward of all microbatches of one or more batches (several:
        gradient accumulation, one schedule run each, so the microbatches per step
        multiply), leaving the gradients of their mean loss (a tied weight's copies on
        several stages summed); the trainer zeroes, clips and steps around it
        (ddl.worker.train.step). Returns (mean loss on every rank, the last stage's outputs per
        batch or Nones)."""
        # the first step builds buffers and shapes: not a steady state
        measuring = 1 <= self.steps <= self.measured_steps
        self._compute = 0.0
        if measuring:
            # Every rank times the same window: the last stage finishes its part while the
            # first still runs p-1 backwards, idle time that (p-1)/(m+p-1) counts on every
            # rank. The barriers cost a synchronisation each: only on measured steps.
            dist.barrier(group=self.pp_group)
        start = time.perf_counter()
        outputs, losses = [], []
        for inputs, targets in batches:
            output, batch_losses = self._run(self.schedule.step, inputs, targets, precision)
            outputs.append(output if self.has_last else None)
            losses += batch_losses
        if measuring:
            dist.barrier(group=self.pp_group)
            self.busy += self._compute
            self.wall += time.perf_counter() - start
            self.measured += 1
        self.steps += 1
        for param in self.params:  # the mean over all microbatches, not their sum
            if param.grad is not None:
                param.grad.div_(self.microbatches * len(batches))
        for param, group in self.shared:
            if param.grad is None:  # held but unused on this rank: contributes nothing
                param.grad = torch.zeros_like(param)
            dist.all_reduce(_local(param.grad), group=group)
        # The loss lives on the last stage; every rank reports it.
        loss = torch.stack(losses).mean().detach() if self.has_last else \
            torch.zeros((), device=self.world.device)
        dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return loss, outputs

    def clip_gradients(self, max_norm: float):
        """--clip-grad-norm over the whole model: each stage's squares summed over the
        pipeline, a tied weight's copies counted once (ddl.contract.grad_norm)."""
        from ddl.contract.grad_norm import clip_grad_norm

        copies = {id(param): 1.0 / dist.get_world_size(group) for param, group in self.shared}
        return clip_grad_norm(self.params, max_norm, sum_over=[self.pp_group], weights=copies)

    def eval_step(self, inputs, targets, precision):
        # torch's stage drops FSDP gradients when it infers shapes for an evaluation run;
        # keep them, so that memory read after evaluation (results.json) still counts the
        # gradients training holds (references only: no copy)
        grads = [(param, param.grad) for param in self.params]
        output, _ = self._run(self.schedule.eval, inputs, targets, precision)
        for param, grad in grads:
            param.grad = grad
        return output if self.has_last else None

    def full_state_dict(self, parts: nn.ModuleList) -> dict[str, torch.Tensor]:
        """The whole model's weights as plain tensors on every rank (a collective). Stage
        modules keep the original child names, so the pieces merge into the full model's
        state_dict; tensor-parallel or FSDP shards are gathered within each stage first."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        mine: dict[int, dict[str, torch.Tensor]] = {}
        for stage_id, stage in zip(self.stage_ids, parts):
            mine[stage_id] = {}
            if stage.state_dict():  # torch refuses a parameter-free module (MNIST's flatten)
                state = get_model_state_dict(stage, options=StateDictOptions(
                    full_state_dict=True))  # a collective of the stage's dp x tp ranks
                mine[stage_id] = {k: v.detach().cpu() for k, v in state.items()}
        # Each stage once, from the lowest rank holding it. (all_gather_object sent every
        # holder's copy to every rank, in buffers padded to the largest: 8 ranks of --mesh
        # pp=2,tp=2,dp_shard=2 on a 100M-parameter model ran a 24 GB machine out of memory.)
        holders: list[Any] = [None] * self.world.size
        dist.all_gather_object(holders, self.stage_ids)
        whole: dict[str, torch.Tensor] = {}
        for stage_id in range(self.n_stages):
            src = next(r for r, ids in enumerate(holders) if stage_id in ids)
            box = [mine.get(stage_id) if self.world.rank == src else None]
            dist.broadcast_object_list(box, src=src)
            whole.update(box[0])
        return whole

    def report(self) -> dict[str, Any]:
        """The bubble, measured on every rank and in theory (a collective)."""
        idle = 1.0 - self.busy / self.wall if self.wall else float("nan")
        per_rank: list[Any] = [None] * self.world.size
        dist.all_gather_object(per_rank, idle)
        p, m, v = self.pp, self.microbatches, self.v
        return {"schedule": self.schedule_name, "stages": self.n_stages, "stages_per_rank": v,
                "microbatches": m, "bubble_steps": self.measured,
                "bubble_measured_per_rank": per_rank,
                "bubble_measured": sum(per_rank) / len(per_rank),
                "bubble_theory": (p - 1) / (v * m + p - 1)}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard; copies of a tied weight on
    different stages are sharded alike, so their shards add up position by position)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _shared_across_ranks(mine: nn.ModuleList, world: World, replica: int
                        ) -> list[tuple[nn.Parameter, Any]]:
    """Parameters this rank holds that other ranks of its pipeline replica hold a copy
    of (under a common name), each with the process group of the ranks holding it, in
    an order all ranks agree on (the all-reduces must match up). A collective."""
    aliases: dict[int, tuple[nn.Parameter, set[str]]] = {}
    for stage in mine:
        for name, param in stage.named_parameters(remove_duplicate=False):
            # the replica in the name: copies are summed within a pipeline, not across
            # replicas (FSDP averages those, like any other gradient)
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
