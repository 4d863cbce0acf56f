"""How many bytes a training step keeps for its backward pass (activation memory), on any
device: every tensor autograd saves during the forward passes is counted once (by its
storage), parameters excluded (they are model state, counted in ``memory_per_rank``).

On GPUs torch's peak allocation (``device_peak_allocated_bytes``) shows activations too,
mixed with everything else; this count isolates them and also works on CPUs, where no
allocator reports a peak. It is what activation checkpointing reduces: a checkpointed unit
saves only its inputs (its inner tensors are saved under checkpointing's own hooks, which
take precedence, and freed before the next unit runs). Under a pipeline schedule the count
is the sum over the step's microbatches; 1F1B frees some before others are saved, so its
true peak is lower.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ddl.worker import activation_checkpointing


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one (a linear layer saves its weight's transpose)."""
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


class SavedTensorMeter:
    """Counts the bytes saved for backward inside :meth:`measure`; keeps the largest
    per-micro-step figure seen."""

    def __init__(self) -> None:
        self.peak_bytes = 0

    @contextmanager
    def measure(self, micro_steps: int = 1):
        seen: set[int] = set()
        total = [0]

        def pack(tensor: torch.Tensor):
            local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
            if _is_parameter(tensor) or _is_parameter(local):
                return tensor
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
                return tensor
            # a meta tensor (ddl plan's probe) has no address: its storage object stands in
            key = storage.data_ptr() or (storage._cdata if local.is_meta else 0)
            if key and key not in seen:
                seen.add(key)
                total[0] += storage.nbytes()
            return tensor

        activation_checkpointing.kept_bytes = kept = []  # what selective checkpointing keeps
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                yield
        finally:
            activation_checkpointing.kept_bytes = None
        self.peak_bytes = max(self.peak_bytes, (total[0] + sum(kept)) // max(micro_steps, 1))


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
