"""``ddl doctor --collectives``: time all-reduce, all-gather, reduce-scatter and
point-to-point between processes on this node and fit the alpha-beta model of
ddl.planning.step_time_model to them.

N processes (spawned: a CUDA driver must not be forked) join one process group over
127.0.0.1 - gloo on CPUs, NCCL on GPUs, one GPU each - with the rendezvous store opened by
the parent on a port the kernel picks (``port=0``: nothing to race for). Each rank runs one
thread, as ddl's CPU workers do when there are as many ranks as cores. For every operation
and message size: two warm-up calls, then ``repeats`` timings of ``inner`` calls (10, or 2
from 1 MiB); a timing is the slowest rank's (a collective ends when its last rank is
done), the size's time the mean timing / ``inner`` (a training run pays the mean, its slow
calls included), the slowest of the ``repeats`` timings left out when there are 3 or more
(:func:`size_time`: one burst of other work decided a size's mean once). On a CPU each
call is timed alone, after 1 ms of compute on the rank's thread, as a training step's
collective follows its backward: a thread woken from a busy core is slower to answer than
one that waits in a tight loop of collectives (``COMPUTE_S``). On a GPU the calls run back
to back with one synchronisation at the end. Sizes are the bytes of the whole buffer (the
all-reduced tensor, the all-gather's output, the reduce-scatter's input, one message).
Point-to-point is a ring shift: every rank sends to the next and receives from the previous
at once, as the stages of a pipeline do.

The fit (``ddl.planning.alpha_beta_fit``) weighs every size by its relative error, so
the small messages decide alpha and the large ones beta.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Any

from ddl.planning import alpha_beta_fit
from ddl.planning import step_time_model as stm

KIB, MIB = 1024, 1024 ** 2
CPU_SIZES = (4 * KIB, 64 * KIB, 512 * KIB, 4 * MIB, 16 * MIB)
GPU_SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
TIMEOUT_S = 120.0
# CPU: each timed call comes after this much compute on the rank's thread, as in training.
# Timed back to back instead, a gloo collective on a 2-core VM measured 0.25 ms typical but
# 1.1 ms mean (one call in five waited a 4 ms scheduler tick to wake), and a DDP step paid
# 1.5-1.8 ms per 24 KB all-reduce: the wake-up after compute is part of the cost.
COMPUTE_S = 0.001
# CPU: the compute lengths (and repeats) of the skew measurement (_skew): a short one like
# the probe's, and one as long as a small model's step (MNIST tiny: ~5 ms). Its value
# varies 0.1-0.36 between runs on a 2-core VM at 30 repeats, 0.14-0.20 at 100 (1.2 s); two
# other designs (four lengths, and the lengths taking turns) read lower, 0.08-0.21, where
# a DDP step of MNIST tiny paid 0.3-0.5 per second of compute (2026-11-30): 60 repeats.
SKEW_COMPUTE_S = (0.001, 0.008)
SKEW_REPEATS = 60
# The slope divides by the two blocks' time difference: when other work slows the short
# block (seen under load: 1.87 against 0.77 ms for the 8x longer one), it reads anything.
# A measurement whose long block took under SKEW_MIN_SPAN x the short one's time is taken
# again, up to SKEW_ATTEMPTS times; after that it is kept as unreliable (not cached).
SKEW_MIN_SPAN = 4.0
SKEW_ATTEMPTS = 3


def size_time(timings: list[float]) -> float:
    """One message size's time from its repeated timings: their mean (a run pays its slow
    calls too), without the slowest of three or more. Under a busy moment one timing of a
    16 MiB reduce-scatter read 0.125 s against ~0.03 s for the rest, in a CI run beside
    other tests: the mean of five was four times the size's usual time."""
    kept = sorted(timings)[:-1] if len(timings) >= 3 else timings
    return statistics.mean(kept)


def _run_op(op: str, buffers: dict, rank: int, world: int) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(buffers["full"])
    elif op == "all_gather":
        dist.all_gather_into_tensor(buffers["full"], buffers["shard"])
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(buffers["shard"], buffers["full"])
    else:  # ring shift
        sends = [dist.isend(buffers["full"], (rank + 1) % world),
                 dist.irecv(buffers["other"], (rank - 1) % world)]
        for work in sends:
            work.wait()


def _compute(work, seconds: float) -> None:
    """Keep this rank's thread busy for ``seconds``, as a training step's compute does
    before it issues its collective."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work @ work


def _skew(work, device) -> dict[str, Any]:
    """CPU: how much longer a small all-reduce takes the longer the compute before it.
    Every rank does the same fixed work (a count of products agreed over the ranks), not
    a fixed time, as a training step does: one rank's work then ends late now and then
    (a scheduler tick, another thread, a cache), and the other waits for it in the
    collective. ``wait_per_compute``: the slowest rank's extra wait per second of compute,
    from ``SKEW_COMPUTE_S``'s two lengths (0 when longer compute waited no longer);
    ``reliable``: whether the two lengths' times came out far enough apart to divide by
    (:func:`skew_slope`), after up to ``SKEW_ATTEMPTS`` tries."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    for _ in range(20):
        work @ work
    count = torch.tensor([max(int(20 * COMPUTE_S / (time.perf_counter() - t0)), 1)])
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    message = torch.ones(1024, device=device)  # 4 KB, as the probe's smallest size
    counts = [max(int(count.item() * seconds / COMPUTE_S), 1) for seconds in SKEW_COMPUTE_S]
    for attempt in range(1, SKEW_ATTEMPTS + 1):
        compute, latency = [], []
        for products in counts:
            dist.barrier()
            busy = waited = 0.0
            for _ in range(SKEW_REPEATS):
                t0 = time.perf_counter()
                for _ in range(products):
                    work @ work
                t1 = time.perf_counter()
                dist.all_reduce(message)
                busy, waited = busy + t1 - t0, waited + time.perf_counter() - t1
            slowest = torch.tensor([busy, waited], dtype=torch.float64) / SKEW_REPEATS
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every rank decides alike
            compute.append(float(slowest[0]))
            latency.append(float(slowest[1]))
        per, reliable = skew_slope(compute, latency)
        if reliable:
            break
    return {"wait_per_compute": per, "compute_s": compute, "latency_s": latency,
            "products": counts, "attempts": attempt, "reliable": reliable}


def skew_slope(compute: list[float], latency: list[float]) -> tuple[float, bool]:
    """(extra wait per second of compute, whether to trust it) from the short and the long
    block's compute and wait times: reliable only when the long block took at least
    ``SKEW_MIN_SPAN`` x the short one's time."""
    span = compute[-1] - compute[0]
    per = max((latency[-1] - latency[0]) / span, 0.0) if span > 0 else 0.0
    return per, compute[0] > 0 and compute[-1] >= SKEW_MIN_SPAN * compute[0]


def _rank_main(rank: int, world: int, port: int, backend: str, sizes: tuple[int, ...],
               repeats: int, ops: tuple[str, ...], queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import warnings

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # gloo's *_tensor names
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=timedelta(seconds=TIMEOUT_S))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S),
                            **({"device_id": device} if backend == "nccl" else {}))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out: dict[str, dict[int, float]] = {op: {} for op in ops}
    work = torch.ones(128, 128)
    try:
        for op in ops:
            for nbytes in sizes:
                numel = max(nbytes // 4 // world, 1) * world  # fp32, divisible by the world
                buffers = {"full": torch.ones(numel, device=device),
                           "other": torch.empty(numel, device=device),
                           "shard": torch.ones(numel // world, device=device)}
                inner = 10 if nbytes < MIB else 2
                for _ in range(2):
                    _run_op(op, buffers, rank, world)
                sync()
                timings = []
                for _ in range(repeats):
                    dist.barrier()
                    sync()
                    spent = 0.0
                    if device.type == "cpu":  # each call as a training step issues it
                        for _ in range(inner):
                            _compute(work, COMPUTE_S)
                            t0 = time.perf_counter()
                            _run_op(op, buffers, rank, world)
                            spent += time.perf_counter() - t0
                    else:  # GPU kernels queue back to back; one synchronisation at the end
                        t0 = time.perf_counter()
                        for _ in range(inner):
                            _run_op(op, buffers, rank, world)
                        sync()
                        spent = time.perf_counter() - t0
                    elapsed = torch.tensor([spent], dtype=torch.float64, device=device)
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                    timings.append(float(elapsed.item()) / inner)
                out[op][numel * 4] = size_time(timings)
        skew = _skew(work, device) if device.type == "cpu" else None
        if rank == 0:
            queue.put((out, skew))
    finally:
        dist.destroy_process_group()


def measure(nproc: int, backend: str = "gloo", sizes: tuple[int, ...] | None = None,
            repeats: int = 5, ops: tuple[str, ...] = stm.OPS) -> dict[str, Any]:
    """Timings of ``ops`` between ``nproc`` local processes and their fits: ``{"backend",
    "nproc", "seconds": {op: {bytes: s}}, "fits": {op: {...}, "all": {...}}}``."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    sizes = tuple(sizes or (GPU_SIZES if backend == "nccl" else CPU_SIZES))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=TIMEOUT_S))
    mp.start_processes(_rank_main, args=(nproc, store.port, backend, sizes, repeats, ops,
                                         queue),
                       nprocs=nproc, join=True, start_method="spawn")
    seconds, skew = queue.get(timeout=TIMEOUT_S)
    out = {"backend": backend, "nproc": nproc, "repeats": repeats,
           "seconds": {op: {str(n): t for n, t in by_size.items()}
                       for op, by_size in seconds.items()},
           "fits": fits(seconds, nproc)}
    if skew is not None:
        out["skew"] = skew
    return out


def fits(seconds: dict[str, dict[int, float]], nproc: int) -> dict[str, dict[str, float]]:
    """One alpha-beta fit per operation and one over all of them."""
    out = {}
    every = []
    for op, by_size in seconds.items():
        points = [(op, int(n), t) for n, t in by_size.items()]
        every += points
        out[op] = alpha_beta_fit.fit(points, nproc)
    out["all"] = alpha_beta_fit.fit(every, nproc)
    return out
