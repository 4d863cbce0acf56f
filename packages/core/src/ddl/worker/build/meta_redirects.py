"""What runs in place of some torch functions while ddl.worker.build.deferred_init records a
meta-device build, so that the recording is exact or refused, never silently different:

- torch.nn.init's initialisers that do nothing to a meta tensor (their code reads
  ``is_meta``: torch 2.14's trunc_normal_ helper, orthogonal_, dirac_, sparse_) are logged
  as one operation each (``Recording.log_call``); replaying it runs the initialiser itself.
- ``torch.manual_seed``, ``torch.seed`` and ``torch.set_rng_state`` refuse the build: a
  reseed inside it would make the meta draws, which happen later, come from another state.

The functions' code objects are swapped, not the module attributes: an alias made by
``from torch.nn.init import trunc_normal_`` or kept in a dict (transformers'
``TORCH_INIT_FUNCTIONS``) is the same function object, so it is redirected too. They are
swapped back when the recording ends. Not thread-safe: a build runs in one thread.
"""

from __future__ import annotations

import traceback
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


class NotReplayable(Exception):
    """The build did something the recording cannot replay exactly."""


TRAMPOLINE = "<ddl.worker.build.meta_redirects trampoline>"


def caller() -> str:
    """`` at file:line`` of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and path != TRAMPOLINE \
                and not path.endswith(("/ddl/worker/build/deferred_init.py",
                                           "/ddl/worker/build/meta_redirects.py")):
            return f" at {path.rsplit('/', 1)[-1]}:{frame.lineno}"
    return ""


def meta_skipping_initialisers() -> list[types.FunctionType]:
    """torch.nn.init's functions that do nothing to a meta tensor: those whose code reads
    ``is_meta`` (torch 2.14: trunc_normal_'s helper, orthogonal_, dirac_, sparse_)."""
    from torch.nn import init

    return [f for f in vars(init).values() if isinstance(f, types.FunctionType)
            and f.__module__ == init.__name__ and "is_meta" in f.__code__.co_names]


SEEDING = (torch.random.manual_seed, torch.random.seed, torch.random.set_rng_state)


@contextmanager
def redirected(recording: Any) -> Iterator[None]:
    """While ``recording`` (a deferred_init.Recording) records: the redirects of the
    module docstring."""
    hook_name = "__ddl_record_hook__"
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []

    def original(function: types.FunctionType, code: types.CodeType) -> types.FunctionType:
        copy = types.FunctionType(code, function.__globals__, function.__name__,
                                  function.__defaults__, function.__closure__)
        copy.__kwdefaults__ = function.__kwdefaults__
        return copy

    handlers: dict[str, Callable] = {}

    def initialiser(run: Callable) -> Callable:
        def handle(*args, **kwargs):
            tensor = args[0] if args else kwargs.get("tensor")
            if not (isinstance(tensor, torch.Tensor) and tensor.is_meta):
                return run(*args, **kwargs)
            if kwargs.get("generator") is not None:
                raise NotReplayable(f"{run.__name__} uses its own random generator"
                                    f"{caller()}")
            before = len(recording.ops)
            run(*args, **kwargs)  # argument checks; on a meta tensor it stops there
            if len(recording.ops) == before:  # it did skip: log the call itself
                recording.log_call(run, args, kwargs, tensor)
            return tensor
        return handle

    def seeding(run: Callable) -> Callable:
        def handle(*args, **kwargs):
            raise NotReplayable(f"torch.{run.__name__} is called during the build"
                                f"{caller()}")
        return handle

    targets = [(f, initialiser) for f in meta_skipping_initialisers()]
    targets += [(f, seeding) for f in SEEDING]
    try:
        for function, wrap in targets:
            if function.__closure__ is not None:
                continue  # a closure's code cannot be swapped for the trampoline's
            name = f"{function.__module__}.{function.__qualname__}"
            handlers[name] = wrap(original(function, function.__code__))
            scope: dict[str, Any] = {}
            source = (f"def trampoline(*args, **kwargs):\n"
                      f"    return {hook_name}[{name!r}](*args, **kwargs)\n")
            exec(compile(source, TRAMPOLINE, "exec"), scope)  # noqa: S102 - fixed text
            function.__globals__[hook_name] = handlers
            swapped.append((function, function.__code__))
            function.__code__ = scope["trampoline"].__code__
        yield
    finally:
        for function, code in swapped:
            function.__code__ = code
            function.__globals__.pop(hook_name, None)
