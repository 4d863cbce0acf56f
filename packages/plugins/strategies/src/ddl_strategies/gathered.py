"""A whole, plain copy of a distributed model on every rank (``Strategy.generation_model``).

Workloads run some loops of their own after training, e.g. ``generate()``, which calls the
encoder directly and so bypasses the root forward through which FSDP2 gathers the root's
own parameters (a tied embedding), and which cannot run on pipeline stages spread over
ranks. The strategies that distribute parameters gather them here into a fresh model from
the workload's ``build_model()``; the copy is replicated, so ranks may then feed it
different inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from ddl.contract.workload import Workload


def plain_copy(workload: Workload, state: dict[str, torch.Tensor], device: torch.device, *,
               strict: bool = True) -> nn.Module:
    """``workload.build_model()`` holding ``state`` (the full weights), in eval mode on
    ``device``. ``strict=False`` where the state may name a tied weight once only."""
    with torch.random.fork_rng(devices=[]):  # building initialises weights: keep the RNG
        plain = workload.build_model()
    plain.load_state_dict(state, strict=strict)
    return plain.to(device).eval()


def gathered_copy(workload: Workload, model: nn.Module, device: torch.device) -> nn.Module:
    """The plain copy of a model whose parameters are DTensor shards (FSDP2, FSDP2 x TP);
    a collective: every rank receives the full weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # get_model_state_dict names tied copies (T5's embedding and output projection) once
    return plain_copy(workload, state, device, strict=False)
