"""Which micro-batches a pipeline rank holds for backward, from its schedule's order:
GPipe and 1F1B from ddl.planning.memory_model, the interleaved and looped schedules
from torch's own classes (ddl.planning.plan_probe walks each stage's bytes with it)."""

from __future__ import annotations

from ddl.contract.layout import ParallelLayout

#: torch.distributed.pipelining's classes of the schedules with several stages per rank
#: (ddl_strategies.pipeline.MULTI)
_MULTI = {"interleaved1f1b": "ScheduleInterleaved1F1B", "looped_bfs": "ScheduleLoopedBFS",
          "interleaved_zb": "ScheduleInterleavedZeroBubble"}


def pipeline_actions(schedule: str, pp: int, pp_rank: int, microbatches: int,
                     stages_per_rank: int = 1) -> list[tuple[str, int]]:
    """One pipeline rank's compute order, (kind, stage index) per micro-batch action: "F"
    forward, "B" full backward, "I"/"W" the input and weight halves of a zero-bubble
    backward. GPipe and 1F1B: ddl.planning.memory_model.single_stage_actions; the
    interleaved and looped schedules: the order torch's own class computes for the rank
    (``_calculate_single_rank_operations``, run on a stand-in for the schedule object:
    it reads only the sizes; no process group, no stages)."""
    from ddl.planning.memory_model import single_stage_actions

    if stages_per_rank == 1 and schedule not in _MULTI:
        return single_stage_actions(schedule, microbatches, pp, pp_rank)
    from types import SimpleNamespace

    from torch.distributed import pipelining

    cls = getattr(pipelining, _MULTI[schedule])
    rounds = max(1, microbatches // pp)
    fake = SimpleNamespace(pp_group_size=pp, n_local_stages=stages_per_rank,
                           _stages=[None] * stages_per_rank, _n_microbatches=microbatches,
                           number_of_rounds=rounds, microbatches_per_round=microbatches // rounds,
                           rank=pp_rank)
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I",
             "BACKWARD_WEIGHT": "W"}
    out = []
    for action in cls._calculate_single_rank_operations(fake, pp_rank):
        if action is not None and action.computation_type.name in kinds:
            out.append((kinds[action.computation_type.name], action.stage_index))
    return out


def rank_activation_bytes(schedule: str, layout: ParallelLayout, rank: int,
                          microbatches: int, per_stage: list[float],
                          stages_per_rank: int = 1) -> float:
    """What ``rank`` of ``layout`` holds for backward at its peak: one micro-batch's bytes
    per stage (``per_stage``, all stages of the pipeline) times the micro-batches in flight
    that its schedule's order gives; without a pipeline, ``per_stage[0]``."""
    from ddl.planning.memory_model import pipeline_peak

    if layout.pp == 1:
        return per_stage[0]
    pp_rank = layout.coordinates(rank)["pp"]
    actions = pipeline_actions(schedule, layout.pp, pp_rank, microbatches, stages_per_rank)
    return pipeline_peak(actions, dict(enumerate(per_stage)))
