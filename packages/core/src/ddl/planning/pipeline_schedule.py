"""A pipeline schedule's order of work per rank, and what follows from it: which
micro-batches a rank holds for backward (GPipe and 1F1B from ddl.planning.memory_model,
the interleaved and looped schedules from torch's own classes; ddl.planning.plan_probe
walks each stage's bytes with it), the bubble, and how long the ranks wait for the
hand-offs between stages (:func:`handoff_wait`)."""

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


MULTI_STAGE = ("interleaved1f1b", "looped_bfs", "interleaved_zb")


def bubble(pp: int, microbatches: int, schedule: str = "1f1b", stages_per_rank: int = 1,
           largest_share: float | None = None) -> float:
    """Idle share of a pipeline step: (p-1) / (m+p-1) for GPipe and 1F1B, with ``v m``
    for m under the schedules of ``v`` stages per rank (Narayanan et al. 2021, sec. 2.2);
    zero-bubble schedules get the interleaved number (an upper bound for them).
    ``largest_share``: the slowest stage's share of the FLOPs when stages differ (None:
    1/p): the slowest sets the steady state, every stage is passed once in the fill and
    drain, so a step takes ((m-1) s + 1) micro-batch times where the rank computes m s."""
    if pp <= 1:
        return 0.0
    m = max(microbatches, 1) * (stages_per_rank if schedule in MULTI_STAGE else 1)
    s = largest_share if largest_share else 1 / pp
    return 1 - m * s / ((m - 1) * s + 1)


def handoff_wait(schedule: str, microbatches: int, forward_s: list[float],
                 backward_s: list[float], message_s: float) -> float | None:
    """Seconds one run of a one-stage-per-rank schedule (GPipe, 1F1B) takes longer because
    each hand-off between stages (an activation forward, its gradient back) arrives
    ``message_s`` after it was sent: the run's span with that delay less its span without.
    ``forward_s``/``backward_s``: one micro-batch's forward and backward on each stage.
    None for the schedules with several stages per rank (not simulated).

    The span comes from walking every rank's compute order as torch.distributed.pipelining
    runs it (:func:`ddl.planning.memory_model.single_stage_actions`): a stage's forward of
    micro-batch i starts when its rank is free and the previous stage's forward of i has
    arrived, its backward when the next stage's backward of i has. What the delay costs
    depends on the schedule: GPipe pays it in the fill and the drain only, 1F1B (which
    keeps at most p - rank micro-batches in flight) also in the steady state wherever a
    round trip outlasts the work a rank has in hand (on 2 stages: on every micro-batch)."""
    if schedule not in ("gpipe", "1f1b"):
        return None
    return (_span(schedule, microbatches, forward_s, backward_s, message_s)
            - _span(schedule, microbatches, forward_s, backward_s, 0.0))


def _span(schedule: str, microbatches: int, forward_s: list[float], backward_s: list[float],
          delay_s: float) -> float:
    from ddl.planning.memory_model import single_stage_actions

    pp = len(forward_s)
    orders = [single_stage_actions(schedule, microbatches, pp, r) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, rank, micro-batch) -> end
    free = [0.0] * pp  # when each rank finishes its last action
    position = [0] * pp  # next action of each rank
    seen = [{"F": 0, "B": 0} for _ in range(pp)]  # micro-batches each rank began, by kind
    moved = True
    while moved:  # each pass runs every action whose input has arrived
        moved = False
        for r in range(pp):
            while position[r] < len(orders[r]):
                kind = orders[r][position[r]][0]
                i = seen[r][kind]
                source = (r - 1 if kind == "F" else r + 1)
                if 0 <= source < pp:
                    arrived = done.get((kind, source, i))
                    if arrived is None:
                        break  # waits for a neighbour not simulated this far yet
                    start = max(free[r], arrived + delay_s)
                else:
                    start = free[r]
                free[r] = start + (forward_s[r] if kind == "F" else backward_s[r])
                done[(kind, r, i)] = free[r]
                seen[r][kind] += 1
                position[r] += 1
                moved = True
    return max(free)


def step_end(link, shared: tuple[int, float], split: int) -> float:
    """Seconds of a pipeline's collectives once per step, after its schedule
    (ddl_strategies.pipeline): the last stage's loss broadcast (one small message), and the
    gradients of the ``shared[0]`` weights that several stages hold (a tied embedding and
    head; ``shared[1]`` bytes, fp32, split ``split`` ways by tp and FSDP) all-reduced
    between their holders, one call each. ``link``: a step_time_model ``Link``."""
    calls, nbytes = shared
    return link.seconds("p2p", 4, 2) + link.seconds("all_reduce", nbytes / split, 2, calls)
