"""Optimizer settings that are faster on a GPU and change nothing else, for workloads to
pass to torch's optimizers: ``torch.optim.AdamW(params, lr=lr, **fused_on_gpu(params))``.

torch's fused Adam, AdamW and SGD update every parameter in one kernel per group instead of
several per parameter (the default "foreach" path on a GPU launches a kernel per operation
over lists; the plain loop, one per parameter and operation). The arithmetic is the same
update; only the order of float operations inside it differs, so results agree within the
precision's rounding (tests/unit/test_fast_optim.py compares the paths on a CPU, where
torch has both). ddl asks for it on CUDA only, so CPU runs keep their exact numbers.
"""

from __future__ import annotations

from typing import Any


def fused_on_gpu(params: Any) -> dict[str, bool]:
    """``{"fused": True}`` when every parameter in ``params`` (tensors, or parameter groups
    as dicts with ``"params"``) is a floating-point tensor on a CUDA device; else ``{}``
    (torch's default). A generator would be consumed: pass a list."""
    tensors = []
    for item in params:
        tensors.extend(item["params"] if isinstance(item, dict) else [item])
    if not tensors:
        return {}
    ok = all(t.device.type == "cuda" and t.is_floating_point() for t in tensors)
    return {"fused": True} if ok else {}
