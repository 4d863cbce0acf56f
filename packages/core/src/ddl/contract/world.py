"""Who a process is in a run: its rank, its local rank on the node, the world size, its
device and the collective backend. The worker side builds one (ddl.worker.process.distributed) and
passes it to workloads and strategies, so each piece can say which ranks it uses instead of
asking torch.distributed globals."""

from __future__ import annotations

from dataclasses import dataclass
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
