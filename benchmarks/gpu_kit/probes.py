"""Measurements the kit makes itself, each in a fresh process (a CUDA fault or a hang then
costs one check, not the kit): what torch sees, a matmul peak, and the data loader.

    python benchmarks/gpu_kit/probes.py environment --device cuda
    python benchmarks/gpu_kit/probes.py matmul --device cuda
    python benchmarks/gpu_kit/probes.py loader --device cuda --plugin imagewoof \
        --preset course --data-dir DIR --workers 4 --batches 20
    python benchmarks/gpu_kit/probes.py synthetic --device cuda --plugin cifar --data-dir DIR
    python benchmarks/gpu_kit/probes.py batch-search --device cuda --plugin cifar \
        --preset throughput --data-dir DIR

Each prints one JSON object as its last line. ddl has no GPU matmul peak and no loader
timing of its own, so these numbers are the kit's, not ddl's (the JSON says so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def environment(device: str) -> dict:
    import torch
    import torch.distributed as dist

    out = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "python": sys.version.split()[0], "cuda_available": torch.cuda.is_available(),
           "nccl_available": dist.is_nccl_available(), "gloo_available": dist.is_gloo_available(),
           "cpu_threads": torch.get_num_threads()}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch.cuda.is_available() is False: no GPU visible to torch")
        props = torch.cuda.get_device_properties(0)
        out.update({"device_name": props.name, "capability": f"{props.major}.{props.minor}",
                    "device_memory_bytes": props.total_memory,
                    "multiprocessors": props.multi_processor_count,
                    "bf16_supported": torch.cuda.is_bf16_supported(),
                    "cudnn": torch.backends.cudnn.version(),
                    "nccl_version": _version(torch.cuda.nccl.version())})
        try:
            import pynvml  # NVML is what ddl's utilisation sampler reads

            pynvml.nvmlInit()
            out["nvml_driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as exc:  # noqa: BLE001 - report any failure, do not stop
            out["nvml_driver"] = f"unavailable: {type(exc).__name__}: {exc}"
    import ddl
    from ddl.contract.plugins import Plugins

    plugins = Plugins()
    out.update({"ddl": ddl.__version__, "ddl_path": ddl.__file__,
                "workloads": ",".join(sorted(plugins.workloads())),
                "strategies": ",".join(sorted(plugins.strategies()))})
    return out


def _version(v) -> str:
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)  # a tuple since torch 1.x


def matmul(device: str, size: int, repeats: int) -> dict:
    """The FLOP/s the kit compares MFU against: square matmuls in the dtype training's
    matmuls run in (bf16 under autocast on a GPU; fp32 on a CPU, via ddl's own helper)."""
    import torch

    if device == "cpu":
        from ddl.worker.mfu import measure_matmul_peak

        flops = measure_matmul_peak(size=size, repeats=repeats, threads=torch.get_num_threads())
        return {"dtype": "fp32", "size": size, "peak_flops": flops, "source": "ddl.worker.mfu"}
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # kernel choice, clocks up
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / repeats
    return {"dtype": "bf16", "size": size, "peak_flops": 2.0 * size ** 3 / seconds,
            "source": "the kit (cuda events, mean of the timed products)"}


def _tensors(batch) -> list:
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _tensors(v)]
    return []


def loader(device: str, plugin: str, preset: str, data_dir: str, workers: int,
           batches: int) -> dict:
    """ddl's own training loader (ddl.worker.train.loaders.train_loader) with and without pinned
    memory:
    batches/s, whether the batches really arrive pinned, and the host-to-device copy rate
    of ``Workload.to_device`` (non_blocking; synchronised here to time it)."""
    import torch

    from ddl.worker.train.loaders import train_loader
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets[preset])
    dataset = workload.datasets(__import__("pathlib").Path(data_dir))["train"]
    target = torch.device(device)
    out = {"plugin": plugin, "preset": preset, "workers": workers,
           "batch_size": spec.presets[preset].batch_size}
    for pin in ((True, False) if device == "cuda" else (False,)):
        data = train_loader(dataset, batch_size=spec.presets[preset].batch_size, replicas=1,
                            rank=0, seed=1, workers=workers, pin_memory=pin)
        data.sampler.set_epoch(1)
        it = iter(data)
        for _ in range(2):  # worker start-up is not the loader's rate
            next(it)
        fetch = copy = 0.0
        moved = 0
        all_pinned = True
        n = min(batches, len(data) - 2)
        for _ in range(n):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            tensors = _tensors(batch)
            all_pinned = all_pinned and all(t.is_pinned() for t in tensors)
            moved += sum(t.numel() * t.element_size() for t in tensors)
            workload.to_device(batch, target)
            if device == "cuda":
                torch.cuda.synchronize()
            fetch += t1 - t0
            copy += time.perf_counter() - t1
        key = "pinned" if pin else "unpinned"
        out[f"{key}_batches"] = n
        out[f"{key}_batches_per_s"] = n / (fetch + copy)
        out[f"{key}_copy_gb_per_s"] = moved / copy / 1e9 if copy else None
        out[f"{key}_arrived_pinned"] = all_pinned
    return out


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=["environment", "matmul", "loader", "synthetic",
                                          "batch-search"])
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--plugin")
    parser.add_argument("--preset")
    parser.add_argument("--data-dir")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    if args.probe == "environment":
        result = environment(args.device)
    elif args.probe == "matmul":
        result = matmul(args.device, args.size, args.repeats)
    elif args.probe == "synthetic":  # the kit's bench data (gpu_kit/bench_data.py)
        from bench_data import write

        result = write(args.plugin, args.data_dir, gpu=args.device == "cuda")
    elif args.probe == "batch-search":  # gpu_kit/batch_search.py
        from batch_search import search

        result = search(args.plugin, args.preset or "throughput", args.data_dir)
    else:
        result = loader(args.device, args.plugin, args.preset, args.data_dir, args.workers,
                        args.batches)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
