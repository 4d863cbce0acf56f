"""``ddl plan``'s predictions: every candidate layout (ddl.planning.layout_search) with its
memory per rank (ddl.planning.memory_model on what ddl.planning.plan_probe finds) and its
step-time estimate; those that do not fit the device are kept with the reason.

Probes are shared between candidates: model state depends on the layout alone, and the
bytes a stage keeps grow linearly with the micro-batch (measured at 1 and 2 samples, so a
constant part such as T5's position bias is kept apart), per (tp, pp, checkpointing).
Batches are probed untrimmed (xsum: the preset's full lengths; plan_probe.sample_batch),
so the activations are a bound no batch exceeds; a pipeline rank holds 1F1B's pp - rank
micro-batches (memory_model.in_flight, measured to the byte on CPU runs).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError
from ddl.contract.layout import ParallelLayout
from ddl.contract.workload import Workload
from ddl.planning import layout_search as search
from ddl.planning import memory_model as mm
from ddl.planning import peak_model
from ddl.planning import step_time_model as stm
from ddl.planning import plan_probe as probe


@dataclass(frozen=True)
class Device:
    kind: str  # cuda, rocm, cpu
    gpus_per_node: int
    memory_bytes: int
    peak_flops: float | None
    intra_bytes_per_s: float | None
    inter_bytes_per_s: float | None
    intra_latency_s: float | None = None  # None: the model counts bandwidth only
    inter_latency_s: float | None = None
    # a CPU plan of this machine (ddl.planning.cpu_calibration): the gloo fits between
    # the plan's processes ({op: {latency_s, bytes_per_s}}), one thread's matmul rate, and
    # the cores the ranks share; None: ranked by bytes communicated
    cpu_links: Mapping[str, Mapping[str, float]] | None = None
    cpu_matmul_flops: float | None = None
    cores: int = 1


@dataclass
class Prediction:
    candidate: search.Candidate
    memory_bytes: int = 0  # the fullest rank's
    model_state_bytes: int = 0
    activation_bytes: int = 0
    step_s: float | None = None
    dropped: str | None = None
    comm_bytes: dict[str, float] = field(default_factory=dict)
    step_time: dict[str, Any] | None = None  # step_time_model.StepTime.as_dict()
    peak: dict[str, int] | None = None  # the fullest rank's, by part (peak_model.Peak)
    pp_rank: int = 0  # the pipeline stage of that fullest rank

    def as_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {"mesh": c.layout.degrees(), "micro_batch": c.micro_batch,
                "accumulation": c.accumulation, "activation_checkpointing": c.checkpointing,
                "pipeline_microbatches": c.microbatches if c.layout.pp > 1 else None,
                "memory_per_rank_bytes": self.memory_bytes, "peak": self.peak,
                "model_state_bytes": self.model_state_bytes,
                "activation_bytes": self.activation_bytes, "step_s": self.step_s,
                "comm_bytes_per_step": self.comm_bytes, "step_time": self.step_time,
                "strategy_options": c.strategy_options(), "flags": c.flags(),
                "pp_rank": self.pp_rank, "dropped": self.dropped}


class Planner:
    def __init__(self, workload: Workload, batch_source: Path, device: Device, *,
                 sync_bn: bool = False, precision: str = "fp32") -> None:
        """``sync_bn``: the runs will use ``--sync-bn`` (on a CPU device its float64
        BatchNorm keeps more; plan_probe.activation_bytes). ``precision``: what the runs
        compute in (bf16/fp16 autocast keeps 16-bit activations; autocast_probe)."""
        self.workload, self.device, self.sync_bn = workload, device, sync_bn
        self.precision = precision
        self.model = probe.meta_model(workload.build_model)  # built once, copied per probe
        self.cost = probe.optimizer_cost(workload)
        self.batch_source = batch_source
        self.flops = workload.flops_per_sample()
        self.cpu_costs: dict[str, Any] | None = None  # calibrate_cpu

    def _copy(self):
        return copy.deepcopy(self.model)

    def calibrate_cpu(self, candidates: list[search.Candidate]) -> dict[str, Any] | None:
        """On a CPU plan of this machine (``device.cpu_links``): the workload's costs
        measured here, once, for the pipeline degrees and micro-batch sizes of
        ``candidates`` (ddl.planning.cpu_calibration); None where not measured (another
        device, a model too big to build here: then FLOPs / the matmul rate)."""
        from ddl.planning import cpu_calibration

        if self.device.kind != "cpu" or not self.device.cpu_links:
            return None
        degrees = tuple(sorted({c.layout.pp for c in candidates
                                if c.layout.pp == 1 or not self.check(c.layout)}))
        biggest = max((c.micro_batch // max(c.microbatches, 1) for c in candidates),
                      default=2)
        sizes = (2, max(min(biggest, 64), 3))
        param_bytes = sum(p.itemsize * _numel(p.shape) for p in self.model.parameters())
        ranks = candidates[0].layout.world_size if candidates else 1
        self.cpu_costs = cpu_calibration.workload_costs(
            self.workload, self.batch_source, degrees, sizes, param_bytes,
            train=self._train(), threads=stm.threads_per_rank(self.device.cores, ranks))
        return self.cpu_costs

    def _compute(self) -> stm.Compute | None:
        """The rank's compute: a GPU at the site's peak (the assumed efficiency); a CPU
        of this machine at its measured costs (or FLOPs / its matmul rate)."""
        d = self.device
        if d.kind == "cpu":
            if not d.cpu_links or not d.cpu_matmul_flops:
                return None
            costs = self.cpu_costs
            skew = d.cpu_links.get("skew") or {}
            return stm.Compute(d.cpu_matmul_flops, 1.0, cpu=True, cores=d.cores,
                               sync_wait=skew.get("wait_per_compute", 0.0),
                               thread_efficiency=(costs or {}).get("thread_efficiency", 1.0),
                               costs=(
                stm.CpuCosts({int(k): tuple(tuple(x) for x in v)
                              for k, v in costs["stages"].items()},
                             costs["optimizer_s"], costs["param_bytes"],
                             tuple(costs.get("data") or (0.0, 0.0)),
                             costs.get("wrappers") or {})
                if costs else None))
        if d.peak_flops and d.intra_bytes_per_s and d.inter_bytes_per_s:
            return stm.Compute(d.peak_flops)
        return None

    @cache  # noqa: B019 - one planner per command
    def check(self, layout: ParallelLayout) -> str | None:
        """Why the workload cannot run ``layout`` (heads tp must divide, split points a
        pipeline needs), or None."""
        try:
            if layout.tp > 1:
                self.workload.prepare_tensor_parallel(self._copy(), layout.tp)
            if layout.pp > 1:
                self.workload.pipeline_stages(self._copy(), layout.pp)
        except UsageError as exc:
            return str(exc).removeprefix("--mesh: ")
        return None

    @cache  # noqa: B019
    def model_states(self, layout: ParallelLayout) -> tuple[list[dict[str, int]], int, int]:
        """Per rank model state, the full parameter bytes of the largest pp rank, and the
        most FSDP units a pp rank holds (the workload's ``fsdp_units`` in its stages + the
        root each stage is wrapped as)."""
        states = probe.model_state_per_rank(self.workload, self._copy(), layout, self.cost)
        model = self._copy()
        units = {id(u) for u in self.workload.fsdp_units(model)}
        parts = probe.stage_parts(self.workload, model, layout)
        full = max(sum(p.itemsize * _numel(p.shape) for p in probe.held_params(ps, {}))
                   for ps in parts)
        held = max(sum(1 for part in ps for m in part.modules() if id(m) in units) + len(ps)
                   for ps in parts)
        return states, full, held

    @cache  # noqa: B019
    def shared_weights(self, layout: ParallelLayout) -> tuple[int, int]:
        """(count, fp32-as-stored bytes) of the parameters more than one pipeline rank
        holds (a tied embedding and head): their gradients are all-reduced each step."""
        holders: dict[int, tuple[int, set[int]]] = {}
        for rank, parts in enumerate(probe.stage_parts(self.workload, self._copy(), layout)):
            for part in parts:
                for p in part.parameters():
                    holders.setdefault(id(p), (p.itemsize * _numel(p.shape), set()))[1].add(rank)
        shared = [size for size, ranks in holders.values() if len(ranks) > 1]
        return len(shared), sum(shared)

    @cache  # noqa: B019
    def buffer_groups(self) -> tuple[int, int]:
        """(dtypes, bytes) of the model's buffers: DDP broadcasts them before each forward,
        one call per dtype (``broadcast_buffers``; BatchNorm: fp32 statistics, int64
        counts)."""
        by_dtype: dict[Any, int] = {}
        for b in self.model.buffers():
            by_dtype[b.dtype] = by_dtype.get(b.dtype, 0) + b.element_size() * b.numel()
        return len(by_dtype), sum(by_dtype.values())

    @cache  # noqa: B019
    def _train(self) -> Any:
        """The workload's training set, read once per plan: every probe's batch is its
        first samples (xsum's datasets() tokenizes every article: a T5 plan read it ~40
        times, a quarter of its time)."""
        return self.workload.datasets(self.batch_source)["train"]

    def _batch(self, size: int) -> tuple[Any, Any]:
        return probe.sample_batch(self.workload, self.batch_source, size, train=self._train())

    @cache  # noqa: B019
    def recompute(self) -> dict[str, float]:
        """Share of the forward FLOPs each checkpointing mode recomputes (plan_probe)."""
        inputs, targets = self._batch(2)
        try:
            return probe.recompute_shares(self.workload, self._copy(), inputs, targets)
        except Exception:  # noqa: BLE001 - an op the counter cannot run: the assumption
            return {}

    @cache  # noqa: B019
    def _probe(self, tp: int, pp: int, checkpointing: str, size: int) -> probe.Activations:
        if pp > 1:  # cutting first: it may change what batches look like (xsum: untrimmed)
            self.workload.pipeline_stages(self._copy(), pp)
        inputs, targets = self._batch(size)
        return probe.activation_bytes(self.workload, self._copy(), inputs, targets, tp=tp,
                                      n_stages=pp, checkpointing=checkpointing,
                                      sync_bn=self.sync_bn,
                                      device_type="cpu" if self.device.kind == "cpu" else "cuda",
                                      precision=self.precision)

    @cache  # noqa: B019
    def _line(self, tp: int, pp: int, checkpointing: str
              ) -> tuple[probe.Activations, probe.Activations, str | None]:
        """Activations at 1 and 2 samples per forward pass (they grow along a line), and
        why one sample cannot train, or None. A model that refuses one sample (BatchNorm in
        training needs more than one value per channel) is probed at 2 and 3 samples, and
        its one-sample point read off the line through them."""
        try:
            return (self._probe(tp, pp, checkpointing, 1),
                    self._probe(tp, pp, checkpointing, 2), None)
        except ValueError as exc:
            two = self._probe(tp, pp, checkpointing, 2)
            three = self._probe(tp, pp, checkpointing, 3)
            one = probe.Activations(
                [2 * a - b for a, b in zip(two.per_stage, three.per_stage)],
                boundary_bytes=three.boundary_bytes - two.boundary_bytes,
                rowwise_bytes=three.rowwise_bytes - two.rowwise_bytes,
                rowwise_layers=two.rowwise_layers, stage_flops=two.stage_flops)
            return one, two, (str(exc).strip().splitlines() or [type(exc).__name__])[0]

    def stage_bytes(self, tp: int, pp: int, checkpointing: str, size: int
                    ) -> tuple[list[float], probe.Activations]:
        one, two, _ = self._line(tp, pp, checkpointing)
        return [a + (size - 1) * (b - a) for a, b in zip(one.per_stage, two.per_stage)], one

    def predict(self, c: search.Candidate, global_batch: int) -> Prediction:
        out = Prediction(c)
        layout = c.layout
        why = self.check(layout)
        if why:
            out.dropped = why
            return out
        per_forward = c.micro_batch // c.microbatches
        single = self._line(layout.tp, layout.pp, c.checkpointing)[2]
        if per_forward == 1 and single:
            out.dropped = f"one sample per forward pass cannot train: {single}"
            return out
        states, full, units = self.model_states(layout)
        stages, one = self.stage_bytes(layout.tp, layout.pp, c.checkpointing, per_forward)
        worst = None
        for rank, state in enumerate(states):
            r = layout.coordinates(rank)["pp"]
            acts = mm.in_flight(search.SCHEDULE, c.microbatches, layout.pp, r) * stages[r]
            peak = peak_model.rank_peak(self, c, state, int(acts), r,
                                        *self._line(layout.tp, layout.pp, c.checkpointing)[:2])
            if worst is None or peak.total_bytes > worst.total_bytes:
                worst, out.pp_rank = peak, r
        out.memory_bytes, out.peak = worst.total_bytes, worst.as_dict()
        out.model_state_bytes, out.activation_bytes = (worst.model_state_bytes,
                                                       worst.activation_bytes)
        d = self.device
        if out.memory_bytes > d.memory_bytes:
            out.dropped = (f"needs {gib(out.memory_bytes)} per device, has "
                           f"{gib(d.memory_bytes)}")
        out.comm_bytes = search.comm_bytes(c, full, one.rowwise_bytes,
                                           one.boundary_bytes)
        compute = self._compute()
        if compute is not None and (self.flops or compute.costs):
            # the stages' FLOPs from the probe without checkpointing (torch's counter
            # does not see into selective checkpointing's own dispatch mode)
            flops = self._line(layout.tp, layout.pp, "none")[0].stage_flops \
                if layout.pp > 1 else ()
            shares = tuple(f / sum(flops) for f in flops) if flops and sum(flops) else ()
            sizes = stm.Sizes(full, one.rowwise_bytes, one.boundary_bytes, units=units,
                              rowwise_layers=one.rowwise_layers, recompute=self.recompute(),
                              stage_shares=shares, shared=self.shared_weights(layout),
                              buffers=self.buffer_groups())
            timed = stm.step_time(
                step_layout(c), self.flops or 0.0, compute, sizes, network(d),
                {dim: search.crosses_nodes(layout, dim, d.gpus_per_node)
                 for dim in ("dp_replicate", "dp_shard", "tp", "pp")},
                local_ranks=layout.world_size if d.kind == "cpu" else None)
            out.step_s, out.step_time = timed.total_s, timed.as_dict()
        return out


def step_layout(c: search.Candidate) -> stm.StepLayout:
    options = c.strategy_options()
    return stm.StepLayout(c.layout, c.micro_batch, c.accumulation, c.microbatches,
                          c.checkpointing, param_dtype=options.get("param_dtype", "fp32"),
                          reduce_dtype=options.get("reduce_dtype", "fp32"),
                          schedule=options.get("schedule", search.SCHEDULE))


def network(d: Device) -> stm.Network:
    """The site's two link levels (a latency it does not give counts as 0); on a CPU of
    this machine the measured gloo fits, one per collective (one node: no second level)."""
    if d.kind == "cpu" and d.cpu_links:
        base = d.cpu_links.get("all_reduce") or d.cpu_links.get("all") or {}
        per_op = {op: (f["latency_s"], f["bytes_per_s"]) for op, f in d.cpu_links.items()
                  if op in stm.OPS}
        return stm.Network(stm.Link(base.get("latency_s", 0.0),
                                    base.get("bytes_per_s", float("inf")), per_op))
    return stm.Network(stm.Link(d.intra_latency_s or 0.0, d.intra_bytes_per_s),
                       stm.Link(d.inter_latency_s or 0.0, d.inter_bytes_per_s),
                       d.gpus_per_node)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def gib(nbytes: float) -> str:
    return f"{nbytes / mm.GIB:.1f} GiB"
