"""What a CPU site's step time is built from, measured on this machine (issue 51, item 2):
``ddl plan --site local`` predicts a step time per layout from these, so ``--mesh auto``
on a workstation picks what is fastest there instead of ranking by bytes communicated.

Four measurements, two of them cached per machine:

- **The links**: ``ddl doctor --collectives``'s gloo timings (all-reduce, all-gather,
  reduce-scatter, a point-to-point ring shift; each call after 1 ms of compute, as in a
  training step) fitted to alpha and beta per operation (ddl.planning.alpha_beta_fit),
  for the plan's number of processes. Measuring takes 30-45 s on 2 cores, too long for
  every plan, so the fits are cached per machine in ``cpu-links.json`` under
  ``$DDL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ddl``, else ``~/.cache/ddl``), keyed by
  the host name, CPU model, core count and torch version, per process count, and kept for
  :data:`MAX_AGE_S` (a week). ``ddl doctor --collectives`` on a CPU refreshes the entry;
  the first ``ddl plan`` that finds none measures it (a note says so) and caches it.
- **The matmul rate** of one thread (``ddl.worker.mfu.measure_matmul_peak``, 512 x 512
  fp32: ~0.1 s), cached beside the links: what a model that is too big to run here is
  priced at (its FLOPs / that rate).
- **The workload's own costs**, measured at every plan (they depend on the model, the
  preset and the batch, and a tiny model takes well under a second): its real model,
  built on the CPU, one thread, for every pipeline degree the plan considers each stage's
  forward + backward timed at two micro-batch sizes (a line: a fixed part per pass, the
  framework's per-operator cost, which dominates small models, plus a part per sample),
  the optimizer's ``zero_grad`` + ``step`` over the whole model, and a batch's host work
  outside the model: fetching it from its data (``--workers 0``, as the CPU profile runs)
  and the trainer's per-sample training metrics on its outputs. The median of
  :data:`REPEATS` timings each. A model over :data:`MAX_CALIBRATED_BYTES` of fp32
  parameters is not built: it is priced at its FLOPs / the matmul rate.
- **The wrappers' host work**: the same model under DDP, FSDP2 and tensor parallel in a
  one-rank process group, less the plain model (ddl.planning.wrapper_calibration), at
  every plan too.

The step-time model (ddl.planning.step_time_model, ``CpuCosts``) turns those into a step
per layout: each rank's passes at its stage's cost (tensor parallel splits the per-sample
part), the optimizer over the parameters it holds, the pipeline's fill and drain from the
measured stage times, and every collective call with its measured latency.

Torch is imported inside the functions only.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

MAX_AGE_S = 7 * 24 * 3600
REPEATS = 5
MAX_CALIBRATED_BYTES = 1 << 30  # fp32 parameters of a model built here to be timed
CACHE_FILE = "cpu-links.json"


def cache_dir() -> Path:
    if os.environ.get("DDL_CACHE_DIR"):
        return Path(os.environ["DDL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddl"


def machine_key() -> str:
    """What the cached numbers are valid for: this host, its CPU model and cores, torch."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        torch_version = version("torch")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        torch_version = "?"
    return f"{platform.node()}|{model}|{os.cpu_count()}|torch {torch_version}"


def _read() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / CACHE_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(data: dict[str, Any]) -> None:
    """Whole or not at all; a cache that cannot be written is only not kept."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{CACHE_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(folder / CACHE_FILE)
    except OSError:
        pass


def cached(kind: str, now: float | None = None) -> dict[str, Any] | None:
    """This machine's entry ``kind`` (``links-N``, ``matmul``) if measured within
    :data:`MAX_AGE_S`, else None."""
    entry = _read().get(machine_key(), {}).get(kind)
    now = time.time() if now is None else now
    if not isinstance(entry, dict) or now - entry.get("measured_at", 0) > MAX_AGE_S:
        return None
    return entry


def store(kind: str, value: dict[str, Any]) -> dict[str, Any]:
    data = _read()
    entry = {**value, "measured_at": time.time()}
    data.setdefault(machine_key(), {})[kind] = entry
    _write(data)
    return entry


def links(nproc: int, measure: Callable[[int], dict[str, Any]]) -> tuple[dict, bool]:
    """The gloo fits between ``nproc`` processes (``{op: {latency_s, bytes_per_s}}``, and
    ``skew`` where measured):
    cached, or measured now with ``measure`` (ddl.commands.collective_probe.measure) and
    cached. Second value: whether they were measured now."""
    entry = cached(f"links-{nproc}")
    measured_now = entry is None
    if measured_now:
        entry = store_links(nproc, measure(nproc))
    # the ranks' waiting for the slowest one (collective_probe._skew), beside the fits
    return {**entry["fits"], **({"skew": entry["skew"]} if "skew" in entry else {})}, \
        measured_now


def store_links(nproc: int, measured: dict[str, Any]) -> dict[str, Any]:
    """Cache ``ddl doctor --collectives``'s measurement between ``nproc`` processes: its
    fits and timings, and its skew unless the probe found it unreliable (the two compute
    blocks too close to divide by: a week of plans would carry a wild value; without it
    the model counts no wait, as for an entry from before the skew was measured)."""
    keep = {key: measured[key] for key in ("fits", "seconds") if key in measured}
    skew = measured.get("skew")
    if skew is not None and skew.get("reliable", True):
        keep["skew"] = skew
    return store(f"links-{nproc}", keep)


def matmul_flops() -> float:
    """One thread's fp32 matmul rate here (cached)."""
    entry = cached("matmul")
    if entry is None:
        from ddl.worker.mfu import measure_matmul_peak

        entry = store("matmul", {"flops_1_thread": measure_matmul_peak(512, threads=1)})
    return float(entry["flops_1_thread"])


def _median_time(fn: Callable[[], None], repeats: int = REPEATS) -> float:
    fn()  # warm-up: allocations, kernel choice
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def real_batch(workload, data_dir: Path, size: int, train: Any = None):
    """``size`` training samples as a run's ``to_device`` gives them on the CPU (from
    ``train``, the training set, when the caller has read it already)."""
    import torch
    from torch.utils.data import DataLoader

    from ddl.planning.plan_probe import tile_batch

    if train is None:
        train = workload.datasets(data_dir)["train"]
    first = next(iter(DataLoader(train, batch_size=min(size, len(train)), shuffle=False)))
    return workload.to_device(tile_batch(first, size), torch.device("cpu"))


def workload_costs(workload, data_dir: Path, pipeline_degrees: tuple[int, ...],
                   sizes: tuple[int, int], param_bytes: int, train: Any = None,
                   threads: int = 1) -> dict[str, Any] | None:
    """The workload's measured costs on one thread (module docstring), or None when its
    model is too big to build here. ``{"stages": {pp: [(pass_s, sample_s), ...]},
    "optimizer_s": s, "param_bytes": n, "sizes": (a, b), "thread_efficiency": e}``;
    ``sample_s`` per sample of a pass, ``pass_s`` the pass's part that does not grow with
    the samples; ``e``: the whole model's pass of the larger size on ``threads`` threads
    (a rank's, when the ranks leave it several cores) against one, per thread (1.0 for
    one thread). ``train``: the workload's training set if the caller holds it (else
    read once here)."""
    if param_bytes > MAX_CALIBRATED_BYTES:
        return None
    import torch

    from ddl.planning import wrapper_calibration

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = workload.build_model()
        model.train()
        if train is None:
            train = workload.datasets(data_dir)["train"]
        small, big = sizes
        batches = {n: real_batch(workload, data_dir, n, train) for n in (small, big)}
        stages_out: dict[int, list[tuple[float, float]]] = {}
        for pp in pipeline_degrees:
            stages = [model] if pp == 1 else workload.pipeline_stages(copy.deepcopy(model),
                                                                      pp)
            times: dict[int, list[float]] = {}
            for n, (inputs, targets) in batches.items():
                times[n] = _stage_times(workload, stages, inputs, targets, pp == 1)
            stages_out[pp] = [
                ((t_b * small - t_s * big) / (small - big) if big != small else t_b,
                 max((t_b - t_s) / (big - small), 0.0) if big != small else 0.0)
                for t_s, t_b in zip(times[small], times[big])]
            stages_out[pp] = [(max(a, 0.0), b) for a, b in stages_out[pp]]
        efficiency = _thread_efficiency(workload, model, *batches[big], threads)
        # the optimizer over the whole model (zero_grad + step, gradients present)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer = workload.optimizer(params, 1e-3)

        def opt_step():
            optimizer.step()
            for p in params:  # set_to_none would free them; a run's zero_grad keeps
                p.grad.zero_()  # shapes alike, only the time matters here

        optimizer_s = _median_time(opt_step)
        data = _data_costs(workload, data_dir, sizes, train)
        metrics = _metrics_costs(workload, model, batches)
        data = (data[0] + metrics[0], data[1] + metrics[1])
        # the wrappers' work is per pass and per parameter, not per sample: the small batch
        wrappers = wrapper_calibration.wrapper_costs(workload, model, *batches[small])
    finally:
        torch.set_num_threads(previous)
    return {"stages": stages_out, "optimizer_s": optimizer_s, "param_bytes": param_bytes,
            "data": data, "sizes": list(sizes), "wrappers": wrappers,
            "thread_efficiency": efficiency}


def _thread_efficiency(workload, model, inputs, targets, threads: int) -> float:
    """The model's forward + backward on ``threads`` threads against one thread, per thread
    (at most 1): what a rank with several cores gains from them. A small model gains far
    less than a matmul (MNIST tiny: ~0.5 on 2 threads, where 512 x 512 matmuls reach
    ~0.86; benchmarks/step_time_ratios.py)."""
    import torch

    if threads <= 1:
        return 1.0
    one = _stage_times(workload, [model], inputs, targets, True)[0]
    torch.set_num_threads(threads)
    try:
        many = _stage_times(workload, [model], inputs, targets, True)[0]
    finally:
        torch.set_num_threads(1)
    return min(one / (threads * many), 1.0) if many > 0 else 1.0


def _data_costs(workload, data_dir: Path, sizes: tuple[int, int], train: Any = None
                ) -> tuple[float, float]:
    """(per batch, per sample) seconds of fetching a training batch as a rank does with
    ``--workers 0`` (the loader's indexing and collation, then ``to_device`` on the CPU):
    a line through the median times at the two sizes."""
    import torch
    from torch.utils.data import DataLoader

    if train is None:
        train = workload.datasets(data_dir)["train"]
    times = {}
    for n in sizes:
        loader = DataLoader(train, batch_size=min(n, len(train)), shuffle=True,
                            drop_last=True)
        batches = iter(loader)

        def fetch(loader=loader):
            nonlocal batches
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            workload.to_device(batch, torch.device("cpu"))

        times[n] = _median_time(fetch)
    small, big = sizes
    per_sample = max((times[big] - times[small]) / (big - small), 0.0) if big != small else 0.0
    return max(times[small] - per_sample * small, 0.0), per_sample


def _metrics_costs(workload, model, batches: dict) -> tuple[float, float]:
    """(per batch, per sample) seconds of what the trainer adds after each step: the
    workload's per-sample training metrics on the step's outputs, summed on the device
    (ddl.worker.train.metrics.TrainingMetrics, as ddl.worker.train.epoch does: small outputs
    gathered over several steps, so a step pays its share of one call); a line through
    the medians at the two sizes of ``batches`` ({n: (inputs, targets)})."""
    import torch

    from ddl.worker.train.metrics import TrainingMetrics

    steps = TrainingMetrics.GATHER_STEPS
    times = {}
    for n, (inputs, targets) in batches.items():
        with torch.no_grad():
            outputs = workload.forward(model, inputs)
        metrics = TrainingMetrics(workload, torch.device("cpu"))

        def add(outputs=outputs, targets=targets, metrics=metrics):
            for _ in range(steps):
                metrics.add(outputs, targets)
            metrics.flush()

        times[n] = _median_time(add) / steps
    small, big = sorted(times)
    per_sample = max((times[big] - times[small]) / (big - small), 0.0) if big != small else 0.0
    return max(times[small] - per_sample * small, 0.0), per_sample


def _stage_times(workload, stages, inputs, targets, whole: bool) -> list[float]:
    """Median seconds of each stage's forward + backward on ``inputs`` (the last with the
    loss); a later stage gets the previous stage's output as a leaf needing gradients, as
    a pipeline stage receives it."""
    import torch

    out: list[float] = []
    args = inputs if whole else (tuple(inputs.values()) if isinstance(inputs, dict)
                                 else (inputs,))
    for i, stage in enumerate(stages):
        last = i == len(stages) - 1
        if i:
            args = tuple(a.detach().requires_grad_(a.is_floating_point())
                         if isinstance(a, torch.Tensor) else a for a in args)

        def run(stage=stage, args=args, last=last):
            result = workload.forward(stage, args) if whole else stage(*args)
            if last:
                workload.loss(result, targets).backward()
            else:
                tensors = result if isinstance(result, tuple) else (result,)
                torch.autograd.backward([t for t in tensors if t.requires_grad],
                                        [torch.ones_like(t) for t in tensors
                                         if t.requires_grad])

        out.append(_median_time(run))
        stage.zero_grad(set_to_none=True)
        if last:
            break
        with torch.no_grad():
            nxt = stage(*args)
        args = nxt if isinstance(nxt, tuple) else (nxt,)
    return out
