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


def total_norm(parameters: Iterable[torch.nn.Parameter], sum_over: Sequence = (),
               weights: dict[int, float] | None = None) -> torch.Tensor:
    """The 2-norm of all gradients of ``parameters`` (see the module's docstring)."""
    import torch.distributed as dist

    squares = None
    for param in parameters:
        if param.grad is None:
            continue
        part = _norm(param.grad).square() * (weights or {}).get(id(param), 1.0)
        squares = part if squares is None else squares + part
    if squares is None:
        squares = torch.zeros((), dtype=torch.float32)
    for group in sum_over:
        dist.all_reduce(squares, group=group)
    return squares.sqrt()


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float,
                   sum_over: Sequence = (), weights: dict[int, float] | None = None
                   ) -> torch.Tensor:
    """Scale the gradients so their global norm is at most ``max_norm``; returns the norm
    before clipping."""
    params = [p for p in parameters if p.grad is not None]
    norm = total_norm(params, sum_over, weights)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for param in params:
        param.grad.mul_(coefficient.to(param.grad.device))
    return norm
