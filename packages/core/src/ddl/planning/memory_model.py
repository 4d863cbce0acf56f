"""Memory per rank under a parallel layout, as arithmetic on tensor shapes (no torch).

What a rank keeps between steps is its *model state*: parameters, their gradients and the
optimizer's state. Each follows from the full shapes of the model's parameters (a
meta-device build gives them for free: ddl.planning.plan_probe) and the layout:

- a pipeline rank holds only the parameters of its stages (the probe lists them per rank);
- tensor parallel splits the tensors of the workload's ``tp_plan`` on one dimension over
  ``tp`` ranks (DTensor ``Shard(dim)``, torch.chunk rule below);
- FSDP2 splits every parameter this rank holds once more, on dim 0 of what tensor parallel
  left, over ``dp_shard`` ranks (torch.chunk rule again; HSDP replicates those shards over
  ``dp_replicate``; DDP: dp_shard = 1, nothing split);
- gradients are the size of the parameters they belong to (fp32 parameters, fp32 gradients:
  FSDP2's mixed precision casts the gathered copies, not the shards);
- optimizer state per tensor is ``factor x its bytes + fixed`` bytes, measured from the
  workload's own optimizer class (Adam(W): 2 moments and a 4-byte ``step`` tensor; SGD
  without momentum: nothing; ddl.planning.plan_probe.optimizer_cost).

The torch.chunk rule matters for small tensors: ``torch.chunk(t, n)`` cuts pieces of
``ceil(d / n)`` rows, so 5 rows over 4 ranks are 2, 2, 1 and nothing - not 2, 1, 1, 1.
FSDP2 pads its flat buffers to equal shards, but a rank's sharded parameter (what
``ddl.worker.memory`` counts) is the unpadded chunk.

Activations and the rest of a device's memory are added in :func:`device_total`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GIB = 1024 ** 3

#: Bytes a device loses before the model's tensors: the CUDA/HIP context, cuBLAS/hipBLAS
#: workspaces, NCCL/RCCL buffers and the caching allocator's slack. A first, round
#: estimate (a CUDA context alone is ~0.3-0.5 GiB on an A100; NCCL's buffers grow with the
#: number of peers), to be replaced by what `ddl doctor` measures on a node.
RUNTIME_RESERVE_BYTES = {"cuda": 2 * GIB, "rocm": 2 * GIB, "cpu": 0}


@dataclass(frozen=True)
class ParamShape:
    """One parameter as the probe sees it: full shape, bytes per element, and the dimension
    tensor parallel splits (None: replicated over the tp ranks)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int = 4
    tp_dim: int | None = None


@dataclass(frozen=True)
class OptimizerCost:
    """State bytes of one parameter tensor: ``factor x its local bytes + fixed``."""

    factor: float = 0.0
    fixed: int = 0

    def state_bytes(self, local_bytes: int) -> int:
        return round(self.factor * local_bytes) + self.fixed


@dataclass(frozen=True)
class ModelState:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int

    @property
    def model_state_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def as_dict(self) -> dict[str, int]:
        return {"params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes,
                "model_state_bytes": self.model_state_bytes}


def chunk_size(length: int, parts: int, index: int) -> int:
    """Length of piece ``index`` of ``torch.chunk`` over ``parts`` (0 past the last piece)."""
    if parts == 1:
        return length
    step = -(-length // parts)  # ceil
    return max(0, min(step, length - index * step))


def local_numel(shape: tuple[int, ...], *, tp_dim: int | None, tp: int, tp_rank: int,
                shard: int, shard_rank: int) -> int:
    """Elements one rank holds of a tensor of ``shape``: tensor parallel's piece on
    ``tp_dim``, then FSDP's piece of that on dim 0."""
    dims = list(shape)
    if tp > 1 and tp_dim is not None and dims:
        dims[tp_dim] = chunk_size(dims[tp_dim], tp, tp_rank)
    if shard > 1 and dims:
        dims[0] = chunk_size(dims[0], shard, shard_rank)
    n = 1
    for d in dims:
        n *= d
    return n


def model_state(params: Iterable[ParamShape], optimizer: OptimizerCost, *, tp: int = 1,
                tp_rank: int = 0, dp_shard: int = 1, shard_rank: int = 0) -> ModelState:
    """Model state of one rank holding ``params`` (its pipeline stages' parameters)."""
    p = g = o = 0
    for param in params:
        local = param.itemsize * local_numel(param.shape, tp_dim=param.tp_dim, tp=tp,
                                             tp_rank=tp_rank, shard=dp_shard,
                                             shard_rank=shard_rank)
        p += local
        g += local
        o += optimizer.state_bytes(local)
    return ModelState(p, g, o)


def in_flight(schedule: str, microbatches: int, pp: int, pp_rank: int = 0) -> int:
    """Micro-batches whose activations a pipeline rank with one stage holds at once: GPipe
    runs every forward before any backward (all m); 1F1B starts backwards after
    pp - rank - 1 warm-up forwards, so it holds pp - rank (rank 0 the most). No pipeline: 1.
    Measured to the byte (the meter's high-water mark, tests/distributed/
    test_equivalence_matrix.py). Schedules with several stages per rank:
    :func:`pipeline_peak` on their compute order."""
    if pp == 1:
        return 1
    if schedule == "gpipe" or schedule == "looped_bfs":
        return microbatches
    return min(microbatches, pp - pp_rank)


def single_stage_actions(schedule: str, microbatches: int, pp: int, pp_rank: int
                         ) -> list[tuple[str, int]]:
    """A one-stage-per-rank schedule's compute order on ``pp_rank`` (its stage index =
    ``pp_rank``), as torch.distributed.pipelining runs it: ("F", stage) a forward, ("B",
    stage) a full backward, one entry per micro-batch (GPipe and 1F1B)."""
    if schedule == "gpipe" or pp == 1:
        return [("F", pp_rank)] * microbatches + [("B", pp_rank)] * microbatches
    if schedule != "1f1b":
        raise ValueError(f"{schedule}: not a one-stage-per-rank schedule (gpipe, 1f1b)")
    warm = min(microbatches, pp - 1 - pp_rank)
    steady = microbatches - warm
    return ([("F", pp_rank)] * warm + [("F", pp_rank), ("B", pp_rank)] * steady
            + [("B", pp_rank)] * warm)


def pipeline_peak(actions: Iterable[tuple[str, int]], stage_bytes: dict[int, float]) -> float:
    """The most a pipeline rank holds for backward at once, walking its compute order
    (``actions``: (kind, stage index)): a forward ("F") of stage s keeps ``stage_bytes[s]``
    (one micro-batch's) until its full backward ("B") or, split as zero-bubble schedules
    split it, until its weight backward ("W": the input backward "I" keeps the graph for
    it, ``retain_graph``)."""
    held = peak = 0.0
    for kind, stage in actions:
        if kind == "F":
            held += stage_bytes[stage]
            peak = max(peak, held)
        elif kind in ("B", "W"):
            held -= stage_bytes[stage]
    return peak


def size_text(nbytes: float) -> str:
    """Bytes as `ddl plan` prints them: GiB from 1 GiB, else MiB or KiB (a tiny CPU
    model's state is kilobytes, not "0.0 GiB")."""
    for unit, size in (("GiB", GIB), ("MiB", 1024 ** 2)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes / 1024:.1f} KiB"


def device_total(model_state_bytes: int, activation_bytes: int, device_kind: str) -> int:
    """What one device needs: model state, the activations of a step, the runtime reserve."""
    return model_state_bytes + activation_bytes + RUNTIME_RESERVE_BYTES.get(device_kind, 0)
