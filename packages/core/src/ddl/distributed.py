"""The process group of one run: who am I, which device, which backend.

Workers are started by a launcher (torch's elastic agent, torchrun, torchrun_jsc) that sets
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; a single
process started directly runs as a world of one. The rest of ddl receives a :class:`World`
instead of asking torch.distributed globals, so each piece can say which ranks it uses.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, accelerator: str, local_rank: int) -> torch.device:
    """CUDA and ROCm builds of torch both expose GPUs as ``cuda`` devices."""
    import torch

    wants_gpu = requested == "cuda" or (requested == "auto" and accelerator in ("cuda", "rocm"))
    if wants_gpu:
        if not torch.cuda.is_available():
            from ddl.errors import DdlError
            raise DdlError("no GPU visible to torch on this node (torch.cuda.is_available() "
                           "is False); use --device cpu or check the job's GPU request")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_world(requested_device: str, accelerator: str, backend: str,
               timeout_s: float = 600) -> World:
    """Join the process group described by the launcher's environment variables."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    size = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(requested_device, accelerator, local_rank)
    if device.type == "cpu":
        backend = "gloo"  # NCCL/RCCL need GPUs; gloo runs everywhere
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=size,
                                    timeout=timedelta(seconds=timeout_s),
                                    device_id=device if device.type == "cuda" else None)
        else:  # a lone process: a private in-memory store, no network port
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return World(rank=rank, local_rank=local_rank, size=size, device=device, backend=backend)


def close_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) alike."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
