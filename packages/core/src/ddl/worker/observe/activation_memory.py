"""How many bytes a training step keeps for its backward pass (activation memory), on any
device: the high-water mark of the tensors autograd holds for backward, each counted from
the forward that saves it until autograd lets it go (after its node's backward, or when
the graph is dropped), parameters excluded (they are model state, counted in
``memory_per_rank``). A storage counts once, by the bytes its saved views reach (a tensor
saved by two ops, or with a transposed view of itself, once; the micro-batches of one
input batch, slices of one storage, each their own slice).

On GPUs torch's peak allocation (``device_peak_allocated_bytes``) shows activations too,
mixed with everything else; this count isolates them and also works on CPUs, where no
allocator reports a peak. It is what activation checkpointing reduces: a checkpointed unit
saves only its inputs (its inner tensors are saved under checkpointing's own hooks, which
take precedence, and freed before the next unit runs). Under gradient accumulation a
micro-batch's backward frees its tensors before the next forward: the peak is one
micro-batch's. Under a pipeline schedule it is what the rank holds with the schedule's
micro-batches in flight (GPipe: all m; 1F1B: pp - rank; ddl.planning.memory_model).

Until issue 41 the meter summed every tensor saved in a step. That over-counted pipelines
by 16-25 %: torch.distributed.pipelining (2.14) runs the first micro-batch once more, with
gradients, in its first step to infer the stages' shapes (``_forward_metadata_inference``),
and the sum took that pass as an extra micro-batch ((m + 1) / m: 1.25 with 4). On the first
stage that pass's graph is dropped without a backward, and a saved output returned as
itself by the pack hook held its own grad_fn in a cycle no gc frees: one micro-batch's
activations leaked for the rest of the run. The hook now keeps detached tensors, and the
count is the live peak, which also tells 1F1B's in-flight micro-batches from GPipe's.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch import nn

from ddl.worker.build import activation_checkpointing


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one (a linear layer saves its weight's transpose)."""
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


class SavedTensorMeter:
    """The high-water mark of the bytes held for backward inside :meth:`measure`: a tensor
    counts from the forward that saves it until autograd lets it go (its node's backward,
    or the graph dropped); keeps the largest figure seen over the measured steps."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        # the largest single storage held (``ddl plan``'s peak model: the backward's first
        # gradients are about its size, beside everything still held)
        self.largest_bytes = 0
        self.steps = 0  # steps measured so far (the trainer measures the first few only)

    @contextmanager
    def measure(self):
        """Count inside the block. Gradient accumulation needs no division: a micro-batch's
        backward frees its tensors (and selective checkpointing's kept outputs) before the
        next one saves."""
        self.steps += 1
        live = _Live()
        # what selective checkpointing keeps, per checkpointed call, while torch holds it
        activation_checkpointing.kept_meter = _Kept(live)

        def pack(tensor: torch.Tensor):
            local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
            if _is_parameter(tensor) or _is_parameter(local):
                return tensor
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
                return tensor
            # a meta or fake tensor (ddl plan's probe) has no address: its storage object
            # stands in
            key = storage._cdata if local.is_meta or _is_fake(local) else storage.data_ptr()
            if not key:
                return tensor
            span = _span(local, storage.nbytes())
            live.add(key, span)
            # detached: a saved output kept as itself would hold its own grad_fn, a cycle
            # through C++ that Python's gc cannot see - freed by a backward, but leaked
            # when the graph is dropped without one (torch.distributed.pipelining's shape
            # inference does that on the first stage)
            return _Saved(tensor.detach(), live, key, span)

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                yield
        finally:
            activation_checkpointing.kept_meter = None
            live.closed = True  # tensors freed after the block no longer count anywhere
        self.peak_bytes = max(self.peak_bytes, live.peak)
        self.largest_bytes = max(self.largest_bytes, live.largest)


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def _span(tensor: torch.Tensor, storage_bytes: int) -> tuple[int, int]:
    """The bytes of its storage a (possibly strided) view reaches, [start, end)."""
    if tensor.numel() == 0:
        return (0, 0)
    size = tensor.element_size()
    first = tensor.storage_offset()
    last = first + sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride()))
    return (first * size, min((last + 1) * size, storage_bytes))


class _Live:
    """Saved views per storage, counted while autograd holds them: each storage by the
    union of the byte ranges its saved views reach (a tensor saved by two ops, or saved
    with a transposed view of itself, counts once; the micro-batches of one input batch,
    slices of one storage, each count their own slice)."""

    def __init__(self) -> None:
        self.views: dict[int, dict[tuple[int, int], int]] = {}
        self.bytes: dict[int, int] = {}
        self.total = self.peak = self.largest = 0
        self.closed = False
        # a release can come from the autograd engine's device threads (CUDA backward), or
        # from a garbage collection inside add: reentrant
        self.lock = threading.RLock()

    def add(self, key: int, span: tuple[int, int]) -> None:
        with self.lock:
            views = self.views.setdefault(key, {})
            views[span] = views.get(span, 0) + 1
            self._recount(key)
            self.peak = max(self.peak, self.total)

    def remove(self, key: int, span: tuple[int, int]) -> None:
        with self.lock:
            if self.closed:
                return
            views = self.views.get(key, {})
            if views.get(span, 0) > 1:
                views[span] -= 1
                return
            views.pop(span, None)
            if not views:
                self.views.pop(key, None)
            self._recount(key)

    def _recount(self, key: int) -> None:
        covered, reach = 0, 0
        for start, end in sorted(self.views.get(key, ())):
            start = max(start, reach)
            if end > start:
                covered += end - start
                reach = end
        self.total += covered - self.bytes.get(key, 0)
        if covered:
            self.bytes[key] = covered
            self.largest = max(self.largest, covered)
        else:
            self.bytes.pop(key, None)


class _Kept:
    """Selective checkpointing's kept outputs in the live count: each checkpointed call's
    bytes under a key of its own, from its forward until torch frees the call (after its
    backward, or with a graph dropped without one)."""

    def __init__(self, live: _Live) -> None:
        self.live = live
        self.bytes: dict[int, int] = {}

    def keep(self, call, nbytes: int) -> None:
        import weakref

        key = -id(call)  # negative: never a storage's address
        with self.live.lock:
            if key not in self.bytes:
                weakref.finalize(call, self.release_key, key)
            self.bytes[key] = self.bytes.get(key, 0) + nbytes
            self.live.remove(key, (0, self.bytes[key] - nbytes))
            self.live.add(key, (0, self.bytes[key]))

    def release_key(self, key: int) -> None:
        with self.live.lock:
            nbytes = self.bytes.pop(key, None)
            if nbytes is not None:
                self.live.remove(key, (0, nbytes))


class _Saved:
    """What autograd holds for a counted tensor: the tensor, and its release when autograd
    drops it (after the backward of the node that saved it)."""

    __slots__ = ("tensor", "live", "key", "span")

    def __init__(self, tensor: torch.Tensor, live: _Live, key: int, span: tuple[int, int]):
        self.tensor, self.live, self.key, self.span = tensor, live, key, span

    def __del__(self) -> None:
        self.live.remove(self.key, self.span)


def _unpack(saved) -> torch.Tensor:
    return saved.tensor if isinstance(saved, _Saved) else saved
