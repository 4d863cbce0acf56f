"""Per-token cross-entropy for T5's logits, and the trainer's metrics without a second pass.

:func:`token_losses` is what the workload's loss and its per-sample metrics are built from.
:class:`RecentTokenLosses` keeps, for the logits a training loss was just computed from,
that loss's per-token values: the trainer asks for ``sample_metrics`` on those very logits
after the step, and the cross-entropy over [batch, length, vocabulary] costs as much as the
rest of ddl's step extras together (xsum tiny on CPU: ~2 of ~4 ms a step of ddl's own host
time; more with T5's 32k vocabulary on a GPU). The logits are held by weak reference, so
none outlive the trainer's use of them; other logits (evaluation, a pipeline's schedule) are
not found and are computed afresh, the same way.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy ``[batch, length]`` (0 where ignored) and the label mask."""
    mask = labels != -100
    ce = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100,
                         reduction="none")
    return ce, mask


class RecentTokenLosses:
    """The per-token losses of the latest training micro-batches, by (logits, labels)."""

    KEPT = 64  # more micro-batches than one optimizer step accumulates in practice

    def __init__(self) -> None:
        self._entries: list[tuple[weakref.ref, weakref.ref, torch.Tensor, torch.Tensor]] = []

    def remember(self, logits: torch.Tensor, labels: torch.Tensor, ce: torch.Tensor,
                 mask: torch.Tensor) -> None:
        if not torch.is_grad_enabled():  # evaluation: no training metrics will follow
            return
        self._entries = [entry for entry in self._entries[-self.KEPT + 1:]
                         if entry[0]() is not None]
        self._entries.append((weakref.ref(logits), weakref.ref(labels), ce.detach(), mask))

    def take(self, logits: torch.Tensor, labels: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The remembered (per-token losses, mask) of exactly these tensors, once; else None."""
        for entry in reversed(self._entries):
            logits_ref, labels_ref, ce, mask = entry
            if logits_ref() is logits and labels_ref() is labels:
                self._entries.remove(entry)
                return ce, mask
        return None
