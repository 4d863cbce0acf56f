"""What ``ddl plan`` needs to know about a workload, found without training it: the
parameters each rank of a layout holds, what its optimizer keeps per parameter, and the
bytes a micro-batch keeps for the backward pass.

Everything runs on the meta device (shapes, no memory, no arithmetic), so a 3-billion-
parameter T5 costs what a tiny one costs: the model is built there, cut into the
pipeline stages the strategy would cut (``Workload.pipeline_stages``), its tensor-parallel
plan is read for which tensors split on which dimension, and one forward pass of a
micro-batch runs there under ddl's saved-tensor meter (ddl.worker.observe.activation_memory), with
the activation checkpointing a run would apply. Tensor parallel's activations are those of
one tp rank: the planned layers are narrowed to their local width first (colwise: output
features / tp; rowwise: input features / tp), as each rank computes. The arithmetic on the
shapes is ddl.planning.memory_model.

What the probe must reproduce of a run, found measuring the equivalence matrix (issue 41):

* ``--sync-bn`` on a CPU replaces BatchNorm by ddl.worker.build.sync_bn's float64 layer, which
  keeps the input's float64 copy and its centred, scaled intermediates: 700 268 bytes
  where plain BatchNorm keeps 420 612 in CIFAR's tiny ResNet at 8 samples (1.66x), and
  19.3 MB for 7.79 MB in Imagewoof's tiny-exact xresnet (2.48x). The meta-device forward
  of the same plain model counts to the byte what the CPU kernels keep; the probe converts
  as the run converts (``sync_bn``). torch's SyncBatchNorm (GPUs) keeps what plain
  BatchNorm keeps.
* A pipeline rank holds the micro-batches its schedule keeps in flight, per stage: the
  order of the rank's forwards and backwards (:func:`pipeline_actions`: GPipe and 1F1B
  from ddl.planning.memory_model, the multi-stage schedules from torch's own classes)
  walked with each stage's bytes per micro-batch (:func:`rank_activation_bytes`).
* A workload that trims each batch to its content (xsum: to the longest sequence) is
  probed untrimmed, at the preset's full lengths (:func:`sample_batch`): a bound no batch
  of the run exceeds. The matrix test probes the batches each rank measured instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddl.contract.errors import DataError
from ddl.contract.layout import ParallelLayout
from ddl.contract.workload import Workload
from ddl.planning.memory_model import OptimizerCost, ParamShape, model_state
from ddl.planning.pipeline_schedule import pipeline_actions, rank_activation_bytes  # noqa: F401
from ddl.planning import attention_probe, autocast_probe
from ddl.worker.build import activation_checkpointing
from ddl.worker.observe.activation_memory import SavedTensorMeter

# (style, module type) -> the dimension DTensor shards the weight / bias on
# (torch.distributed.tensor.parallel: ColwiseParallel, RowwiseParallel)
_WEIGHT_DIM = {("colwise", nn.Linear): 0, ("rowwise", nn.Linear): 1,
               ("colwise", nn.Embedding): 1, ("rowwise", nn.Embedding): 0}
_BIAS_DIM = {"colwise": 0, "rowwise": None}


def meta_model(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def planned_modules(model: nn.Module, plan: dict[str, str]) -> dict[int, str]:
    """id(module) -> style for every module a tp plan pattern matches (fnmatch per path
    component, as ``parallelize_module`` reads plan keys)."""
    found: dict[int, str] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        for path, style in plan.items():
            pattern = path.split(".")
            if name and len(pattern) == len(parts) and all(map(fnmatch, parts, pattern)):
                found[id(module)] = style
    return found


def held_params(parts: list[nn.Module], plan: dict[str, str]) -> list[ParamShape]:
    """The parameters a rank holding ``parts`` (its stages, or the whole model) keeps, each
    once (tied weights are one tensor), with the dimension tensor parallel splits."""
    seen: set[int] = set()
    out: list[ParamShape] = []
    for part in parts:
        styles = planned_modules(part, plan)
        for path, module in part.named_modules():
            style = styles.get(id(module))
            for pname, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                dim = None
                if style is not None:
                    kind = next((t for s, t in _WEIGHT_DIM if s == style
                                 and isinstance(module, t)), None)
                    dim = _WEIGHT_DIM.get((style, kind)) if pname == "weight" else \
                        _BIAS_DIM[style] if pname == "bias" else None
                out.append(ParamShape(f"{path}.{pname}".lstrip("."), tuple(param.shape),
                                      param.element_size(), dim))
    return out


def optimizer_cost(workload: Workload, lr: float = 1e-3) -> OptimizerCost:
    """The workload's optimizer measured on two small tensors after one step: state bytes
    = factor x parameter bytes + fixed bytes per tensor (Adam: 2 x + a 4-byte step)."""
    params = [nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(5))]
    optimizer = workload.optimizer(params, lr)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()

    def state(p: torch.Tensor) -> int:
        return sum(v.numel() * v.element_size() for v in optimizer.state.get(p, {}).values()
                   if isinstance(v, torch.Tensor))

    small, big = state(params[0]), state(params[1])
    factor = (big - small) / (4 * 4)  # bytes per parameter byte (4 more fp32 elements)
    return OptimizerCost(factor=factor, fixed=round(small - 4 * factor))


def stage_parts(workload: Workload, model: nn.Module, layout: ParallelLayout,
                stages_per_rank: int = 1) -> list[list[nn.Module]]:
    """Per pipeline rank, the stage modules it holds (rank r: stages r, r + pp, ...)."""
    if layout.pp == 1:
        return [[model]]
    n_stages = layout.pp * stages_per_rank
    stages = workload.pipeline_stages(model, n_stages)
    return [[stages[i] for i in range(r, n_stages, layout.pp)] for r in range(layout.pp)]


def model_state_per_rank(workload: Workload, model: nn.Module, layout: ParallelLayout,
                         cost: OptimizerCost, stages_per_rank: int = 1) -> list[dict[str, int]]:
    """Predicted ``memory_per_rank`` model-state fields, in rank order."""
    plan = workload.tp_plan(model) if layout.tp > 1 else {}
    held = [held_params(parts, plan) for parts in stage_parts(workload, model, layout,
                                                                  stages_per_rank)]
    out = []
    for rank in range(layout.world_size):
        at = layout.coordinates(rank)
        state = model_state(held[at["pp"]], cost, tp=layout.tp, tp_rank=at["tp"],
                            dp_shard=layout.dp_shard, shard_rank=at["dp_shard"])
        out.append(state.as_dict())
    return out


# --- activations ---------------------------------------------------------------------------

def narrow_for_tp(workload: Workload, model: nn.Module, tp: int) -> None:
    """Make ``model`` (on the meta device) compute what one of ``tp`` ranks computes: each
    planned layer keeps 1/tp of its split dimension; head counts follow
    (``Workload.prepare_tensor_parallel``)."""
    styles = planned_modules(model, workload.tp_plan(model))
    for module in model.modules():
        style = styles.get(id(module))
        if style is None:
            continue
        dim = _WEIGHT_DIM.get((style, type(module)))
        if dim is None:
            continue
        shape = list(module.weight.shape)
        shape[dim] = -(-shape[dim] // tp)
        module.weight = nn.Parameter(torch.empty(shape, device="meta"))
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = shape
            if module.bias is not None and style == "colwise":
                module.bias = nn.Parameter(torch.empty(shape[0], device="meta"))
        else:
            module.num_embeddings, module.embedding_dim = shape
    workload.prepare_tensor_parallel(model, tp)


def to_meta(tree: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, tree)


@dataclass(frozen=True)
class Activations:
    """Bytes kept for backward by one forward pass of a micro-batch, per pipeline stage
    (one entry without a pipeline); and what crosses the network with it: the largest
    stage output (a pipeline hand-off) and the outputs of the row-parallel layers (tensor
    parallel all-reduces them, one call per layer: ``rowwise_layers``). ``stage_flops``:
    each pipeline stage's forward FLOPs (torch's FlopCounterMode: matrix products and
    convolutions), which the step-time model's slowest stage is read from.
    ``largest_bytes``: per stage, the largest single tensor kept (ddl.planning.peak_model:
    the backward's first gradients are about its size)."""

    per_stage: list[int]
    boundary_bytes: int = 0
    rowwise_bytes: int = 0
    rowwise_layers: int = 0
    stage_flops: tuple[float, ...] = ()
    largest_bytes: tuple[int, ...] = ()


def _nbytes(tree: Any) -> int:
    from torch.utils._pytree import tree_flatten

    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0]
               if isinstance(t, torch.Tensor))


def activation_bytes(workload: Workload, model: nn.Module, inputs: Any, targets: Any, *,
                     tp: int = 1, n_stages: int = 1, checkpointing: str = "none",
                     sync_bn: bool = False, device_type: str = "cuda",
                     precision: str = "fp32") -> Activations:
    """Run ``inputs`` (a micro-batch as ``Workload.to_device`` gives it, on the meta
    device) through ``model`` (built on the meta device, consumed: it is narrowed and
    checkpointed in place) and count what each stage saves for backward. ``sync_bn``:
    the run's ``--sync-bn`` on a ``device_type`` device, converted as the run converts
    (ddl.worker.build.sync_bn): on a CPU its float64 BatchNorm keeps more (the whole model's
    activations: 1.66x in cifar tiny, 2.48x in imagewoof tiny-exact); torch's
    SyncBatchNorm (GPUs) keeps what plain BatchNorm keeps, so the probe leaves plain
    BatchNorm there (torch's refuses the meta device). ``precision`` bf16/fp16: the
    forward runs on fake ``device_type`` tensors under torch's autocast
    (ddl.planning.autocast_probe). ``scaled_dot_product_attention`` runs the fused kernel
    a ``device_type`` run would pick, not the meta device's math path
    (ddl.planning.attention_probe)."""
    if sync_bn:
        from ddl.worker.build import sync_bn as sync

        if device_type not in sync.TORCH_SYNC_DEVICES:
            model, _ = sync.convert(model, torch.device(device_type))
    rowwise = [0, 0]  # bytes, calls
    if tp > 1:
        narrow_for_tp(workload, model, tp)
        styles = planned_modules(model, workload.tp_plan(model))

        def count(_m, _i, out):
            rowwise[0] += _nbytes(out)
            rowwise[1] += 1

        for module in model.modules():
            if styles.get(id(module)) == "rowwise":
                module.register_forward_hook(count)
    units = workload.fsdp_units(model)
    if checkpointing != "none":
        activation_checkpointing.apply(units, checkpointing)
    kind = "cpu" if device_type == "cpu" else "cuda"
    with autocast_probe.fake_device(model, (inputs, targets), precision, kind) as batch, \
            attention_probe.fused_attention(kind):
        return _forward(workload, model, *batch, n_stages, rowwise,
                        count_flops=checkpointing == "none")


def _forward(workload: Workload, model: nn.Module, inputs: Any, targets: Any, n_stages: int,
             rowwise: list[int], count_flops: bool = True) -> Activations:
    """One forward of the micro-batch (and the loss) under the meter, per stage; with
    ``count_flops`` each stage's FLOPs too (torch's counter does not see into selective
    checkpointing's own dispatch mode, so only probes without checkpointing count)."""
    import contextlib

    model.train()
    if n_stages == 1:
        meter = SavedTensorMeter()
        with meter.measure():
            workload.loss(workload.forward(model, inputs), targets)
        return Activations([meter.peak_bytes], rowwise_bytes=rowwise[0],
                           rowwise_layers=rowwise[1], largest_bytes=(meter.largest_bytes,))
    stages = workload.pipeline_stages(model, n_stages)
    args = tuple(inputs.values()) if isinstance(inputs, dict) else (inputs,)
    from torch.utils.flop_counter import FlopCounterMode

    per_stage, boundary, flops, largest = [], 0, [], []
    for i, stage in enumerate(stages):
        stage.train()
        # a stage's inputs arrive from its neighbour as fresh tensors that need gradients
        args = tuple(a.detach().requires_grad_(a.is_floating_point()) if i else a
                     for a in args)
        meter = SavedTensorMeter()
        counter = FlopCounterMode(display=False) if count_flops else None
        with meter.measure(), counter or contextlib.nullcontext():
            out = stage(*args)
            if i == n_stages - 1:
                workload.loss(out, targets)
        per_stage.append(meter.peak_bytes)
        largest.append(meter.largest_bytes)
        if counter is not None:
            flops.append(float(counter.get_total_flops()))
        args = out if isinstance(out, tuple) else (out,)
        if i < n_stages - 1:
            boundary = max(boundary, _nbytes(args))
    return Activations(per_stage, boundary, rowwise[0], rowwise[1], tuple(flops),
                       tuple(largest))


def recompute_shares(workload: Workload, model: nn.Module, inputs: Any, targets: Any
                     ) -> dict[str, float]:
    """The share of a forward pass's FLOPs that each activation checkpointing mode runs
    again in the backward (the step-time model's ``Sizes.recompute``), from one forward
    of ``model`` (on the meta device, consumed) without checkpointing: every op counted,
    matrix products and convolutions by torch's FLOP formulas
    (torch.utils.flop_counter), any other op at one FLOP per output element. ``full``
    recomputes every op inside the workload's checkpointed units (``fsdp_units``);
    ``selective`` only their ops outside ddl's save list (ddl.worker.
    activation_checkpointing: norms, activations, dropout, additions)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    save = {op.overloadpacket for op in activation_checkpointing._SAVE}
    depth = [0]
    total = {"all": 0.0, "full": 0.0, "selective": 0.0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            if packet in flop_registry:
                flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            else:
                flops = float(sum(t.numel() for t in tree_flatten(out)[0]
                                  if isinstance(t, torch.Tensor)))
            total["all"] += flops
            if depth[0]:
                total["full"] += flops
                if packet not in save:
                    total["selective"] += flops
            return out

    def enter(*_):
        depth[0] += 1

    def leave(*_):
        depth[0] -= 1

    handles = []
    for unit in workload.fsdp_units(model):
        handles += [unit.register_forward_pre_hook(enter), unit.register_forward_hook(leave)]
    model.train()
    try:
        with Count():
            workload.loss(workload.forward(model, inputs), targets)
    finally:
        for handle in handles:
            handle.remove()
    if not total["all"]:
        return {}
    return {"none": 0.0, "selective": total["selective"] / total["all"],
            "full": total["full"] / total["all"]}


def batch_source(workload: Workload, data_dir: Path, tmp: Path) -> Path:
    """Where a sample batch is read: the data if it is there, else a synthetic stand-in in
    the same format (only shapes matter: the batch runs on the meta device)."""
    try:
        workload.check_data(data_dir)
        return data_dir
    except (DataError, OSError):  # missing, or not readable here
        workload.prepare(tmp, synthetic=True)
        return tmp


def tile_batch(batch: Any, size: int) -> Any:
    """``batch`` cut or repeated along dim 0 to ``size`` samples (on the meta device a
    micro-batch of any size costs nothing; only its shape matters)."""
    from torch.utils._pytree import tree_map

    def tile(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        reps = -(-size // t.shape[0])
        return t.repeat(reps, *([1] * (t.dim() - 1)))[:size]

    return tree_map(tile, batch)


def sample_batch(workload: Workload, data_dir, size: int, *, longest: bool = True,
                 train: Any = None) -> tuple[Any, Any]:
    """A micro-batch of ``size`` training samples from the workload's data, as its
    ``to_device`` gives it, then moved to the meta device. ``longest``: a workload that
    trims each batch to its content (``trim_batches``, xsum: to the longest sequence) is
    asked for it untrimmed, at the preset's full lengths - the largest batch it can
    deliver, so what is predicted from it is a bound no batch exceeds. ``train``: the
    workload's training set when the caller holds it already (else read from
    ``data_dir``: xsum tokenizes every article there, each time)."""
    from torch.utils.data import DataLoader

    if train is None:
        train = workload.datasets(data_dir)["train"]
    first = next(iter(DataLoader(train, batch_size=min(size, len(train)), shuffle=False)))
    return device_batch(workload, tile_batch(first, size), trim=not longest)


def device_batch(workload: Workload, batch: Any, *, trim: bool = True) -> tuple[Any, Any]:
    """``batch`` (as the loader collates it) through the workload's ``to_device`` on the
    CPU, trimmed as a run trims it or (``trim=False``) not, moved to the meta device."""
    trims = getattr(workload, "trim_batches", None)
    if trims is not None and not trim:
        workload.trim_batches = False
    try:
        inputs, targets = workload.to_device(batch, torch.device("cpu"))
    finally:
        if trims is not None:
            workload.trim_batches = trims
    return to_meta(inputs), to_meta(targets)
