"""Build a model on the meta device, then draw any one tensor's initial values on demand -
bit for bit the values a plain build would have drawn with the same seed.

A model built under ``torch.device("meta")`` has shapes but no values and costs no memory;
FSDP, tensor parallel and the pipeline split can be applied to it as they are to a real
model, and each rank then allocates only what it keeps (``Module.to_empty``). What is
missing is the values: a single process draws every initial weight from one CPU random
stream in build order (the constructors' ``reset_parameters``, Hugging Face's
``post_init``), so a rank that wants its slice of tensor 57 must know where that stream
stood when tensor 57 was drawn.

``record(build)`` runs the workload's build on the meta device under a dispatch mode that
logs every operation touching a meta tensor (factories, in-place random fills, copies,
views' writes), naming tensors by their storage. Nothing is drawn then: meta kernels do
not touch the random generator. ``Recording.replay()`` walks the log once, running only
the random operations, each on a throwaway tensor of the recorded shape, and keeps the
generator's state before each: one tensor's memory at a time, the same random work a
plain build does. ``Recording.value(storage)`` then rebuilds one storage on the CPU by
running, in log order, the operations that wrote it (and whatever they read), with the
generator set to the saved state before each random one: the tensor's exact values, at
the cost of that tensor (plus any temporaries it was computed from). torchdistx's
``deferred_init`` does the same in C++; it is not maintained for current torch, so ddl
carries this small Python version (torch's own meta-device recipe - ``to_empty`` then an
``init_weights`` of the workload's - would give different values than one process draws).

``record`` walks the random operations (``replay``) as soon as the build ends, so the
generator then stands where a plain build leaves it, whatever draws come before the first
tensor is materialised.

Exact or loud (``NotReplayable``; ddl.worker.build.model_build then builds the plain way with one
``ddl: note:``), never silently different:

- torch.nn.init's initialisers that return early on a meta tensor (``trunc_normal_``,
  ``orthogonal_``, ``dirac_``, ``sparse_``: found by their code reading ``is_meta``) are
  redirected while recording (ddl.worker.build.meta_redirects): each call is logged as one
  operation that runs the initialiser itself on the real tensor at replay time, drawing
  exactly what a plain build draws (trunc_normal_'s rejection loop included).
- A parameter or buffer that nothing wrote after its ``torch.empty`` is refused by name:
  a plain build would leave it uninitialised, and an initialiser that skips meta tensors
  ddl does not know would look the same.
- The default CPU generator must not move during the build: ``torch.manual_seed``,
  ``torch.seed``, ``torch.set_rng_state`` and a random draw on a real CPU tensor are
  refused (with where the build called them), and the generator's state is compared
  before and after as a last net. An explicit ``generator=`` is refused too.
- A view that reinterprets the dtype (``buf.view(torch.int32).fill_(7)``) replays with its
  own dtype over the same bytes.

Documented, not checked: how much a random operation draws depends on the shape, not on
input values (true of uniform_, normal_, bernoulli_ with a scalar p, randn, rand, randint,
randperm and the redirected initialisers: what weight initialisers use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ddl.worker.build.meta_redirects import NotReplayable, caller, redirected

_META = torch.device("meta")
_CPU = torch.device("cpu")


@dataclass(frozen=True)
class _Ref:
    """A meta tensor in the log: which storage, and where in it."""

    storage: int  # index of the storage in Recording.storages
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    def view_of(self, flat: torch.Tensor) -> torch.Tensor:
        if flat.dtype != self.dtype:  # a view that reinterprets the storage's bytes
            flat = torch.empty(0, dtype=self.dtype, device=flat.device).set_(
                flat.untyped_storage())
        return flat.as_strided(self.size, self.stride, self.offset)


@dataclass
class _Op:
    func: Any
    args: Any  # with _Ref in place of meta tensors
    kwargs: Any
    reads: frozenset[int]
    writes: frozenset[int]
    fresh: tuple[tuple[int, _Ref], ...]  # outputs that are new storages: (output index, ref)
    seeded: bool  # draws from the random generator


@dataclass
class Recording:
    """The log of one meta build (see the module docstring)."""

    ops: list[_Op] = field(default_factory=list)
    storage_bytes: list[int] = field(default_factory=list)
    storage_dtype: list[torch.dtype] = field(default_factory=list)
    _ids: dict[int, int] = field(default_factory=dict)  # StorageImpl address -> index
    _keep: list[torch.Tensor] = field(default_factory=list)  # keeps addresses unique
    _states: dict[int, torch.Tensor] = field(default_factory=dict)  # op index -> rng state
    _final_state: torch.Tensor | None = None
    _unwritten: set[int] = field(default_factory=set)  # storages only an empty* made

    # --- recording -----------------------------------------------------------------
    def storage_of(self, tensor: torch.Tensor) -> int | None:
        """The index of a meta tensor's storage (None: not from this build)."""
        return self._ids.get(tensor.untyped_storage()._cdata)

    def ref(self, tensor: torch.Tensor) -> _Ref | None:
        index = self.storage_of(tensor)
        if index is None:
            return None
        return _Ref(index, tuple(tensor.shape), tuple(tensor.stride()),
                    tensor.storage_offset(), tensor.dtype)

    def _new_storage(self, tensor: torch.Tensor) -> _Ref:
        storage = tensor.untyped_storage()
        self._ids[storage._cdata] = len(self.storage_bytes)
        self.storage_bytes.append(storage.nbytes())
        self.storage_dtype.append(tensor.dtype)
        self._keep.append(tensor)
        ref = self.ref(tensor)
        assert ref is not None
        return ref

    def _log(self, func, args, kwargs, out) -> None:
        if kwargs.get("generator") is not None:
            raise NotReplayable(f"{func} uses its own random generator")
        written = _written_args(func, args, kwargs)
        reads: set[int] = set()

        def to_ref(value):
            if not isinstance(value, torch.Tensor):
                return value
            if value.device != _META:  # a real tensor the build used: a constant
                return value.detach().clone()
            ref = self.ref(value)
            if ref is None:
                raise NotReplayable(f"{func} reads a meta tensor made outside the build")
            reads.add(ref.storage)
            return ref

        ref_args, ref_kwargs = tree_map(to_ref, args), tree_map(to_ref, kwargs)
        writes = {self.storage_of(t) for t in written}
        if None in writes:
            raise NotReplayable(f"{func} writes a meta tensor made outside the build")
        fresh = []
        outputs, _ = tree_flatten(out)
        for i, value in enumerate(outputs):
            if isinstance(value, torch.Tensor) and value.device == _META \
                    and self.storage_of(value) is None:
                ref = self._new_storage(value)
                fresh.append((i, ref))
                writes.add(ref.storage)
        if not writes:  # a view, a size query: nothing to replay
            return
        if func.overloadpacket in _EMPTY_FACTORIES:
            self._unwritten.update(ref.storage for _, ref in fresh)
        else:
            self._unwritten -= writes
        self.ops.append(_Op(func, ref_args, ref_kwargs, frozenset(reads), frozenset(writes),
                            tuple(fresh), torch.Tag.nondeterministic_seeded in func.tags))

    def log_call(self, function: Callable, args: tuple, kwargs: dict,
                 tensor: torch.Tensor) -> None:
        """Log a whole Python initialiser call that writes ``tensor`` in place as one
        random operation: replay runs ``function`` itself on the real tensor."""
        ref = self.ref(tensor)
        if ref is None:
            raise NotReplayable(f"{function.__name__} writes a meta tensor made outside "
                                "the build")

        def to_ref(value):
            if not isinstance(value, torch.Tensor):
                return value
            if value.device != _META:
                return value.detach().clone()
            inner = self.ref(value)
            if inner is None:
                raise NotReplayable(f"{function.__name__} reads a meta tensor made outside "
                                    "the build")
            return inner

        ref_args, ref_kwargs = tree_map(to_ref, args), tree_map(to_ref, kwargs)
        touched = frozenset(r.storage for r in tree_flatten((ref_args, ref_kwargs))[0]
                            if isinstance(r, _Ref))
        self._unwritten.discard(ref.storage)
        # reads what it writes: a view may cover part of a storage others wrote before
        self.ops.append(_Op(function, ref_args, ref_kwargs, touched, frozenset([ref.storage]),
                            (), True))

    def unwritten(self, model: torch.nn.Module) -> list[str]:
        """Names of the model's parameters and buffers that only an ``empty*`` made."""
        return [name for name, tensor in _named_tensors(model) if tensor.is_meta
                and tensor.numel() > 0 and self.storage_of(tensor) in self._unwritten]

    # --- replaying -----------------------------------------------------------------
    def replay(self) -> None:
        """Walk the random operations once in build order, as a plain build would draw
        them, keeping the generator's state before each; afterwards the generator stands
        where a plain build would have left it. Memory: one tensor at a time. ``record``
        calls it when the build ends; later calls do nothing."""
        if self._final_state is not None:
            return
        generator = torch.default_generator
        seeded = [(index, op) for index, op in enumerate(self.ops) if op.seeded]
        # One scratch buffer for all of them, carved per operation: a fresh tensor per
        # operation left the heap fragmented (a t5-large rank grew by 4.6 GB, not 0.1).
        size = max((sum(_aligned(self.storage_bytes[s]) for s in op.reads)
                    for _, op in seeded), default=0)
        pool = torch.empty(size, dtype=torch.uint8)
        for index, op in seeded:
            self._states[index] = generator.get_state()
            scratch, offset = {}, 0
            for s in sorted(op.reads):
                nbytes = self.storage_bytes[s]
                scratch[s] = pool[offset:offset + nbytes].view(self.storage_dtype[s])
                offset += _aligned(nbytes)
            _run(op, scratch)
        del pool
        self._final_state = generator.get_state()

    def value(self, storage: int) -> torch.Tensor:
        """The storage's contents as a plain build leaves them: a flat CPU tensor of its
        dtype (index it with a _Ref's ``view_of``). ``replay()`` must have run."""
        if self._final_state is None:
            raise RuntimeError("Recording.value() before replay()")
        needed = self._closure(storage)
        generator = torch.default_generator
        now = generator.get_state()  # draws since the build (if any) stay as they were
        buffers: dict[int, torch.Tensor] = {}
        try:
            for index, op in enumerate(self.ops):
                if not op.writes & needed:
                    continue
                if op.seeded:
                    generator.set_state(self._states[index])
                _run(op, buffers)
        finally:
            generator.set_state(now)
        return buffers[storage]

    def _closure(self, storage: int) -> set[int]:
        """The storages whose values ``storage``'s value depends on (itself included)."""
        needed, todo = set(), [storage]
        while todo:
            s = todo.pop()
            if s in needed:
                continue
            needed.add(s)
            for op in self.ops:
                if s in op.writes:
                    todo.extend(op.reads - needed)
        return needed


def _named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in [*model.named_parameters(remove_duplicate=False),
                                *model.named_buffers(remove_duplicate=False)]
            if t is not None]


_EMPTY_FACTORIES = {torch.ops.aten.empty, torch.ops.aten.empty_strided,
                    torch.ops.aten.empty_like, torch.ops.aten.new_empty,
                    torch.ops.aten.new_empty_strided, torch.ops.aten.empty_permuted}


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def _run(op: _Op, buffers: dict[int, torch.Tensor]) -> None:
    """Run one logged operation on the CPU, meta tensors replaced by views of
    ``buffers`` (flat, one per storage); new storages it makes are added there."""
    def real(value):
        if isinstance(value, _Ref):
            return value.view_of(buffers[value.storage])
        if isinstance(value, torch.device) and value.type == "meta":
            return _CPU
        return value

    args, kwargs = tree_map(real, op.args), tree_map(real, op.kwargs)
    out = op.func(*args, **kwargs)
    outputs, _ = tree_flatten(out)
    for i, ref in op.fresh:
        tensor = outputs[i]
        flat = torch.empty(0, dtype=ref.dtype)
        flat.set_(tensor.untyped_storage(), 0, (tensor.untyped_storage().nbytes()
                                                // ref.dtype.itemsize,), (1,))
        buffers[ref.storage] = flat


def _written_args(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an operation writes in place (its schema's mutable arguments)."""
    out: list[torch.Tensor] = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        out.extend(v for v in values if isinstance(v, torch.Tensor))
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if torch.Tag.nondeterministic_seeded in func.tags and kwargs.get("generator") is None \
                and _draws_on_cpu(func, tensors, kwargs):
            raise NotReplayable(f"{func.overloadpacket.__name__} draws on a real CPU tensor "
                                f"during the build{caller()}")
        out = func(*args, **kwargs)
        tensors += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if any(t.device == _META for t in tensors):
            self.recording._log(func, args, kwargs, out)
        return out


def _draws_on_cpu(func, tensors: list[torch.Tensor], kwargs: dict) -> bool:
    """A random operation on the default CPU generator: it moves the stream a plain build
    shares with the meta tensors' draws, at another point of it."""
    if tensors:
        return all(t.device == _CPU for t in tensors)
    device = kwargs.get("device")  # a factory (randperm, rand): its device
    return device is not None and torch.device(device) == _CPU


class _Constants(TorchFunctionMode):
    """``torch.tensor(0)`` and kin make their meta tensor below the dispatcher, so the
    recorder never sees the value: make them on the CPU, then move them to the meta
    device where the recorder logs the copy (with the value as a constant)."""

    _MAKERS = (torch.tensor, torch.as_tensor, torch.asarray)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.tensor and args and isinstance(args[0], (list, tuple)) \
                and not args[0] and "device" not in kwargs:
            # Hugging Face's probe for a device context (transformers'
            # get_torch_context_manager_or_global_device): on "meta" its post_init skips
            # the weight initialisation a plain build runs. Answering "cpu" lets it run,
            # on the meta tensors, where the recorder logs it.
            return func(*args, **{**kwargs, "device": _CPU})
        if func in self._MAKERS and torch.device(kwargs.get("device") or _META) == _META:
            return func(*args, **{**kwargs, "device": _CPU}).to(_META)
        return func(*args, **kwargs)


def record(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, Recording]:
    """Run ``build`` on the meta device, logging what it does, then walk its random
    operations (``Recording.replay``). Raises NotReplayable for a build that could not be
    replayed exactly (module docstring); the generator is then where it was."""
    recording = Recording()
    generator = torch.default_generator
    start = generator.get_state()
    try:
        with torch.device(_META), _Constants(), _Recorder(recording), redirected(recording):
            model = build()
        if not torch.equal(generator.get_state(), start):
            raise NotReplayable("the default random generator moved during the build (a "
                                "draw on a CPU tensor or a reseed that ddl cannot see)")
        real = next(((n, t) for n, t in _named_tensors(model) if not t.is_meta), None)
        if real is not None:  # to_empty would drop its values
            raise NotReplayable(f"{real[0]} is a real {real[1].device.type} tensor made during "
                                "the build, not on the meta device (torch.from_numpy, a "
                                "device= argument, a loaded file?)")
        unwritten = recording.unwritten(model)
        if unwritten:
            raise NotReplayable(f"{unwritten[0]} keeps the values of torch.empty: nothing in "
                                "the build wrote it (an initialiser that skips meta tensors?)"
                                + (f"; {len(unwritten) - 1} more" if len(unwritten) > 1
                                   else ""))
    except BaseException:
        generator.set_state(start)
        raise
    recording.replay()
    return model, recording
