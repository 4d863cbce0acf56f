"""Activation checkpointing (``--activation-checkpointing``): keep fewer activations for
the backward pass and recompute them there instead.

Applied to the workload's block units - the sub-modules it names for FSDP
(``Workload.fsdp_units``: transformer blocks, ResNet stages) - before any strategy wraps
the model, so it holds under every strategy and composes with tensor parallel, FSDP and
pipeline stages the way torchtitan orders them (checkpointing inside, sharding outside):

- ``full``: a unit keeps only its inputs; its whole forward runs again in the backward.
- ``selective``: inside a unit, the outputs of the expensive ops (matrix products,
  convolutions, attention) are kept and only the cheap ones (activations, norms, dropout
  masks, additions) are recomputed (torch's selective checkpointing policy).

The unit's ``forward`` is replaced on the instance rather than the module wrapped, so
parameter names, state dicts, tensor-parallel plans and pipeline cuts see the model as
built. Non-reentrant checkpointing (``use_reentrant=False``): the variant torch recommends,
and the one FSDP2 and DTensor support. Random ops (dropout) replay the same mask: torch
checkpoints restore the RNG state for the recomputation.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

MODES = ("none", "full", "selective")

# Ops whose outputs selective checkpointing keeps: the ones that cost FLOPs to recompute.
_aten = torch.ops.aten
_SAVE = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.convolution.default, _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
}
_sdpa_cpu = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
if _sdpa_cpu is not None:
    _SAVE.add(_sdpa_cpu.default)


# Set by ddl.worker.observe.activation_memory while it measures: the outputs selective
# checkpointing keeps are held by torch's checkpoint machinery, which saved-tensor hooks
# outside it never see, so the policy reports their sizes here, per checkpointed call:
# ``keep(call, nbytes)``. The meter counts them until ``call`` is freed: it sits in the
# storage where torch keeps that call's outputs, which lives until the call's backward is
# done (or its graph is dropped without one).
kept_meter = None


class _Call:
    """One checkpointed call of a unit: the owner of its kept outputs."""

    __slots__ = ("__weakref__",)


def _policy(ctx, op, *args, call: _Call | None = None, **kwargs) -> CheckpointPolicy:
    if op not in _SAVE:
        return CheckpointPolicy.PREFER_RECOMPUTE
    meter = kept_meter
    if meter is not None and call is not None and not ctx.is_recompute:
        meter.keep(call, _output_bytes(op, args, kwargs))
    return CheckpointPolicy.MUST_SAVE


def _output_bytes(op, args, kwargs) -> int:
    """The bytes ``op`` will return, from its shapes alone (run on the meta device, or on
    the fake tensors ddl plan's 16-bit probe runs on: ddl.planning.autocast_probe)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_flatten, tree_map

    def meta(x):
        if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor):
            return x
        x = getattr(x, "_local_tensor", x)  # a DTensor's shard: what this rank holds
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")

    try:
        out = op(*tree_map(meta, args), **tree_map(meta, kwargs))
    except Exception:  # noqa: BLE001 - an op without a meta kernel: not counted
        return 0
    return sum(o.numel() * o.element_size() for o in tree_flatten(out)[0]
               if isinstance(o, torch.Tensor))


def _selective_contexts():
    call = _Call()
    forward, recompute = create_selective_checkpoint_contexts(
        functools.partial(_policy, call=call))
    # torch (2.14) keeps the call's kept outputs in this dict, shared by both contexts and
    # held by the call's checkpoint frame until its backward: ``call`` lives as long (a key
    # no op looks up; tests/unit/test_activation_memory.py fails if torch changes that)
    forward.storage[_Call] = {0: call}
    return forward, recompute


def apply(units: list[nn.Module], mode: str) -> int:
    """Checkpoint each unit's forward (``mode`` full or selective); returns how many."""
    if mode == "none":
        return 0
    # SAC keeps its outputs outside saved-tensor hooks (torch's current behaviour, asked for
    # explicitly): ddl's activation meter counts them through the policy instead
    extra = ({"context_fn": _selective_contexts, "respect_saved_tensors_hooks": False}
             if mode == "selective" else {})
    for unit in units:
        original = unit.forward

        @functools.wraps(original)
        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():  # evaluation: nothing is kept anyway
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **extra, **kwargs)

        unit.forward = forward
    return len(units)
