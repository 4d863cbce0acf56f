"""What a rank needs at its peak, not just model state + activations (issue 51, item 5):

    peak = runtime + state + comm + max(activations + backward transient, optimizer temps)
           + slack

each part below with where its number comes from (docs/plan.md repeats them):

- **runtime**: the runtime's own memory before and beside the model's tensors, per device
  kind. CPU: the *interpreter baseline* - Python and ddl as the planning process holds
  them when this module is first imported, before torch (~36 MB; :func:`interpreter_bytes`):
  about a forked local worker's private memory before its model (70-80 MB in all while
  training CIFAR tiny; torch's pages it shares with the launcher, paid once), less than a
  rank started as an interpreter of its own holds (torch privately: ~0.5 GB more) -
  plus what training itself adds there beyond any tensor of the model (autograd's engine,
  oneDNN's primitive caches, gloo's pairs and buffers, the loaders, evaluation):
  ``CPU_TRAINING_RUNTIME_BYTES``, measured (2 processes of MNIST tiny, whose tensors are
  1.5 MB: peak RSS 32.7 MiB above the RSS when the build began); under FSDP2 also
  ``CPU_FSDP_UNIT_BYTES`` per unit the rank holds (measured the same way). GPU: what the
  caching allocator never sees - the CUDA/HIP context with torch's kernels and cuBLAS/cuDNN
  handles, and NCCL/RCCL's own buffers: ``GPU_RUNTIME_BYTES``, round numbers from the
  libraries' documentation, not measured on a GPU yet (the GPU kit measures them:
  benchmarks/gpu_kit/plan_memory.py).
- **model state** and **activations**: ddl.planning.memory_model and plan_probe.
- **backward transient**: the backward's first gradients, beside everything still held:
  the gradient of the largest kept tensor and that of its input (the loss's log-softmax:
  2 x the largest kept storage of a stage, the probe's ``largest_bytes``).
- **optimizer temporaries** (at the step, when the activations are gone): measured from the
  workload's optimizer class on small real tensors (:func:`optimizer_temporaries`): torch
  picks the foreach implementation on GPUs and the per-tensor one on CPUs
  (``torch.optim.optimizer._default_to_fused_or_foreach``). AdamW per tensor keeps
  ``sqrt(v)`` and its quotient for one tensor at a time: measured 3 x the largest tensor
  (the last tensor's result still alive while the next is computed); foreach keeps
  ``sqrt(v)`` of all of them: 1 x the parameters' bytes. SGD without momentum: nothing.
- **communication buffers**: DDP's reducer holds a flat copy of the gradients in its
  buckets (ddl does not ask for ``gradient_as_bucket_view``): the rank's gradient bytes.
  FSDP2 gathers a unit's parameters (in ``param_dtype``) before its forward and prefetches
  the next one, and reduce-scatters its unsharded gradients (fp32): 2 x the largest unit's
  unsharded parameters + 1 x its gradients (the root's own parameters count as a unit). A
  pipeline stage's send and receive buffers: 2 x the hand-off.
- **slack**: what the allocator holds beyond what the tensors need. CPU (glibc malloc):
  ``CPU_SLACK`` of the model's part, measured; GPU (torch's caching allocator, reserved
  over allocated): ``GPU_SLACK``, assumed.

No torch at module level except under functions (``ddl plan --help`` does not import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from ddl.contract.host_memory import process_bytes

MIB, GIB = 1024 ** 2, 1024 ** 3

#: CPU: what a training process adds beyond its model's tensors after the build began
#: (MNIST tiny, 2 gloo processes, 2 epochs x 3 steps: 32.7 and 31.5 MiB; issue 51)
CPU_TRAINING_RUNTIME_BYTES = 32 * MIB
#: CPU: glibc's slack over the model's part (fitted on issue 51's runs, docs/plan.md)
CPU_SLACK = 0.25
#: CPU: what FSDP2 adds to a rank's runtime per unit it holds (its parameter group, hooks
#: and gather/reduce buffers, served from glibc's arenas): MNIST tiny's FSDP (3 units) peaked
#: 5.4 MiB above its DDP with the same tensors (issue 51's verify runs, docs/plan.md)
CPU_FSDP_UNIT_BYTES = 18 * MIB // 10
#: GPU: CUDA/HIP context with torch's kernels and the BLAS/DNN handles (~1 GiB with CUDA
#: 12's lazy loading on A100/H100) + NCCL/RCCL buffers (NCCL_BUFFSIZE 4 MiB per channel
#: and peer, up to 32 channels; ~0.5 GiB): outside the caching allocator. Assumed.
GPU_RUNTIME_BYTES = {"cuda": 3 * GIB // 2, "rocm": 3 * GIB // 2}
#: GPU: the caching allocator's reserved over allocated bytes. Assumed.
GPU_SLACK = 0.10


@dataclass(frozen=True)
class Peak:
    """One rank's predicted peak, by part (bytes)."""

    runtime_bytes: int
    interpreter_bytes: int  # the part of runtime a CPU run measures before its build
    model_state_bytes: int
    activation_bytes: int
    backward_transient_bytes: int
    optimizer_temp_bytes: int
    comm_buffer_bytes: int
    slack_bytes: int

    @property
    def tensors_bytes(self) -> int:
        """What the model's tensors need at once (a GPU's allocated peak)."""
        return (self.model_state_bytes + self.comm_buffer_bytes
                + max(self.activation_bytes + self.backward_transient_bytes,
                      self.optimizer_temp_bytes))

    @property
    def total_bytes(self) -> int:
        return self.runtime_bytes + self.tensors_bytes + self.slack_bytes

    def as_dict(self) -> dict[str, int]:
        return {"runtime_bytes": self.runtime_bytes,
                "interpreter_bytes": self.interpreter_bytes,
                "model_state_bytes": self.model_state_bytes,
                "activation_bytes": self.activation_bytes,
                "backward_transient_bytes": self.backward_transient_bytes,
                "optimizer_temp_bytes": self.optimizer_temp_bytes,
                "comm_buffer_bytes": self.comm_buffer_bytes,
                "slack_bytes": self.slack_bytes,
                "tensors_bytes": self.tensors_bytes,
                "total_bytes": self.total_bytes,
                "above_interpreter_bytes": self.total_bytes - self.interpreter_bytes}


def peak(device_kind: str, *, model_state_bytes: int, activation_bytes: int,
         largest_kept_bytes: int, optimizer_temp_bytes: int, comm_buffer_bytes: int,
         fsdp_units: int = 0) -> Peak:
    """``fsdp_units``: the FSDP2 units the rank holds (0 without FSDP2)."""
    if device_kind == "cpu":
        interpreter = interpreter_bytes()
        runtime = interpreter + CPU_TRAINING_RUNTIME_BYTES + fsdp_units * CPU_FSDP_UNIT_BYTES
        slack = CPU_SLACK
    else:
        interpreter, runtime = 0, GPU_RUNTIME_BYTES.get(device_kind, 0)
        slack = GPU_SLACK
    parts = Peak(runtime, interpreter, model_state_bytes, activation_bytes,
                 2 * largest_kept_bytes if activation_bytes else 0, optimizer_temp_bytes,
                 comm_buffer_bytes, 0)
    return Peak(**{**parts.__dict__, "slack_bytes": round(slack * parts.tensors_bytes)})


@cache
def interpreter_bytes() -> int:
    """This process's resident set when this module was first imported (Linux; else 0):
    Python and ddl, read before the planning process imports torch (the module's docstring
    says what that stands for). A run's own baseline, measured in the run, is what
    ``--verify`` subtracts. Read at import, before the plan's probes add their own."""
    return process_bytes("VmRSS") or 0


@dataclass(frozen=True)
class TempCost:
    """Optimizer temporaries at the step: ``per_total`` x the parameters' bytes (foreach)
    + ``per_largest`` x the largest tensor's bytes (per tensor)."""

    per_total: float = 0.0
    per_largest: float = 0.0

    def bytes(self, total: int, largest: int) -> int:
        return round(self.per_total * total + self.per_largest * largest)


def optimizer_temporaries(workload: Any, device_kind: str) -> TempCost:
    """The workload's optimizer stepped twice on two real 16 KiB tensors, the second step
    under a meter of every tensor it creates (live until freed): its high-water mark, per
    tensor (torch's default on a CPU) or over all (foreach, its default on GPUs)."""
    import torch

    n = 4096
    params = [torch.nn.Parameter(torch.zeros(n)) for _ in range(2)]
    optimizer = workload.optimizer(params, 1e-3)
    foreach = device_kind != "cpu"
    for group in optimizer.param_groups:
        if "foreach" in group:
            group["foreach"] = foreach
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()  # the state is created here (model state, not temporaries)
    with _Created() as created:
        optimizer.step()
    factor = created.peak / (n * 4)
    return TempCost(per_total=factor / 2) if foreach else TempCost(per_largest=factor)


class _Created:
    """The live bytes of the tensors ops create inside (a dispatch mode; real tensors)."""

    def __enter__(self):
        import weakref

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        meter = self
        self.live = self.peak = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                inputs = {t.untyped_storage().data_ptr() for t in tree_flatten(
                    (args, kwargs))[0] if isinstance(t, torch.Tensor)}
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if not isinstance(t, torch.Tensor):
                        continue
                    storage = t.untyped_storage()
                    if storage.data_ptr() in inputs or not storage.nbytes():
                        continue  # in place, or a view of an input
                    size = storage.nbytes()
                    meter.live += size
                    meter.peak = max(meter.peak, meter.live)
                    weakref.finalize(t, meter._free, size)
                return out

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def _free(self, size: int) -> None:
        self.live -= size

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        return False


def comm_buffers(layout: Any, *, grads_bytes: int, unit_bytes: int, boundary_bytes: int,
                 param_itemsize_ratio: float = 1.0) -> int:
    """Communication buffers a rank of ``layout`` holds at its peak (see the module's
    docstring): DDP's gradient buckets, FSDP2's gathered and prefetched unit and its
    unsharded gradients, a pipeline stage's send and receive buffers."""
    out = 0
    if layout.dp_shard > 1:
        out += round(2 * unit_bytes * param_itemsize_ratio) + unit_bytes
    elif layout.dp_replicate > 1:
        out += grads_bytes
    if layout.pp > 1:
        out += 2 * boundary_bytes
    return out


# --- a planner's candidate ------------------------------------------------------------------

@dataclass(frozen=True)
class _Held:
    """Per pipeline rank, bytes of what it holds before FSDP's shards (tp applied): the
    largest tensor, and the largest FSDP unit (the root's own parameters one unit)."""

    largest_tensor: list[int]
    largest_unit: list[int]
    units: list[int]  # FSDP units (the workload's ``fsdp_units`` held + the root)


def _held(planner: Any, layout: Any) -> _Held:
    from ddl.planning import memory_model as mm
    from ddl.planning import plan_probe as probe

    cache_ = planner.__dict__.setdefault("_peak_held", {})
    key = (layout.tp, layout.pp)
    if key in cache_:
        return cache_[key]
    workload, model = planner.workload, planner._copy()
    plan = workload.tp_plan(model) if layout.tp > 1 else {}
    unit_ids = {id(u) for u in workload.fsdp_units(model)}

    def local(params) -> list[int]:
        return [p.itemsize * mm.local_numel(p.shape, tp_dim=p.tp_dim, tp=layout.tp,
                                             tp_rank=0, shard=1, shard_rank=0)
                for p in params]

    largest, units, counts = [], [], []
    for parts in probe.stage_parts(workload, model, layout):
        every = local(probe.held_params(parts, plan))
        sizes = [sum(local(probe.held_params([m], plan))) for part in parts
                 for m in part.modules() if id(m) in unit_ids]
        largest.append(max(every, default=0))
        units.append(max(sizes + [sum(every) - sum(sizes)]))
        counts.append(len(sizes) + 1)
    cache_[key] = _Held(largest, units, counts)
    return cache_[key]


def _temps(planner: Any) -> TempCost:
    if "_peak_temps" not in planner.__dict__:
        try:
            planner._peak_temps = optimizer_temporaries(planner.workload, planner.device.kind)
        except Exception:  # noqa: BLE001 - an optimizer that will not step here: unknown
            planner._peak_temps = TempCost()
    return planner._peak_temps


def rank_peak(planner: Any, candidate: Any, state: dict[str, int], activation_bytes: int,
              pp_rank: int, one: Any, two: Any) -> Peak:
    """The peak of one rank of ``candidate`` (a layout_search.Candidate) as ``planner``
    (a ddl.planning.planner.Planner) predicts it: ``state`` its model-state fields,
    ``one``/``two`` the probe's activations at 1 and 2 samples per forward."""
    layout = candidate.layout
    per_forward = candidate.micro_batch // candidate.microbatches

    def at(a: int, b: int) -> int:  # linear in the samples per forward, as the activations
        return max(0, round(a + (per_forward - 1) * (b - a)))

    largest_kept = at(*(x[pp_rank] if len(x) > pp_rank else 0
                        for x in (one.largest_bytes, two.largest_bytes)))
    held = _held(planner, layout)
    options = candidate.strategy_options()
    ratio = 0.5 if options.get("param_dtype") in ("bf16", "fp16") else 1.0
    comm = comm_buffers(layout, grads_bytes=state["grads_bytes"],
                        unit_bytes=held.largest_unit[pp_rank],
                        boundary_bytes=at(one.boundary_bytes, two.boundary_bytes),
                        param_itemsize_ratio=ratio)
    temps = _temps(planner).bytes(state["params_bytes"],
                                  -(-held.largest_tensor[pp_rank] // layout.dp_shard))
    from ddl.planning.layout_search import uses_fsdp

    return peak(planner.device.kind, model_state_bytes=state["model_state_bytes"],
                activation_bytes=activation_bytes, largest_kept_bytes=largest_kept,
                optimizer_temp_bytes=temps, comm_buffer_bytes=comm,
                fsdp_units=held.units[pp_rank] if uses_fsdp(layout) else 0)


interpreter_bytes()  # now: before any probe of the planning process
