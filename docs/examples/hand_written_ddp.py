"""DDP by hand, the way the courses teach it: the BSC course's MNIST CNN on N processes.

    torchrun --nproc-per-node 2 docs/examples/hand_written_ddp.py --data-dir data

(`./ddl prepare --plugin mnist --synthetic --data-dir data` makes the data offline.) The
comments name the JSC course's exercise steps (the TODO numbers of its XSum T5 `train.py`
and `run_train.sbatch`); docs/code-behind-ddl.md says where ddl does each.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", default="data")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--steps", type=int, default=20, help="steps per epoch (a short demo)")
parser.add_argument("--batch-size", type=int, default=100, help="per process")
args = parser.parse_args()

# TODO 2-3: join the process group (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# ... and one GPU per process: the local rank picks it.
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
if cuda:
    torch.cuda.set_device(device)
# TODO 5-8: every process reads a different shard of the data, reshuffled each epoch.
train = datasets.MNIST(args.data_dir, train=True, download=False,
                       transform=transforms.ToTensor())
sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=1)
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# Not a TODO: the same initial weights everywhere (DDP also broadcasts rank 0's at wrap).
torch.manual_seed(1)
model = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 4 * 4, 10))
# TODO 4: wrap; backward now averages the gradients over all processes (all-reduce).
model = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # TODO 9: a new shuffle per epoch, the same on every process
    totals = torch.zeros(3, device=device)  # loss sum, correct, samples
    for step, (images, labels) in enumerate(loader):
        if step == args.steps:
            break
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        outputs = model(images)  # forward on this process's shard
        loss = loss_fn(outputs, labels)
        loss.backward()  # ... gradients all-reduced here
        optimizer.step()  # every process takes the same step
        totals += torch.stack([loss.detach() * len(labels),
                               (outputs.argmax(1) == labels).sum().float(),
                               torch.tensor(float(len(labels)), device=device)])
    dist.all_reduce(totals)  # TODO 10: metrics over all processes, not just this one
    if rank == 0:  # TODO 11-12: one process reports (and would save the checkpoint)
        print(f"epoch {epoch + 1}: loss {totals[0] / totals[2]:.4f} "
              f"accuracy {totals[1] / totals[2]:.4f} over {int(totals[2])} samples "
              f"on {world} processes", flush=True)

dist.destroy_process_group()  # not a TODO in the course: leave the group cleanly
