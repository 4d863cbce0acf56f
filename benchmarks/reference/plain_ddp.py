"""The reference: a plain hand-written PyTorch DDP training loop in the courses' style
(init_process_group, DistributedSampler, DDP, forward/backward/step), ``--epochs``
epochs, those after the first timed. Started by torchrun; see benchmarks/overhead.py."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from common import arguments, report, workload


def train(args) -> tuple[list[float], list[float]]:
    """``--epochs`` epochs; the per-epoch wall and CPU times. The model and its DDP reducer die when this returns,
    before the process group is destroyed (a DDP still alive at destroy_process_group
    sometimes aborts the process at exit: "terminate called without an active exception")."""
    torch.manual_seed(args.seed)
    wl, preset = workload(args.plugin, args.preset)
    dataset = wl.datasets(args.data_dir)["train"]
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=preset.batch_size, sampler=sampler, drop_last=True)
    model = DDP(wl.build_model())
    optimizer = wl.optimizer(model.parameters(), preset.lr)
    device = torch.device("cpu")
    epoch_times, epoch_cpu = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0, cpu0 = time.perf_counter(), time.process_time()
        batches = iter(loader)
        for _ in range(args.steps):
            inputs, targets = wl.to_device(next(batches), device)
            optimizer.zero_grad()
            loss = wl.loss(wl.forward(model, inputs), targets)
            loss.backward()
            optimizer.step()
        epoch_times.append(time.perf_counter() - t0)
        epoch_cpu.append(time.process_time() - cpu0)
    return epoch_times, epoch_cpu


def main():
    args = arguments()
    dist.init_process_group("gloo")
    epoch_times, epoch_cpu = train(args)
    if dist.get_rank() == 0:
        report(args.out, epoch_times, args.steps, epoch_cpu=epoch_cpu)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
