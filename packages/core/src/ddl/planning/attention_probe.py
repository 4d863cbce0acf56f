"""``ddl plan``'s activation probe and ``F.scaled_dot_product_attention``: which attention
kernel the run will use, and so what it keeps for backward.

``scaled_dot_product_attention`` picks its kernel by the tensors' device
(``_fused_sdp_choice_stub``, a C++ dispatch stub, not an op a dispatch mode sees): a CPU
tensor gets the fused flash kernel (it keeps q, k, v, the output and a (b, h, t)
log-sum-exp), a CUDA tensor on a GPU flash or memory-efficient attention (the same, plus
the dropout RNG state), but a *meta* tensor - what ``ddl plan`` probes on - always the math
path, which keeps the (b, h, t, t) attention probabilities and copies of q, k and v, and a
fake CUDA tensor without a GPU the same. Issue 51 found it on the GPT example, a model the
planner had not seen: at pp=2 its first stage was predicted 1.11x the bytes the run kept
(tiny: 149,120 B per micro-batch of 4 against 133,760, all of it the one block's
attention: 4 samples x (4 heads x 16 x 16 probabilities - the 4 x 16 log-sum-exp) x 4 B =
15,360 B), the same bytes with or without selective checkpointing (the attention's
inputs and output are kept either way).

Inside :func:`fused_attention` the probe calls the kernel the run would call:

* ``cpu``: torch's own choice, asked with stand-in CPU tensors of the same shapes that
  hold one row each (``expand``: no memory), so the rules (4-D inputs, no dropout, a
  mask shape it takes, ...) are torch's; flash gives ``_scaled_dot_product_flash_attention_
  for_cpu``, which has a meta kernel. A boolean mask is converted to an additive one of the
  query's dtype first, as torch converts it (the backward keeps it).
* ``cuda`` (and ROCm, planned as CUDA): no GPU may be touched while planning
  (ddl.planning.autocast_probe), so the choice is torch's on an Ampere-or-newer GPU, written
  out: 16-bit inputs without a mask and with a head dimension of at most 256 take flash
  attention (``_scaled_dot_product_flash_attention``); otherwise, fp32 or with a mask,
  memory-efficient attention (``_scaled_dot_product_efficient_attention``, its log-sum-exp
  padded to 32 rows). Not checked on a GPU yet (the GPU kit's ``plan_memory`` records
  predicted against measured).

Everything else - grouped-query attention with unequal heads, nested tensors, a
``torch.nn.functional`` imported under another name - keeps the original call (the math
path: an over-count, a bound).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.nn import functional as F

# torch.nn.attention.SDPBackend values (_fused_sdp_choice's answer)
_FLASH, _EFFICIENT = 1, 2


@contextmanager
def fused_attention(device_type: str):
    """Inside: ``F.scaled_dot_product_attention`` calls the kernel a run on
    ``device_type`` ("cpu" or "cuda") would call, on the probe's meta or fake tensors."""
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        out = None
        if query.device.type in ("meta", device_type) and not enable_gqa:
            try:
                out = _fused(device_type, query, key, value, attn_mask, dropout_p,
                             is_causal, scale)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                out = None  # a case the fused kernels refuse: the original call
        if out is None:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return out

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _fused(device_type, query, key, value, attn_mask, dropout_p, is_causal, scale):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.is_nested:
        return None
    if torch.is_autocast_enabled(device_type):  # scaled_dot_product_attention is on
        # autocast's 16-bit list (CPU and CUDA); the fused ops themselves are not
        dtype = torch.get_autocast_dtype(device_type)
        query, key, value = (t.to(dtype) if t.is_floating_point() else t
                             for t in (query, key, value))
    if device_type == "cpu":
        if _cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) != _FLASH:
            return None
        mask = _additive(attn_mask, query.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale)[0]
    head = query.shape[-1]
    if (query.dtype in (torch.float16, torch.bfloat16) and attn_mask is None
            and head <= 256 and key.shape[-1] == head == value.shape[-1]):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    mask = _additive(attn_mask, query.dtype)
    if mask is not None:
        mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, mask, query.requires_grad or key.requires_grad
        or value.requires_grad, dropout_p, is_causal, scale=scale)[0]


def _additive(mask, dtype):
    """A boolean mask as torch's kernels take it: 0 where attended, -inf elsewhere."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        mask.logical_not(), float("-inf"))


def _cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) -> int:
    """torch's kernel choice for CPU tensors of these shapes, asked with stand-ins that
    take one row of memory each (outside any fake-tensor mode: real CPU tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def stand_in(t):
        if t is None:
            return None
        row = torch.empty(t.shape[-1] if t.dim() else 1, dtype=t.dtype)
        return row.expand(t.shape).requires_grad_(False) if t.dim() else row[0]

    with unset_fake_temporarily():
        q, k, v, m = (stand_in(t) for t in (query, key, value, attn_mask))
        if query.requires_grad:
            q = torch.empty(query.shape[-1], dtype=query.dtype, requires_grad=True
                            ).expand(query.shape)
        return int(torch._fused_sdp_choice(q, k, v, m, dropout_p, is_causal, scale=scale))
