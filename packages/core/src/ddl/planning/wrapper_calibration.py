"""What the parallel wrappers' own host work adds to a step on a CPU (issue 51, item 2):
the part of a wrapped step that neither the plain model's passes
(ddl.planning.cpu_calibration) nor the links' fits (``ddl doctor --collectives`` times
bare collectives) hold, and that decides small models' layouts: FSDP2's hooks, its
all-gathers' copies in and out and DTensor's dispatch in the optimizer (MNIST tiny, 32
samples: its 3 units added ~9 ms to an ~8 ms step on this 2-core VM; CIFAR tiny's 5 units
~16 ms to ~21 ms), DDP's buckets, tensor parallel's DTensor dispatch per operator, and a
pipeline schedule's bookkeeping per micro-batch (``_pipeline_runs``).

The workload's real model is wrapped as ddl's strategies wrap it (ddl_strategies.ddp;
.fsdp: each ``fsdp_units`` unit, then the root; .tp: the workload's ``tp_plan``) in a
process group of ONE rank, where the collectives move nothing, and timed beside the
plain model. The step-time model (ddl.planning.step_time_model, ``CpuCosts.wrappers``)
charges FSDP2's per unit a rank holds and per pass, DDP's and tensor parallel's per pass,
and each once per optimizer step.

Torch is imported inside the functions only.
"""

from __future__ import annotations

import copy
import statistics
import time

REPEATS = 3  # rounds of each model's pass and step: 2 x REPEATS + 1, medians
PIPELINE_MICROBATCHES = 4  # the one-stage schedule's micro-batches (a batch of 8: 2 each)


def wrapper_costs(workload, model, inputs, targets) -> dict[str, dict[str, float]]:
    """``{"ddp": {"pass_s", "optimizer_s"}, "fsdp": {"pass_s" (per FSDP unit),
    "optimizer_s", "units"}, "tp": {...}}`` (tp only for a workload with a ``tp_plan``):
    each wrapped median less the plain one (at least 0); a wrapper the model refuses is
    left out.
    Measured in a forked child, so the planning process keeps no process group and no
    gloo threads (a launcher with threads could not fork its fork server,
    ddl.launch.fork_server); {} where that fails (the plan then counts no wrapper cost)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_wrapper_child,
                            args=(send, workload, model, inputs, targets), daemon=True)
    try:
        child.start()
        send.close()
        result = receive.recv() if receive.poll(300) else {}
    except (OSError, EOFError):
        result = {}
    finally:
        receive.close()
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    return result if isinstance(result, dict) else {}


def _wrapper_child(send, workload, model, inputs, targets) -> None:
    """The forked child of :func:`wrapper_costs`: sends the costs (or {} on any error)."""
    result: dict[str, dict[str, float]] = {}
    try:
        result = _time_wrappers(workload, model, inputs, targets)
    except Exception:  # noqa: BLE001 - a model these wrappers refuse: no wrapper costs
        result = {}
    finally:
        send.send(result)
        send.close()


def _time_wrappers(workload, model, inputs, targets) -> dict[str, dict[str, float]]:
    """The three models' passes and optimizer steps timed in turns (a burst of other work
    then lands on all three alike), in CPU time of this single-threaded process (what
    the wrappers cost, not what the machine's other processes took meanwhile)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from torch.nn.parallel import DistributedDataParallel

    # ddl_strategies.tp's styles (a plugin the core may not import)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        runs, units = {}, 1
        for kind in ("plain", "ddp", "fsdp", "tp"):
            wrapped = copy.deepcopy(model)
            try:
                if kind == "ddp":
                    wrapped = DistributedDataParallel(wrapped)
                elif kind == "fsdp":  # as ddl_strategies.fsdp.shard: units, then the root
                    held = workload.fsdp_units(wrapped)
                    for unit in held:
                        fully_shard(unit, mesh=mesh)
                    fully_shard(wrapped, mesh=mesh)
                    units = len(held) + 1
                elif kind == "tp":  # as ddl_strategies.tp: the workload's plan, DTensor
                    plan = workload.tp_plan(wrapped)
                    if not plan:
                        continue
                    workload.prepare_tensor_parallel(wrapped, 1)
                    parallelize_module(wrapped, mesh, {path: styles[style]()
                                                       for path, style in plan.items()})
                optimizer = workload.optimizer([p for p in wrapped.parameters()
                                                if p.requires_grad], 1e-3)

                def one_pass(wrapped=wrapped):
                    workload.loss(workload.forward(wrapped, inputs), targets).backward()

                def step(optimizer=optimizer):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=False)

                one_pass()  # warm-up
                step()
            except Exception:  # noqa: BLE001 - a wrapper this model refuses: not priced
                if kind == "plain":
                    raise
                continue
            runs[kind] = (one_pass, step)
        chunks = _pipeline_runs(workload, model, inputs, targets)
        runs.update(chunks)
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in runs}
        for _ in range(2 * REPEATS + 1):
            for kind, (one_pass, step) in runs.items():
                for fn, out in zip((one_pass, step), times[kind]):
                    t0 = time.process_time()
                    fn()
                    out.append(time.process_time() - t0)
    finally:
        dist.destroy_process_group()
    median = {k: (statistics.median(p), statistics.median(s)) for k, (p, s) in times.items()}
    out = {kind: {"pass_s": max(median[kind][0] - median["plain"][0], 0.0),
                  "optimizer_s": max(median[kind][1] - median["plain"][1], 0.0)}
           for kind in median if kind not in ("plain", "chunks", "pipeline")}
    if "pipeline" in median:  # per micro-batch, against the same micro-batches unpiped
        out["pipeline"] = {"pass_s": max(median["pipeline"][0] - median["chunks"][0], 0.0)
                           / PIPELINE_MICROBATCHES, "optimizer_s": 0.0}
    if "fsdp" in out:
        out["fsdp"].update(pass_s=out["fsdp"]["pass_s"] / units, units=float(units))
    return out


def _pipeline_runs(workload, model, inputs, targets) -> dict:
    """``{"pipeline": (pass, step), "chunks": (pass, step)}``: torch.distributed.pipelining's
    1F1B running the whole model as ONE stage on the one-rank group, and the same
    micro-batches through the plain model one after another; the difference is the
    schedule's own host work per step (its chunking, buffers, per-micro-batch stage calls),
    which every rank of a real pipeline pays on top of its stage's compute. {} for a model
    whose inputs are not one tensor (a dict of token ids: the stage is the workload's
    ``pipeline_stages`` then, not timed here) or that the schedule refuses."""
    import torch
    from torch.distributed import pipelining

    m = PIPELINE_MICROBATCHES
    if not isinstance(inputs, torch.Tensor) or inputs.shape[0] % m:
        return {}
    piped = copy.deepcopy(model)
    try:
        stage = pipelining.PipelineStage(piped, 0, 1, torch.device("cpu"))
        schedule = pipelining.Schedule1F1B(stage, m, loss_fn=workload.loss, scale_grads=False)

        def pipe():
            schedule.step(inputs, target=targets, losses=[])

        def chunks():
            for part, target in zip(inputs.chunk(m), targets.chunk(m)):
                workload.loss(workload.forward(piped, part), target).backward()

        for fn in (pipe, chunks):  # warm-up
            fn()
    except Exception:  # noqa: BLE001 - a model this schedule refuses: not priced
        return {}
    return {"pipeline": (pipe, lambda: None), "chunks": (chunks, lambda: None)}
