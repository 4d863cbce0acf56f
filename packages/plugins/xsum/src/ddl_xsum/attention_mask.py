"""The padding mask as T5 wants it, without a host-device synchronisation: shared by the
whole model's forward (ddl_xsum.workload) and the pipeline stages' (ddl_xsum.pipeline)."""

from __future__ import annotations

import torch


def prepared_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The padding mask as the 4-D boolean mask (batch, 1, 1, keys) transformers would build
    from it, made here without reading its values. Given the 2-D mask, transformers first
    asks whether any token is padded (``mask.all()`` on the device: a host-device sync in
    every encoder and cross-attention mask, two per step) to skip the mask; a prepared 4-D
    mask is used as it is. Same logits, bit for bit (it broadcasts over the queries as the
    built one repeats over them); ``ddl train --count-syncs`` found the syncs."""
    return attention_mask.bool()[:, None, None, :]
