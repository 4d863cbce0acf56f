"""The same loop written for HF Accelerate (Accelerator(cpu=True) under torchrun),
``--epochs`` epochs, those after the first timed; see benchmarks/overhead.py."""

import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from common import arguments, report, workload


def train(args, accelerator: Accelerator) -> tuple[list[float], list[float], str]:
    """``--epochs`` epochs; the per-epoch times and the wrapper's class name."""
    torch.manual_seed(args.seed)
    wl, preset = workload(args.plugin, args.preset)
    dataset = wl.datasets(args.data_dir)["train"]
    loader = DataLoader(dataset, batch_size=preset.batch_size, shuffle=True, drop_last=True)
    model = wl.build_model()
    optimizer = wl.optimizer(model.parameters(), preset.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    epoch_times, epoch_cpu = [], []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        model.train()
        t0, cpu0 = time.perf_counter(), time.process_time()
        batches = iter(loader)
        for _ in range(args.steps):
            inputs, targets = wl.to_device(next(batches), accelerator.device)
            optimizer.zero_grad()
            loss = wl.loss(wl.forward(model, inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
        epoch_times.append(time.perf_counter() - t0)
        epoch_cpu.append(time.process_time() - cpu0)
    return epoch_times, epoch_cpu, type(model).__name__


def main():
    args = arguments()
    accelerator = Accelerator(cpu=True)
    epoch_times, epoch_cpu, wrapper = train(args, accelerator)
    if accelerator.is_main_process:
        # that it really ran data-parallel: several processes, the model wrapped in DDP
        report(args.out, epoch_times, args.steps, epoch_cpu=epoch_cpu,
               distributed_type=str(accelerator.distributed_type),
               num_processes=accelerator.num_processes, wrapper=wrapper)
    # the prepared DDP model must be gone before the process group is (see plain_ddp.py)
    accelerator.free_memory()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
