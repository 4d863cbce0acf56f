"""Gradient clipping by the global 2-norm, for every strategy (``--clip-grad-norm``).

torch's ``clip_grad_norm_`` sees only this rank's tensors. Under ddl's strategies a rank
holds replicated gradients (DDP), shards of DTensors (FSDP, tensor parallel) or a subset of
the model (a pipeline stage). The norm here is the norm of the whole model's gradient,
the same on every rank, as one process would compute it:

- a DTensor gradient contributes its full norm (``full_tensor`` of its local norm, which
  torch reduces over the DTensor's mesh);
- plain gradients are replicas (identical on the ranks that hold them) and count once;
- ``sum_over`` process groups add up what different ranks hold (pipeline stages), with
  ``weights`` < 1 for copies of one parameter on several of them (tied embeddings).

Then every gradient is scaled by max_norm / (norm + 1e-6) when that is below 1, the rule
of ``torch.nn.utils.clip_grad_norm_``. Imports torch: worker side only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def _norm(grad: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(grad, 2, dtype=torch.float32)
    if hasattr(norm, "full_tensor"):  # a DTensor: the norm over all its shards
        norm = norm.full_tensor()
    return norm


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return hasattr(tensor, "full_tensor")


def total_norm(parameters: Iterable[torch.nn.Parameter], sum_over: Sequence = (),
               weights: dict[int, float] | None = None) -> torch.Tensor:
    """The 2-norm of all gradients of ``parameters`` (see the module's docstring). Plain
    gradients go through torch's multi-tensor norm in one call per weight (a handful of
    kernels whatever the parameter count: per-parameter calls cost a kernel launch each on
    a GPU); DTensor gradients one by one, each reduced over its own mesh."""
    import torch.distributed as dist

    squares = None
    plain: dict[float, list[torch.Tensor]] = {}
    for param in parameters:
        if param.grad is None:
            continue
        weight = (weights or {}).get(id(param), 1.0)
        if not _is_dtensor(param.grad):
            plain.setdefault(weight, []).append(param.grad)
            continue
        part = _norm(param.grad).square() * weight
        squares = part if squares is None else squares + part
    for weight, grads in plain.items():
        norm = torch.nn.utils.get_total_norm([g.float() for g in grads]
                                             if any(g.dtype != torch.float32 for g in grads)
                                             else grads, 2.0)
        part = norm.square() * weight
        squares = part if squares is None else squares + part.to(squares.device)
    if squares is None:
        squares = torch.zeros((), dtype=torch.float32)
    for group in sum_over:
        dist.all_reduce(squares, group=group)
    return squares.sqrt()


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float,
                   sum_over: Sequence = (), weights: dict[int, float] | None = None
                   ) -> torch.Tensor:
    """Scale the gradients so their global norm is at most ``max_norm``; returns the norm
    before clipping. Plain gradients are scaled by torch's multi-tensor
    ``clip_grads_with_norm_`` (the same coefficient, in a few kernels), DTensor ones each."""
    params = [p for p in parameters if p.grad is not None]
    norm = total_norm(params, sum_over, weights)
    plain = [p for p in params if not _is_dtensor(p.grad)]
    if plain:
        torch.nn.utils.clip_grads_with_norm_(plain, max_norm, norm.to(plain[0].grad.device))
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for param in params:
        if _is_dtensor(param.grad):
            param.grad.mul_(coefficient.to(param.grad.device))
    return norm
