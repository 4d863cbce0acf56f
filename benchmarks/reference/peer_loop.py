"""The peer of ddl's single-GPU runs in the GPU check kit (benchmarks/gpu_check.py): a plain
hand-written PyTorch loop in the courses' style, as a careful user would write it for one
GPU: the workload's own model, data files, loss, optimizer and batch (through the plugin,
as benchmarks/reference/common.py does), a DDP world of 1, a DataLoader with loader workers
and pinned memory on a GPU, non-blocking copies, bf16 autocast, no tricks ddl does not do
(no compile, no channels-last, no cudnn.benchmark: ddl sets none of them either).

    python benchmarks/reference/peer_loop.py --plugin cifar --preset course \
        --data-dir DIR --device cuda --precision bf16 --steps 50 --workers 4

Two epochs (``--epochs``) of at most ``--steps`` steps each; the first is warm-up (CUDA
context, cuDNN's kernel choice, the loader workers' first start) and is excluded, as ddl
excludes its first epoch. Each step also sums the workload's per-sample training metrics on
the device (the running loss and accuracy a course loop prints), as ddl's epoch does, and
they are fetched once per epoch. The device is synchronised only at the timing boundaries.
Prints one JSON object as its last line: samples/s, the share of training time spent
waiting for data (fetching the batch and starting its copy, measured as ddl measures it),
and the GPU's busy % (NVML, through ddl's own sampler: once over the same window as ddl's
results.json, from the first step to the last epoch's end at a 1 s interval, and once
over the timed epochs only at 0.1 s).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import workload  # noqa: E402


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--plugin", default="mnist")
    p.add_argument("--preset", default="course")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--batch-size", type=int, help="default: the preset's")
    p.add_argument("--steps", type=int, default=50, help="cap on steps per epoch")
    p.add_argument("--epochs", type=int, default=2, help="the first is warm-up")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first is warm-up, not timed)")
    return args


def init_group(cuda: bool) -> None:
    """env:// under torchrun; otherwise a world of 1 through a file store (no port to
    find), NCCL on a GPU and gloo on a CPU, as ddl's `--nproc 1` run has."""
    import torch.distributed as dist

    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
        return
    folder = tempfile.mkdtemp(prefix="ddl-peer-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    store = dist.FileStore(os.path.join(folder, "store"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args: argparse.Namespace) -> dict:
    """The loop; the model and its DDP reducer die when this returns, before the process
    group is destroyed (see plain_ddp.py)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from ddl.worker.observe.utilisation import Sampler

    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    wl, preset = workload(args.plugin, args.preset)
    batch_size = args.batch_size or preset.batch_size
    dataset = wl.datasets(args.data_dir)["train"]  # before the model: xsum reads its files
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, pin_memory=cuda)
    steps = min(args.steps, len(loader))
    if steps < 1:
        raise SystemExit(f"peer_loop: batch {batch_size} leaves no full batch in "
                         f"{len(dataset)} training samples")
    model = DDP(wl.build_model().to(device), device_ids=[0] if cuda else None)
    groups = wl.param_groups(list(model.module.named_parameters()))
    optimizer = wl.optimizer(list(model.parameters()) if groups is None else groups, preset.lr)
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    whole = Sampler(dist.get_rank(), device.type, 0, rocm=torch.version.hip is not None)
    whole.start()
    epochs, steady = [], None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        if epoch == 1:  # the timed epochs, sampled finely
            steady = Sampler(dist.get_rank(), device.type, 0,
                             rocm=torch.version.hip is not None, interval=0.1)
            steady.start()
        sums: dict[str, torch.Tensor] = {}
        wait = 0.0
        _sync(device)
        t0 = time.perf_counter()
        batches = iter(loader)
        for _ in range(steps):
            t_fetch = time.perf_counter()
            inputs, targets = wl.to_device(next(batches), device)  # non_blocking copies
            wait += time.perf_counter() - t_fetch
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                outputs = wl.forward(model, inputs)
                loss = wl.loss(outputs, targets)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for key, values in wl.sample_metrics(outputs, targets).items():
                    sums[key] = sums.get(key, 0) + values.detach().float().sum()
        _sync(device)
        seconds = time.perf_counter() - t0
        del batches  # the loader workers end here, as at a course loop's epoch end
        n = steps * batch_size * dist.get_world_size()
        epochs.append({"epoch": epoch, "warmup": epoch == 0, "time_s": seconds,
                       "samples": n, "samples_per_s": n / seconds, "data_wait_s": wait,
                       "train": {k: float(v) / (steps * batch_size) for k, v in sums.items()}})
    steady_use, use = steady.stop(), whole.stop()
    timed = [e for e in epochs if not e["warmup"]]
    time_s = sum(e["time_s"] for e in timed)
    out = {
        "plugin": args.plugin, "preset": args.preset, "device": device.type,
        "backend": dist.get_backend(), "world_size": dist.get_world_size(),
        "precision": args.precision, "batch_size": batch_size, "steps_per_epoch": steps,
        "loader_workers": args.workers, "pin_memory": cuda,
        "samples_per_s": sum(e["samples"] for e in timed) / time_s,
        "epoch_time_s": time_s / len(timed),
        "data_wait_share": sum(e["data_wait_s"] for e in timed) / time_s,
        "train_loss": timed[-1]["train"].get("loss"),
        "flops_per_sample": wl.flops_per_sample(),
        "device_util_percent_mean": use.get("device_util_percent_mean"),
        "device_util_source": use.get("device_source"),
        "device_util_steady_percent_mean": steady_use.get("device_util_percent_mean"),
        "device_util_steady_samples": steady_use.get("samples"),
        "device_peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "epochs": epochs,
    }
    return out


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch, as ddl's ranks do on a CPU
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit("peer_loop: --device cuda, but torch sees no GPU")
        torch.cuda.set_device(0)
    init_group(cuda)
    try:
        result = train(args)
    finally:
        dist.destroy_process_group()
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
