"""Give a model built on the meta device its memory and values, one rank's part at a time.

The strategy shards or splits the meta model (FSDP, tensor parallel, pipeline stages) and
then calls ``StrategyContext.materialize`` on each module this rank keeps. That call
allocates the module on the device (``Module.to_empty``: only what the rank holds) and
fills every parameter and buffer, one tensor at a time:

- from the workload's pretrained weights (``Workload.pretrained_weights``: safetensors,
  ddl.worker.build.weights_file) where the file has the tensor,
- else from the recorded build (ddl.worker.build.deferred_init): the values one process draws
  with the same seed.

The whole tensor is made on the CPU and only this rank's slice is kept (``distribute_tensor``
with ``src_data_rank=None``: every rank cuts its own slice, no communication), so a rank's
build peak is its shard plus the largest single tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from ddl.contract.errors import UsageError
from ddl.worker.build.deferred_init import Recording, _Ref
from ddl.worker.build.weights_file import WeightsFile

# names a wrapper puts in front of a module's own (torch.compile, checkpoint_wrapper)
_WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.")


def canonical(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def named_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter and buffer with every name it has (tied ones more than once)."""
    yield from module.named_parameters(remove_duplicate=False)
    yield from ((n, b) for n, b in module.named_buffers(remove_duplicate=False)
                if b is not None)


def tied_groups(module: nn.Module) -> list[list[str]]:
    """Names that share one tensor object (tied weights), each group in module order."""
    groups: dict[int, list[str]] = {}
    for name, tensor in named_tensors(module):
        groups.setdefault(id(tensor), []).append(name)
    return list(groups.values())


def refs_of(model: nn.Module, recording: Recording) -> dict[str, _Ref]:
    """Each tensor name of the freshly built meta model -> where its values are recorded."""
    refs = {}
    for name, tensor in named_tensors(model):
        ref = recording.ref(tensor) if tensor.is_meta else None
        if ref is not None:
            refs[canonical(name)] = ref
    return refs


def load_weights(model: nn.Module, weights: WeightsFile) -> int:
    """Copy the file's tensors into a model that has its memory (the plain build);
    names the file lacks keep their values. Returns how many tensors were loaded."""
    loaded = 0
    with torch.no_grad():
        for names, tensor in _unique(model):
            name = next((n for n in names if n in weights), None)
            if name is not None:
                _copy_into(tensor, weights.read(name), name)
                loaded += 1
    return loaded


@dataclass
class Materializer:
    """``StrategyContext.materialize`` for a model built on the meta device."""

    recording: Recording
    refs: dict[str, _Ref]
    device: torch.device
    weights: WeightsFile | None = None
    _cache: tuple[int, torch.Tensor] | None = field(default=None, repr=False)

    def __call__(self, module: nn.Module) -> None:
        groups = [g for g in tied_groups(module) if len(g) > 1]
        module.to_empty(device=self.device)
        _retie(module, groups)  # to_empty may give each name of a tied DTensor its own
        with torch.no_grad():
            for names, tensor in _unique(module):
                _copy_into(tensor, self._value(names), names[0])
        self._cache = None

    def _value(self, names: list[str]) -> torch.Tensor:
        if self.weights is not None:
            for name in names:
                if name in self.weights:
                    return self.weights.read(name)
        ref = next((self.refs[n] for n in names if n in self.refs), None)
        if ref is None:
            raise RuntimeError(f"materialize: {names[0]} was not made by the recorded build")
        if self._cache is None or self._cache[0] != ref.storage:
            self._cache = (ref.storage, self.recording.value(ref.storage))
        return ref.view_of(self._cache[1])


def meta_tensors(module: nn.Module) -> list[str]:
    """Names still on the meta device (a strategy that did not materialise a part)."""
    return [n for n, t in named_tensors(module) if t.is_meta]


def _unique(module: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    seen: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in named_tensors(module):
        seen.setdefault(id(tensor), ([], tensor))[0].append(canonical(name))
    return list(seen.values())


def _retie(module: nn.Module, groups: list[list[str]]) -> None:
    for names in groups:
        first = module.get_parameter(names[0]) if _is_param(module, names[0]) \
            else module.get_buffer(names[0])
        for name in names[1:]:
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            setattr(owner, attr, first)


def _is_param(module: nn.Module, name: str) -> bool:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return attr in owner._parameters


def _copy_into(tensor: torch.Tensor, value: torch.Tensor, name: str) -> None:
    """Copy ``value`` (the whole tensor) into ``tensor``, or into this rank's slice of it
    when ``tensor`` is a DTensor (sharded by FSDP or tensor parallel)."""
    if tuple(value.shape) != tuple(tensor.shape):
        raise UsageError(f"weights: {name} has shape {tuple(value.shape)} in the file, the "
                         f"model wants {tuple(tensor.shape)}")
    from torch.distributed.tensor import DTensor, distribute_tensor

    value = value.to(device=tensor.device, dtype=tensor.dtype)
    if isinstance(tensor, DTensor):
        mine = distribute_tensor(value, tensor.device_mesh, tensor.placements,
                                 src_data_rank=None).to_local()
        tensor.to_local().copy_(mine)
    else:
        tensor.copy_(value)
